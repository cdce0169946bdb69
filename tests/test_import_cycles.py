"""No import circle among the project's modules.

Every import statement of every project module counts, the ones inside functions too: a lazy import only hides
a circle until the function runs, and moving the import to the top would then fail at start-up.  An import of
`a.b` is an edge to the module `a.b` alone: Python runs the package `a`'s `__init__` first, but a package whose
`__init__` imports its own submodules (model/, parallel/) is offering them as its interface, which is no circle.
`from a import b` is an edge to the submodule `a.b` where it exists, else to `a`.
"""
from __future__ import annotations

import ast

from tests.source_tree import module_name, parsed, python_files


def statements(body: list[ast.stmt]):
    """Every statement in `body` and in the blocks nested in it (functions, classes, if/try/with/for, match):
    imports are statements, so the expressions are never walked, which keeps the scan of the tree quick."""
    for node in body:
        yield node
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            for inner in getattr(node, block, ()):
                yield from statements(inner.body if isinstance(inner, (ast.excepthandler, ast.match_case))
                                      else [inner])


def imported_modules(tree: ast.Module, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The project modules that the module `name` imports anywhere in its body."""
    found = set()
    for node in statements(tree.body):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from its own package (or one above)
                package = name.split(".")[:len(name.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = node.module
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names}
    return found & known - {name}


def import_graph() -> dict[str, set[str]]:
    paths = python_files()
    known = {module_name(path) for path in paths}
    return {module_name(path): imported_modules(parsed(path), module_name(path), path.name == "__init__.py", known)
            for path in paths}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iteratively)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            step = next(successors, None)
            if step is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                on_stack.add(step)
                work.append((step, iter(sorted(graph[step]))))
            elif step in on_stack:
                low[node] = min(low[node], index[step])
    return found


def test_cycles_finds_a_circle_and_only_that():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_imports_read_every_form():
    tree = ast.parse("import data.corpus\nfrom data import local_files\nfrom . import token_files\n"
                     "def later():\n    from model.gpt import GPT\n")
    known = {"data", "data.corpus", "data.local_files", "data.token_files", "model.gpt", "data.loader"}
    assert imported_modules(tree, "data.loader", False, known) == {"data.corpus", "data.local_files", "data.token_files",
                                                                   "model.gpt"}


def test_no_import_circle():
    graph = import_graph()
    assert len(graph) > 100 and "data.corpus" in graph["data.token_files"]  # the walk found the project
    assert cycles(graph) == [], "modules that import each other (directly or around a circle); break the " \
                                "circle with a module both can import"


# The one-way rule of the layout, folder by folder: an import from one top-level folder (or script) to another goes
# down this ranking, never sideways or up.  model/ is the network and imports only runtime/; decode/ turns a model
# into tokens; data/ knows a run folder (storage/) so as never to read one as text; the tools at the top only load
# artifacts.
LAYER = {"runtime": 0, "model": 1, "storage": 2, "parallel": 2, "data": 3, "decode": 4, "training": 5,
         "train": 6, "sample": 6, "prune": 6, "quantize": 6, "serve": 6, "bench": 7, "tests": 8}


def folder_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importing folder, imported folder) for every import that crosses a top-level folder."""
    top = lambda module: module.split(".")[0]
    return {(top(a), top(b)) for a, imported in graph.items() for b in imported if top(a) != top(b)}


def test_imports_between_folders_only_go_down():
    crossings = folder_imports(import_graph())
    assert {folder for pair in crossings for folder in pair} <= set(LAYER), "a new top-level folder: rank it in LAYER"
    upward = sorted((a, b) for a, b in crossings if LAYER[b] >= LAYER[a])
    assert upward == [], "imports that go up or sideways between folders (see LAYER); move the shared code down"
    assert {b for a, b in crossings if a == "model"} <= {"runtime"}, "model/ is the network: it imports only runtime/"


def test_a_folder_import_up_is_found():
    graph = {"model.gpt": {"data.tokenizer"}, "data.tokenizer": {"model.config"}, "model.config": set()}
    crossings = folder_imports(graph)
    assert crossings == {("model", "data"), ("data", "model")}
    assert [pair for pair in crossings if LAYER[pair[1]] >= LAYER[pair[0]]] == [("model", "data")]


def test_training_reaches_storage_only_through_its_checkpoint_package():
    """A checkpoint has one home in training/ (training/checkpoint/: what is saved, when, and the resume); the rest of
    training/ hands it the state and never touches a run folder's files, which are storage/'s."""
    graph = import_graph()
    elsewhere = sorted(module for module, imported in graph.items()
                       if module.startswith("training.") and not module.startswith("training.checkpoint")
                       and any(b.split(".")[0] == "storage" for b in imported))
    assert elsewhere == [], "training/ modules that import storage/ outside training/checkpoint/"
