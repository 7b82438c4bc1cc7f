"""Run one vLLM job file (rkv.adapters.vllm_run): ``python scripts/vllm_job.py JOB.json``.

A launcher outside the ``rkv`` package on purpose: vLLM spawns its worker by importing
this file again, and a worker that imported ``rkv`` (hence numba and llvmlite) before
vLLM's CPU start-up crashes in vLLM 0.32's kernel-override scan (``vars()`` of llvmlite's
``ffi.lib`` is not a dict). So nothing but the standard library is imported at the top.
"""

import sys

if __name__ == "__main__":
    from rkv.adapters.vllm_run import main

    raise SystemExit(main(sys.argv[1:]))
