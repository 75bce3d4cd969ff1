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

# Two pytest workers: most multi-process tests wait more than they compute (on a
# heartbeat, a timeout, a peer's step), so two of them share 2 cores well. worksteal:
# an idle worker takes queued tests from the other, so neither ends with a long queue.
# Tests marked serial judge measured speeds (the balancer's shares, the status page's
# slowest rank); a test beside them would stall their fast ranks, so they run alone.
test: $(STAMP) lint
	$(PY) -m pytest -q -n 2 --dist worksteal -m "not serial"
	$(PY) -m pytest -q -m serial

# The edit-run loop: the pure and in-process tests (tests/unit), about a minute.
test-fast: $(STAMP)
	$(PY) -m pytest -q tests/unit

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
