#!/usr/bin/env bash
# One entry point for a fresh machine with Python 3.11+ and pip:
#   ./run.sh demo   example data -> convert (DirectRunner) -> verify -> load -> JAX steps
#   ./run.sh test   the test suite
#   ./run.sh bench  benchmarks; writes bench/README.md
set -euo pipefail
cd "$(dirname "$0")"
VENV="${VENV:-.venv}"
PY="${PYTHON:-python3}"

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev]"
}

cmd="${1:-}"
shift || true
case "$cmd" in
  demo)  setup; exec "$VENV/bin/python" examples/demo.py "$@" ;;
  test)  setup; exec "$VENV/bin/python" -m pytest tests "$@" ;;
  bench) setup; exec "$VENV/bin/python" bench/run_all.py "$@" ;;
  *) echo "usage: ./run.sh demo|test|bench [args]" >&2; exit 2 ;;
esac
