#!/usr/bin/env bash
# Set up the environment, then run rkv's main job: the default quality-versus-reliability
# sweep (rkv/eval/sweep/default.toml: the three default tiers with accelerated faults x bits
# {16,8,4,2} x three protections; fault campaigns through the real read path, SmolLM2-135M
# quality with its KV through rkv, and storage cost). A few minutes on 2 cores; resumable
# (results in sweep-results/default/). It prints where the report and figures are and a
# short summary. Extra arguments go to `rkv sweep` (see --help; docs/sweeps.md). The single
# fault-injection campaign of earlier versions is `.venv/bin/rkv campaign`.
set -euo pipefail
cd "$(dirname "$0")/.."
RKV_SKIP_VLLM=1 bash scripts/setup-env.sh     # (the main job needs no vLLM: .venv-vllm is for the connector)
exec .venv/bin/rkv sweep default "$@"
