# Two commands for a new user: `make demo` and `make test`.  Both set up .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TOKENIZER := data/assets/gpt2.tiktoken

.PHONY: setup demo smoke test test-random test-orders mutate fuzz bench clean

setup: $(STAMP) $(TOKENIZER)


# Every command here lets Python keep the bytecode of what it imports (.venv's packages and ours): with
# PYTHONDONTWRITEBYTECODE set, as on these machines, each process the tests and the demo start (servers, torchrun
# ranks, train.py runs: some hundreds) would compile torch's sources again.  Each module is compiled once, by the
# first process that imports it (CPython writes the file whole, under a temporary name, so two that race both
# write the same bytes), and only what is imported: compiling the fresh .venv whole, ahead, compiled several times
# what the tests and the demo ever import (bench/by_hand.md, "make setup without compiling ahead").  The installer
# (runtime/install.py: uv, with pip's sources on this host) compiles nothing either.
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): requirements.txt requirements-test.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PYTHON) -m runtime.install $(PY) -r requirements.txt -r requirements-test.txt
	touch $(STAMP)

$(TOKENIZER): | $(STAMP)
	$(PY) -m data.fetch_tokenizer

# The tour in stages (bench/demo.py): each says what it does and how long it should take, and one whose output is
# complete and valid is skipped, so a stopped demo continues where it stopped (`make clean` starts over).
# `make smoke` runs every stage on the smallest sizes, into out/smoke.
demo: setup
	$(PY) -m bench.demo

smoke: setup
	$(PY) -m bench.demo --sizes smoke

# The linter first (pyproject.toml's rules; well under a second), then the docs site (mkdocs.yml; --strict, so a
# broken link, anchor or include fails; a few seconds; the banner about MkDocs 2 is silenced).  Not --quiet: it
# drops the warnings before --strict counts them, and a broken link passed (tests/test_docs_gate.py).  Then one
# pytest-xdist worker per core, each test file on one worker (module fixtures train once), the files in
# tests/conftest.py's longest-first order.  A plain `pytest` runs serially and needs no xdist (the GPU image lacks
# it).
test: setup
	$(VENV)/bin/ruff check .
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
	$(PY) -m pytest -n auto --dist loadfile --no-loadscope-reorder

# The suite in one seeded random order (pytest-randomly shuffles the files and the tests in each; pyproject.toml keeps
# it off in `make test`), to show no test leans on one that ran before it on its worker.  `make test-orders` runs one
# order per seed in SEEDS and records each (counts, wall time, first files) in bench/results/test_orders.json.
SEED ?= 1
SEEDS ?= 1 2 3
test-random: setup
	$(PY) -m pytest -n auto --dist loadfile --no-loadscope-reorder -p randomly -p no:cacheprovider --randomly-seed $(SEED)

test-orders: setup
	$(PY) -m tests.random_orders --seeds $(SEEDS)

# Mutation testing of the modules that guard input and files (tests/mutation.py, Cosmic Ray): each module's checks
# broken one at a time, its tests run against each; writes bench/results/mutation.json.  Long (an hour or more on
# 2 cores): MUTATE_FLAGS="--changed" mutates only the modules changed against main, "--modules runtime/cli.py" some.
MUTATE_FLAGS ?=
mutate: setup
	$(PY) -m pip install --quiet -r requirements-mutate.txt
	$(PY) -m tests.mutation $(MUTATE_FLAGS)

# The hostile-input suite's long run: tests/test_hostile_*.py with fresh random examples, round after round, for
# FUZZ_MINUTES; writes bench/results/fuzz.json (inputs tried per surface, outcomes, tracebacks, changed sources).
FUZZ_MINUTES ?= 20
fuzz: setup
	$(PY) -m tests.fuzz --minutes $(FUZZ_MINUTES)

# The scorecard evaluates on WikiText-103 validation when the shared copy is here (the hub is not
# reachable offline); otherwise on the built-in corpus, and bench/REPORT.md says so.  NANOGPT=path/to/nanoGPT
# has train_speed time nanoGPT's model and loop beside ours.  On a CUDA machine this is the GPU profile.
WIKITEXT := ../shared/data/wikitext-103-raw
bench: setup
	$(PY) bench/run_all.py --quick --leaderboard-dataset $(if $(wildcard $(WIKITEXT)/wiki.valid.raw),$(WIKITEXT),builtin) \
		$(if $(NANOGPT),--nanogpt $(NANOGPT))

clean:
	rm -rf out .cache .pytest_cache site
