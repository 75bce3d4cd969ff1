#!/bin/sh
# potluck's GPU check (tools/gpu_check.py; arguments pass through, e.g. --quick, --json
# PATH, --cpu). It runs with the repository's .venv where there is one; elsewhere (a
# lent GPU machine) with python3 and src/ on the path, after installing any wheels in
# .whl/ (blake3, which such a machine may lack) into a temporary folder.
set -e
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then
    exec .venv/bin/python tools/gpu_check.py "$@"
fi
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/potluck-site \
        .whl/*.whl
    PYTHONPATH="/tmp/potluck-site${PYTHONPATH:+:$PYTHONPATH}"
fi
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 exec python3 tools/gpu_check.py "$@"
