#!/usr/bin/env bash
# Set up the environment, then run rkv's main job on the embedded default: a fault-injection
# campaign through the real engine (NVMe tier, its fault model and protection), next to the
# same campaign on raw storage. Extra arguments go to `rkv campaign` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
exec .venv/bin/rkv campaign "$@"
