# Two commands for a new user: `make demo` and `make test`.  Both set up .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TOKENIZER := data/assets/gpt2.tiktoken
DEMO_OUT := out/demo

.PHONY: setup demo test test-random test-orders mutate fuzz bench clean

setup: $(STAMP) $(TOKENIZER)


# pip byte-compiles what it installs one file at a time; compileall does it on every core, which takes a fresh
# .venv about half as long.  (Compiled files are needed up front: with PYTHONDONTWRITEBYTECODE set, as on these
# machines, every test process would otherwise compile torch's sources again.)
$(STAMP): requirements.txt requirements-test.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile "setuptools>=68" -r requirements.txt -r requirements-test.txt
	$(PY) -m compileall -q -j 0 -x "/tests?/" $(VENV)/lib > /dev/null || true  # some files are for newer Pythons
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

$(TOKENIZER): | $(STAMP)
	$(PY) -m data.fetch_tokenizer

demo: setup
	rm -rf $(DEMO_OUT)
	$(PY) train.py --config configs/demo/train.toml --out-dir $(DEMO_OUT)/train
	$(PY) sample.py --checkpoint $(DEMO_OUT)/train --prompt "The module" --num-samples 2 --max-new-tokens 60 --seed 1
	$(PY) prune/iterative.py --config configs/demo/prune.toml --checkpoint $(DEMO_OUT)/train --out-dir $(DEMO_OUT)/prune-row
	$(PY) quantize/dynamic.py --config configs/demo/quantize.toml --checkpoint $(DEMO_OUT)/train --out-dir $(DEMO_OUT)/int8
	$(PY) sample.py --checkpoint $(DEMO_OUT)/int8 --prompt "The module" --num-samples 1 --max-new-tokens 40 --seed 1
	OMP_NUM_THREADS=1 $(PY) -m torch.distributed.run --nproc_per_node=2 train.py --config configs/demo/train-fsdp.toml \
		--out-dir $(DEMO_OUT)/fsdp
	$(PY) bench/leaderboard.py --config configs/demo/scorecard.toml --checkpoint $(DEMO_OUT)/train \
		--out $(DEMO_OUT)/scorecard.json
	$(PY) -m serve.demo --checkpoint $(DEMO_OUT)/train

# The linter first (pyproject.toml's rules; well under a second), then the docs site (mkdocs.yml; --strict, so a
# broken link, anchor or include fails; a few seconds; the banner about MkDocs 2 is silenced), then the project's own
# modules compiled once:
# with PYTHONDONTWRITEBYTECODE set, every process the tests start (servers, torchrun ranks, train.py runs, some
# hundreds) would otherwise compile them again.  Then one pytest-xdist worker per core, each test file on one worker
# (module fixtures train once), the files in tests/conftest.py's longest-first order.  A plain `pytest` runs
# serially and needs no xdist (the GPU image lacks it).
SOURCES := model decode data parallel prune quantize serve storage training runtime bench tests train.py sample.py
test: setup
	$(VENV)/bin/ruff check .
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	$(PY) -m compileall -q -j 0 $(SOURCES) > /dev/null
	$(PY) -m pytest -n auto --dist loadfile --no-loadscope-reorder

# The suite in one seeded random order (pytest-randomly shuffles the files and the tests in each; pyproject.toml keeps
# it off in `make test`), to show no test leans on one that ran before it on its worker.  `make test-orders` runs one
# order per seed in SEEDS and records each (counts, wall time, first files) in bench/results/test_orders.json.
SEED ?= 1
SEEDS ?= 1 2 3
test-random: setup
	$(PY) -m compileall -q -j 0 $(SOURCES) > /dev/null
	$(PY) -m pytest -n auto --dist loadfile --no-loadscope-reorder -p randomly -p no:cacheprovider --randomly-seed $(SEED)

test-orders: setup
	$(PY) -m compileall -q -j 0 $(SOURCES) > /dev/null
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
