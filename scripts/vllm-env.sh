#!/usr/bin/env bash
# Run a command in .venv-vllm's environment for vLLM on the CPU: the venv's bundled
# OpenMP runtime preloaded (vLLM's CPU kernels need it), offline (no hub downloads).
#   bash scripts/vllm-env.sh .venv-vllm/bin/python benchmarks/bench_vllm.py
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
export LD_PRELOAD="$root/.venv-vllm/lib/libiomp5.so${LD_PRELOAD:+:$LD_PRELOAD}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
exec "$@"
