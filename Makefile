# Two commands do all the setup on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.neuron-dynamo-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo test lint bench coverage setup

setup: $(STAMP)

# torch==2.13.0 first: it is the CPU build on this machine's disk; any other request downloads a CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test,hf]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/quickstart.py

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=15

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Every benchmark but the architecture sweep, which takes an hour or more: `make coverage` runs it.
bench: $(STAMP)
	for script in benchmarks/*.py; do [ $$script = benchmarks/hf_coverage.py ] && continue; \
		echo "== $$script"; $(PY) $$script || exit 1; done

coverage: $(STAMP)
	$(PY) benchmarks/hf_coverage.py --jobs 2
