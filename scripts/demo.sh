#!/usr/bin/env bash
# Set up the environment, then run rkv's main job on the embedded default store.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
exec .venv/bin/rkv demo "$@"
