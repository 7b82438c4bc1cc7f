"""Quality-versus-reliability sweeps: a grid of cells (tier or fault preset, its parameters,
a BER multiplier, bits, code, layout, placement, seed), each a pure function of its config
computing reliability (a fault campaign), quality (SmolLM2-135M with its KV through rkv) and
cost (bytes per token, put and get throughput); results appended to JSON Lines keyed by the
cell's hash, so a sweep resumes where it stopped. See docs/sweeps.md.
"""

from rkv.eval.sweep.spec import Sweep, cell_key, load_sweep

__all__ = ["Sweep", "cell_key", "load_sweep"]
