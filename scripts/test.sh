#!/usr/bin/env bash
# Set up the environment, then run lint, type checks and the default test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/python -m pytest -q -n 2 "$@"
