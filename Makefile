# Set-up and everyday commands. `make test` and `make demo` work on a fresh machine: they create .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
# Where the CPU build of torch comes from when no local CPU wheel is found (PyPI's default torch is a CUDA build).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
export HF_HUB_OFFLINE ?= 1
# Threads of `make demo` and `make bench`; the environment's OMP_NUM_THREADS wins (`make test` keeps 1 per worker).
OMP_NUM_THREADS ?= 2
# `make test-min`: the lowest transformers version setup.cfg declares, in a second venv, on the test files that
# cover what changed between it and the newest (gradient checkpointing, output capture, config checks).
VENV_MIN ?= .venv-min
TRANSFORMERS_MIN ?= 5.17.0
MIN_TESTS ?= tests/test_output_capture.py tests/test_family_contract.py tests/test_config_validation.py \
    tests/test_settings_obeyed.py
# Extra requirements of `make venv`, e.g. a pinned transformers for $(VENV_MIN).
PIN ?=
# `make lint` and `make format`: ruff alone in its own small venv (its rules: pyproject.toml), so CI checks the
# code in seconds, before it installs torch for the tests.
VENV_LINT ?= .venv-lint
RUFF_VERSION ?= 0.17.6
RUFF := $(VENV_LINT)/bin/ruff
export TOKENIZERS_PARALLELISM ?= false

.PHONY: venv test test-min lint format demo bench clean

venv: $(VENV)/.installed

# Idempotent: re-runs only when the package metadata changes. An existing torch (e.g. a CUDA build) is kept.
$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if $(PY) -c "import torch" 2>/dev/null; then \
		echo "keeping installed torch $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(PY) -m pip install "torch==$(TORCH_VERSION)"; \
	else \
		( $(PY) -m pip install --no-deps --no-index "torch==$(TORCH_VERSION)+cpu" 2>/dev/null \
		  && $(PY) -m pip install "torch==$(TORCH_VERSION)+cpu" ) \
		|| $(PY) -m pip install "torch==$(TORCH_VERSION)" --index-url $(TORCH_CPU_INDEX); \
	fi
	$(PY) -m pip install -e ".[test]" $(PIN)
	touch $@

test: venv
	OMP_NUM_THREADS=1 $(PY) -m pytest -n 2 -q tests

test-min:
	$(MAKE) venv VENV=$(VENV_MIN) PIN="transformers==$(TRANSFORMERS_MIN)"
	$(VENV_MIN)/bin/python -c "import transformers as t; assert t.__version__ == '$(TRANSFORMERS_MIN)', t.__version__"
	OMP_NUM_THREADS=1 $(VENV_MIN)/bin/python -m pytest -n 2 -q $(MIN_TESTS)

$(RUFF):
	test -x $(VENV_LINT)/bin/python || $(PYTHON) -m venv $(VENV_LINT)
	$(VENV_LINT)/bin/python -m pip install -q "ruff==$(RUFF_VERSION)"

lint: $(RUFF)
	$(RUFF) check .
	$(RUFF) format --check .

format: $(RUFF)
	$(RUFF) check --fix .
	$(RUFF) format .

demo: venv
	OMP_NUM_THREADS=$(OMP_NUM_THREADS) $(VENV)/bin/encoderlab demo

bench: venv
	OMP_NUM_THREADS=$(OMP_NUM_THREADS) $(PY) bench/run_all.py

clean:
	rm -rf $(VENV) $(VENV_MIN) $(VENV_LINT) build *.egg-info
