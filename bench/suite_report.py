"""bench/REPORT.md's section on the test suite itself: how many mutants of each guarding module it kills
(`make mutate`, bench/results/mutation.json) and whether it passes in random orders (`make test-orders`,
bench/results/test_orders.json)."""
from __future__ import annotations

import json
from pathlib import Path

from bench.report_page import Page

HEADING = "## The test suite: mutants killed and random orders (`tests/mutation.py`, `tests/random_orders.py`)\n"


def read(results_dir: Path, name: str) -> dict | None:
    path = results_dir / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def suite_section(page: Page, results_dir: Path) -> None:
    """The section, when the results hold either file (a benchmark run alone holds neither: no section)."""
    mutation, orders = read(results_dir, "mutation"), read(results_dir, "test_orders")
    if mutation is None and orders is None:
        return
    page.add(HEADING)
    if mutation is not None:
        mutation_part(page, mutation)
    if orders is not None:
        orders_part(page, orders)


def mutation_part(page: Page, mutation: dict) -> None:
    runs = mutation["runs"]
    labels = [label for label in ("before", "after") if label in runs] or list(runs)
    modules = list(dict.fromkeys(m for label in labels for m in runs[label]["modules"]))
    page.add(f"`make mutate` ({mutation['tool']}): each module's checks broken one at a time, its tests run against "
             f"each mutant. Score: {mutation['score']}. *before*: the suite before the tests written to kill "
             f"survivors; *after*: with them (only the earlier survivors run again).\n")
    rows = []
    for module in modules:
        row = [f"`{module}`"]
        for label in labels:
            r = runs[label]["modules"].get(module)
            row += ["-"] * 3 if r is None else [
                f"{r['mutants']} ({r['killed'] + r['timed_out']} killed, {r['survived']} survived, "
                f"{len(r['equivalent'])} equivalent)", f"{r['score']:.0%}", f"{r['baseline_s']:.0f} s"]
        rows.append(row)
    page.table(["module", *[f"{label}: {what}" for label in labels for what in ("mutants", "score", "tests")]], rows)
    planted = [p for label in labels for p in runs[label].get("planted", [])]
    if planted:
        page.add("Defects planted by hand (issue 54's round and issue 71's): "
                 + "; ".join(f"{p['name']}: {'killed by ' + p['by'] if p['killed'] else 'NOT caught'}"
                             for p in {p["name"]: p for p in planted}.values()) + ".\n")
    left = [m for m in modules if "after" in runs and m not in runs["after"]["modules"]]
    if left:
        page.add(f"Not run again after the new tests (the run did not reach them): {', '.join(left)}.\n")


def orders_part(page: Page, orders: dict) -> None:
    page.add(f"The whole suite in seeded random orders (`make test-orders`, each run `{orders['command']}`), "
             f"host memory read {orders['host']['memory_read_gb_per_s']} GB/s, matmul "
             f"{orders['host']['matmul_gflop_per_s']} GFLOP/s:\n")
    page.table(["seed", "passed", "failed", "errors", "skipped", "wall", "first files"],
               [[r["seed"], r["counts"]["passed"], r["counts"]["failed"], r["counts"]["errors"], r["counts"]["skipped"],
                 f"{r['wall_s']:.0f} s", ", ".join(Path(f).name for f in r["first_files"][:3])]
                for r in orders["runs"]])
    put_back = [r["state_put_back"] for r in orders["runs"] if r["state_put_back"]]
    page.add(("Every order passed." if orders["all_passed"] else "**Some orders failed**: "
              + "; ".join(f"seed {r['seed']}: {', '.join(r['failures'][:3])}" for r in orders["runs"] if r["failures"]))
             + (f" State put back by tests/conftest.py: {put_back[0]}" if put_back else "") + "\n")
