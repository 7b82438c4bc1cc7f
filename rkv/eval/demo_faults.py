"""``rkv demo``'s second half: a fault injected and caught.

The same prompt's KV is stored twice on the CXL tier's configuration: by rkv (header,
Reed-Solomon code, end-to-end checksum) and by raw storage (the bare values, as peers keep
them). The same bursts of flipped bits are then written into both stores' records through
the fault-injection tier wrapper (:class:`rkv.tiers.faulty.FaultyTier`, via
:class:`rkv.eval.faults.harness.Harness`), and both are read back through their real read paths:
rkv corrects the small burst and reports the large one (its chunk is recomputed), while raw
storage returns wrong values without a sign.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from rkv.eval.faults.harness import LOST, Harness
from rkv.format.model import ModelSpec
from rkv.store.config import default_tiers

__all__ = ["BURSTS", "FaultDemo", "fault_demo", "fault_rows"]

log = logging.getLogger(__name__)

#: (chunk, layer, burst length in bytes): a burst the tier's code corrects and one it cannot.
BURSTS = ((0, 3, 4), (1, 7, 64))


@dataclass
class FaultDemo:
    """What each store returned for each burst."""

    tier: str
    ecc: str
    tokens: int
    chunk_tokens: int
    rows: list[dict[str, Any]]
    rkv_tokens: int              # tokens rkv returned verified (the rest are recomputed)
    rkv_exact: bool              # every value rkv returned equals what was stored
    raw_wrong: int               # values raw storage returned wrong
    raw_max_error: float         # their largest absolute error (finite values)
    raw_nonfinite: int           # values raw storage returned as inf or NaN


def _errors(got: np.ndarray, want: np.ndarray) -> tuple[int, float, int]:
    """(wrong values, max abs error among finite ones, non-finite values)."""
    g, w = got.astype(np.float32), want.astype(np.float32)
    finite = np.isfinite(g)
    diff = np.abs(np.where(finite, g, 0.0) - w)
    wrong = int(np.count_nonzero((diff != 0) | ~finite))
    return wrong, float(diff.max()) if diff.size else 0.0, int(np.count_nonzero(~finite))


def fault_demo(spec: ModelSpec, kv: np.ndarray, tokens: np.ndarray, *, tier: str = "cxl",
               chunk_tokens: int = 256) -> FaultDemo:
    """Store ``kv`` for ``tokens`` with rkv and raw on ``tier``'s configuration, flip the
    bits of each burst of :data:`BURSTS` (a third of the way into the block's record) in
    both, read back, and compare with ``kv``."""
    base = next(t for t in default_tiers() if t.name == tier)
    root = Path(tempfile.mkdtemp(prefix="rkv-demo-faults-"))
    out: dict[bool, Any] = {}
    try:
        for raw in (False, True):
            cfg = replace(base, path=str(root / f"{raw}-tier"), capacity_bytes=1 << 30)
            with Harness(root / ("raw" if raw else "rkv"), cfg, chunk_tokens=chunk_tokens,
                         raw=raw) as h:
                h.put(tokens, kv, spec)
                keys = h.keys(tokens, spec)
                for chunk, layer, nbytes in BURSTS:
                    key = keys[chunk][layer]
                    size = h.record_bytes(key)
                    start = size // 3
                    h.inject(key, _burst(size, start, nbytes))
                    log.info("demo: %s: flipped every bit of bytes %d-%d of chunk %d layer "
                             "%d's %d-byte record", "raw" if raw else "rkv", start,
                             start + nbytes - 1, chunk, layer, size)
                out[raw] = h.read(tokens, spec)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mine, theirs = out[False], out[True]
    rows = []
    for chunk, layer, nbytes in BURSTS:
        status = mine.statuses[chunk * spec.n_layers + layer] if (
            chunk * spec.n_layers + layer < len(mine.statuses)) else "missing"
        lo, hi = chunk * chunk_tokens, (chunk + 1) * chunk_tokens
        if status == "corrected":
            got = mine.kv[layer, :, lo:hi]
            exact = bool(np.array_equal(got, kv[layer, :, lo:hi]))
            said = (f"corrected ({mine.corrected} symbols), values "
                    f"{'exact' if exact else 'WRONG'}")
        elif status in LOST:
            said = (f"detected ({status}): tokens {lo}-{tokens.size - 1} recomputed, "
                    f"0-{mine.n_tokens - 1} verified")
        else:
            said = status
        wrong, err, nonfinite = _errors(theirs.kv[layer, :, lo:hi], kv[layer, :, lo:hi])
        raw_said = (f"silently wrong: {wrong} values, max abs error {err:.3g}"
                    + (f", {nonfinite} inf/NaN" if nonfinite else "") if wrong
                    else "no value changed")
        rows.append({"fault": f"{nbytes}-byte burst, chunk {chunk} layer {layer}",
                     "rkv": said, "raw storage": raw_said})
    n = mine.n_tokens
    wrong, err, nonfinite = _errors(theirs.kv, kv[:, :, :theirs.n_tokens])
    return FaultDemo(tier, base.ecc, int(tokens.size), chunk_tokens, rows, n,
                     bool(np.array_equal(mine.kv, kv[:, :, :n])), wrong, err, nonfinite)


def _burst(size: int, start: int, nbytes: int) -> Any:
    """Every bit of ``nbytes`` bytes from ``start`` flipped (a column or link burst)."""
    from faultmodels import ErrorPattern

    return ErrorPattern(size, flips=np.arange(8 * start, 8 * (start + nbytes), dtype=np.int64))


def fault_rows(d: FaultDemo) -> tuple[str, list[dict[str, Any]], str]:
    """(heading, table rows, closing verdict) for printing."""
    head = (f"faults: a {d.tokens}-token prompt stored by rkv on the {d.tier} tier "
            f"({d.ecc}) and by raw storage; the same bursts of flipped bits written into "
            "both stores' records, then read back:")
    recompute = d.tokens - d.rkv_tokens
    verdict = (f"rkv: {'0' if d.rkv_exact else 'SOME'} silently wrong values, "
               f"{recompute} tokens to recompute; raw storage: {d.raw_wrong} silently wrong "
               f"values (max abs error {d.raw_max_error:.3g}"
               + (f", {d.raw_nonfinite} inf/NaN" if d.raw_nonfinite else "")
               + "), no error reported")
    return head, d.rows, verdict
