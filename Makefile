# Two commands: `make demo` (install + run the demo on the shipped models, offline) and
# `make test` (install + run the whole test suite). Everything goes into .venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# An unpinned `torch` from PyPI is a multi-GB CUDA build; pin the CPU-friendly release. TORCH is
# split into words, so it can carry pip options: TORCH="torch==2.13.0 --index-url URL".
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed
# The suite runs on every core (at most 4 workers: each loads its own models), one test file per
# worker so module fixtures load once; PYTEST_WORKERS= runs it in one process.
PYTEST_WORKERS ?= -n auto --maxprocesses 4 --dist loadfile

.PHONY: setup demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e ".[langchain,llamaindex,bench,serve,test]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/llm-ensembling demo

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest $(PYTEST_WORKERS)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m lab bench --n 20 --out bench-out

clean:
	rm -rf $(VENV) bench-out
