#!/usr/bin/env bash
# Set up the environment, then run rkv's main job: the default quality-versus-reliability
# sweep (rkv/eval/sweep/default.toml: the three default tiers with accelerated faults, and
# a memory that reports none of its faults (raw-ber), x bits {16,8,4,2} x three protections,
# against raw storage (no checksum) and a planned cell; fault campaigns through the real
# read path, SmolLM2-135M (4-bit Q4_1 weights) quality with its KV through rkv or raw
# storage while faults hit it, and storage cost). About 6 minutes on 2 cores; resumable
# (results in sweep-results/default/). It prints where the report and figures are and a
# short summary. Extra arguments go to `rkv sweep` (see --help; docs/sweeps.md). The single
# fault-injection campaign of earlier versions is `.venv/bin/rkv campaign`.
set -euo pipefail
cd "$(dirname "$0")/.."
RKV_SKIP_VLLM=1 bash scripts/setup-env.sh     # (the main job needs no vLLM: .venv-vllm is for the connector)
exec .venv/bin/rkv sweep default "$@"
