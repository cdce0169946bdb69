# Two commands for a new user: `make demo` and `make test`.  Both set up .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TOKENIZER := data/assets/gpt2.tiktoken
DEMO_OUT := out/demo

.PHONY: setup demo test bench clean

setup: $(STAMP) $(TOKENIZER)

$(STAMP): requirements.txt requirements-test.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-test.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

$(TOKENIZER): | $(STAMP)
	$(PY) -m data.fetch_tokenizer

demo: setup
	rm -rf $(DEMO_OUT)
	$(PY) train.py --model tiny --dataset builtin --max-steps 400 --eval-interval 100 --out-dir $(DEMO_OUT)/train
	$(PY) sample.py --checkpoint $(DEMO_OUT)/train --prompt "The module" --num-samples 2 --max-new-tokens 60 --seed 1
	$(PY) -m serve.demo --checkpoint $(DEMO_OUT)/train

test: setup
	$(PY) -m pytest

clean:
	rm -rf out .cache .pytest_cache
