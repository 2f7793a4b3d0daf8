# embedstream — make setup | test | demo | dev-up | dev-down | lint
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The CPU build of torch on this machine's disk; an unpinned torch pulls a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0

.PHONY: setup test test-fast demo dev-up dev-down lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_PIN)"
	$(BIN)/python -m pip install --quiet -e ".[dev]" "$(TORCH_PIN)"
	touch $(STAMP)

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q tests/unit

demo: setup
	$(BIN)/embedstream demo

dev-up: setup
	$(BIN)/embedstream dev up

dev-down: setup
	$(BIN)/embedstream dev down

lint: setup
	$(BIN)/ruff check worker schemas connectors tests

clean:
	-$(BIN)/embedstream dev down 2>/dev/null
	rm -rf $(VENV) .embedstream .pytest_cache
