# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast lint clean

# torch==2.13.0 is installed first and on its own: the local CPU build satisfies the
# range in pyproject.toml, so the project install never pulls a newer CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/potluck demo

lint: $(STAMP)
	$(PY) -m ruff check src tests $(wildcard examples)
	$(PY) -m mypy

test: $(STAMP) lint
	$(PY) -m pytest -q

# The edit-run loop: the pure and in-process tests (tests/unit), about a minute.
test-fast: $(STAMP)
	$(PY) -m pytest -q tests/unit

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
