"""A fault-injection campaign on a store written as planned (mixed bits and codes).

:func:`run_planned_campaign` takes an engine whose tier is wrapped in a
:class:`~rkv.tiers.faulty.FaultyTier`, one stored prefix (its records written by the
engine as its placement plan said), and a fault model; for a store whose chunks live in
several tiers (placement's ``place_tiers``), one FaultyTier and one model per tier, each
block drawing from the model of the tier the index says it is in. Every trial restores the clean
records, draws a pattern for every record from the model (seeded; persistent patterns are
applied to the stored record, transient ones to its next read, as
:mod:`rkv.eval.faults.bench` does), reads the prefix back through :meth:`Engine.get` and
classifies every block against the fault-free read: clean, masked, corrected, DUE
(uncorrectable or missing) or SDC (returned without complaint, and wrong). The engine stops
a read at the first chunk with a DUE; the blocks of that chunk are classified, their clean
records restored, and the read repeated for the later chunks, so every block is judged on
its own pattern.

:func:`predicted_totals` sums the per-block predictions (what the planner used: P(DUE),
P(SDC) per block, plus P(error) for the corrected count) and :func:`compare` puts observed
counts against them: a two-sided 95 % interval of the count the prediction implies
(Poisson-binomial: normal with continuity correction when its variance is large, otherwise
the exact Poisson quantiles of its mean) and the exact (Garwood) Poisson interval of the
observed count as a rate per block.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rkv.format.keys import as_token_array, block_key, chunk_keys
from rkv.store.results import CORRECTED, DEGRADED, MISSING, UNCORRECTABLE
from rkv.tiers.faulty import FaultyTier

OUTCOMES = ("clean", "masked", "corrected", "due", "sdc")


@dataclass(frozen=True)
class BlockPrediction:
    """One block's predicted outcome probabilities over the campaign's residency."""

    chunk: int
    layer: int
    p_error: float
    p_due: float
    p_sdc: float


def predicted_totals(blocks: Sequence[BlockPrediction]) -> dict[str, float]:
    """Expected outcomes per trial (one pass over the blocks): sums of the per-block
    probabilities, and the variances of the counts (sum of p (1 - p))."""
    out: dict[str, float] = {"blocks": float(len(blocks))}
    for name, ps in (("due", [b.p_due for b in blocks]), ("sdc", [b.p_sdc for b in blocks]),
                     ("corrected", [max(0.0, b.p_error - b.p_due - b.p_sdc)
                                    for b in blocks]),
                     ("error", [b.p_error for b in blocks])):
        out[name] = math.fsum(ps)
        out[f"{name}_var"] = math.fsum(p * (1 - p) for p in ps)
    return out


def _poisson_cdf(k: int, mu: float) -> float:
    if k < 0:
        return 0.0
    if mu <= 0:
        return 1.0
    terms = [-mu + i * math.log(mu) - math.lgamma(i + 1) for i in range(k + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * math.fsum(math.exp(t - top) for t in terms))


def _solve(f: Any, lo: float, hi: float) -> float:
    """The root of an increasing ``f`` in [lo, hi] by bisection."""
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def poisson_ci(k: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact (Garwood) two-sided interval for the mean of a Poisson count ``k``."""
    hi_end = k + 20.0 * math.sqrt(k + 1.0) + 20.0
    lo = 0.0 if k == 0 else _solve(lambda m: (1 - _poisson_cdf(k - 1, m)) - alpha / 2,
                                   0.0, hi_end)
    hi = _solve(lambda m: alpha / 2 - _poisson_cdf(k, m), 0.0, hi_end)
    return lo, hi


def count_interval(mean: float, var: float, alpha: float = 0.05) -> tuple[int, int]:
    """The two-sided ``1 - alpha`` range of a sum of independent Bernoulli counts with this
    mean and variance: exact Poisson quantiles of ``mean`` (a bound that is slightly wide for
    a Poisson-binomial) when the variance is small, else the normal approximation."""
    if var >= 25:
        z = 1.959963984540054
        half = z * math.sqrt(var)
        return max(0, math.floor(mean - half + 0.5)), math.ceil(mean + half - 0.5)
    lo = 0
    while _poisson_cdf(lo, mean) < alpha / 2:
        lo += 1
    hi = lo
    while _poisson_cdf(hi, mean) < 1 - alpha / 2:
        hi += 1
    return lo, hi


def compare(observed: int, trials: int, mean_per_trial: float, var_per_trial: float,
            blocks_per_trial: int) -> dict[str, Any]:
    """Observed count against the predicted: the predicted count and its 95 % range, the
    observed rate per block with its exact Poisson interval, and whether each lies in the
    other's interval."""
    mean, var = mean_per_trial * trials, var_per_trial * trials
    lo, hi = count_interval(mean, var)
    olo, ohi = poisson_ci(observed)
    n = trials * blocks_per_trial
    return {"observed": observed, "predicted": mean, "predicted_range95": [lo, hi],
            "observed_in_predicted_range": lo <= observed <= hi,
            "rate_observed": observed / n, "rate_observed_ci95": [olo / n, ohi / n],
            "rate_predicted": mean / n,
            "predicted_in_observed_ci": olo <= mean <= ohi}


@dataclass
class CampaignResult:
    trials: int
    blocks: int                        # per trial
    counts: dict[str, int]
    per_block: dict[tuple[int, int], Counter[str]]
    corrected_symbols: int
    reads: int                         # Engine.get calls (more than trials after DUEs)


def run_planned_campaign(engine: Any, tier: FaultyTier | Mapping[str, FaultyTier],
                         tokens: Sequence[int], spec: Any, model: Any, hours: float,
                         trials: int, seed: int = 0, chunk_tokens: int = 256
                         ) -> CampaignResult:
    """Inject faults over ``hours`` into every record of the stored prefix ``tokens``
    (already put through ``engine``, whose tier ``tier`` wraps), ``trials`` times, and
    classify every block (see the module docstring). ``tier`` and ``model`` may be mappings
    by tier name (a mixed-tier store): each block is injected in the tier holding it, with
    that tier's model."""
    toks = as_token_array(list(tokens))
    keys = chunk_keys(toks, spec.fingerprint(), chunk_tokens)
    n_layers = spec.n_layers
    bkeys = {(c, layer): block_key(k, layer) for c, k in enumerate(keys)
             for layer in range(n_layers)}
    tiers = dict(tier) if isinstance(tier, Mapping) else {tier.name: tier}
    models = dict(model) if isinstance(model, Mapping) else {n: model for n in tiers}
    where: dict[tuple[int, int], str] = {}
    with engine.core.index.env.read() as txn:
        for c, k in enumerate(keys):
            meta = engine.core.index.get_chunk(txn, k)
            if meta is None:
                raise KeyError(f"chunk {c} of the prefix is not stored")
            for layer in range(n_layers):
                where[c, layer] = meta.blocks[layer][0]
    missing = sorted(set(where.values()) - set(tiers))
    if missing:
        raise KeyError(f"blocks of the prefix are in tier(s) {missing}, which are not wrapped")
    clean: dict[tuple[int, int], bytes] = {}
    for pos, k in bkeys.items():
        rec = tiers[where[pos]].inner.get(k)
        if rec is None:
            raise KeyError(f"block {pos} of the prefix is not stored in tier {where[pos]}")
        clean[pos] = bytes(rec)

    def restore(positions: Sequence[tuple[int, int]]) -> None:
        for name, t in tiers.items():
            items = [(bkeys[p], np.frombuffer(clean[p], np.uint8)) for p in positions
                     if where[p] == name]
            if items:
                t.put_many(items)

    ref = engine.get(list(tokens), model=spec)
    if ref.n_tokens != len(toks):
        raise RuntimeError("the prefix does not read back clean before injection")
    want = np.array(ref.kv, copy=True)
    # Read into a buffer of the whole prefix: a result is cut at the verified prefix, and
    # the other layers of a chunk with a DUE are classified too.
    buf = np.empty_like(want)
    bounds = [(c * chunk_tokens, min(len(toks), (c + 1) * chunk_tokens))
              for c in range(len(keys))]
    counts: Counter[str] = Counter()
    per_block: dict[tuple[int, int], Counter[str]] = {pos: Counter() for pos in bkeys}
    rng = np.random.default_rng(seed)
    symbols = reads = 0
    for _ in range(trials):
        for t in tiers.values():
            t.rng = np.random.default_rng(rng.integers(1 << 63))
        restore(list(bkeys))
        faulty: dict[tuple[int, int], bool] = {}
        for pos, k in bkeys.items():
            pattern = models[where[pos]].sample(len(clean[pos]), hours, rng)
            faulty[pos] = not pattern.is_empty
            if pattern.is_empty:
                continue
            if pattern.transient:
                tiers[where[pos]].inject_transient(k, pattern)
            else:
                tiers[where[pos]].inject(k, pattern)
        start = 0
        while start < len(keys):
            buf.fill(0)
            got = engine.get(list(tokens), model=spec, out=buf)
            reads += 1
            failed = None
            for st in got.blocks:
                if st.chunk < start:
                    continue
                pos = (st.chunk, st.layer)
                s, e = bounds[st.chunk]
                if st.status in (UNCORRECTABLE, MISSING):
                    outcome = "due"
                    failed = st.chunk
                elif not np.array_equal(buf[st.layer, :, s:e].view(np.uint8),
                                        want[st.layer, :, s:e].view(np.uint8)):
                    outcome = "sdc"
                elif st.status in (CORRECTED, DEGRADED):
                    outcome = "corrected"
                    symbols += st.corrected
                else:
                    outcome = "masked" if faulty[pos] else "clean"
                counts[outcome] += 1
                per_block[pos][outcome] += 1
            if failed is None:
                break
            # Heal every chunk read so far and read again for the chunks after the failure.
            restore([(c, layer) for c in range(failed + 1) for layer in range(n_layers)])
            start = failed + 1
    return CampaignResult(trials, len(bkeys), {o: counts[o] for o in OUTCOMES}, per_block,
                          symbols, reads)
