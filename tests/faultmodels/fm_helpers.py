"""Statistical helpers for the faultmodels tests (a module with a unique name).

Import this module before `faultmodels` in every test module here: pytest puts ``tests/`` on
``sys.path`` (for ``tests/conftest.py``), where the directory ``tests/faultmodels`` would be
found as a namespace package named ``faultmodels`` and shadow the real package when the
repository root itself is not on ``sys.path`` (an editable install resolves it through a
meta-path finder that runs after the path finder). So the root goes on ``sys.path`` first.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
_shadow = sys.modules.get("faultmodels")
if _shadow is not None and getattr(_shadow, "__file__", None) is None:
    del sys.modules["faultmodels"]  # a namespace package picked up from tests/

import faultmodels as fm  # noqa: E402

Z = 5.0  # tolerance in standard deviations for Monte Carlo checks


def binom_within(k: int, n: int, p: float, z: float = Z) -> bool:
    """k successes out of n trials is within z sigma of Binomial(n, p) (plus one count of
    slack for tiny p)."""
    sd = math.sqrt(max(n * p * (1.0 - p), 0.0))
    return abs(k - n * p) <= z * sd + 1.0


def mean_within(xs: Sequence[float] | np.ndarray, expected: float, z: float = Z,
                rel: float = 0.0) -> bool:
    """Sample mean within z standard errors (+ a relative slack) of `expected`."""
    a = np.asarray(xs, dtype=np.float64)
    se = float(a.std(ddof=1)) / math.sqrt(a.size) if a.size > 1 else 0.0
    return abs(float(a.mean()) - expected) <= z * se + rel * abs(expected) + 1e-300


def two_sample_within(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                      z: float = Z) -> bool:
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    se = math.sqrt(x.var(ddof=1) / x.size + y.var(ddof=1) / y.size)
    return abs(float(x.mean()) - float(y.mean())) <= z * se + 1e-12


def chi2_ok(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> bool:
    """Pearson chi-square goodness of fit; cells with small expectation are pooled, and the
    statistic must stay under df + 5*sqrt(2*df) (a loose ~5 sigma bound)."""
    n = counts.sum()
    exp = probs * n
    order = np.arange(counts.size)
    keep = exp >= min_expected
    obs_k, exp_k = list(counts[order[keep]]), list(exp[order[keep]])
    obs_k.append(counts[~keep].sum())
    exp_k.append(exp[~keep].sum())
    o = np.array(obs_k, dtype=float)
    e = np.array(exp_k, dtype=float)
    m = e > 0
    stat = float(np.sum((o[m] - e[m]) ** 2 / e[m]))
    df = max(int(m.sum()) - 1, 1)
    return stat <= df + 5.0 * math.sqrt(2.0 * df)


@dataclass
class MCResult:
    trials: int
    nonempty: int
    lost: int
    transient: int
    wrong_frac: np.ndarray  # expected wrong bits / total bits, per trial
    n_flips: np.ndarray
    erased: np.ndarray
    patterns: list[fm.ErrorPattern]


def run_mc(model: fm.FaultModel, nbytes: int, hours: float, trials: int, seed: int,
           draw: Callable[..., fm.ErrorPattern] | None = None,
           keep: bool = False) -> MCResult:
    rng = np.random.default_rng(seed)
    fn = draw if draw is not None else model.sample
    wrong = np.empty(trials)
    flips = np.empty(trials)
    erased = np.empty(trials)
    nonempty = lost = transient = 0
    kept: list[fm.ErrorPattern] = []
    for t in range(trials):
        p = fn(nbytes, hours, rng)
        nonempty += not p.is_empty
        lost += p.lost
        transient += p.transient and not p.is_empty
        wrong[t] = p.expected_wrong_bits() / (8.0 * nbytes)
        flips[t] = p.n_flips
        erased[t] = p.n_erased_bytes
        if keep:
            kept.append(p)
    return MCResult(trials, nonempty, lost, transient, wrong, flips, erased, kept)


def modes_only(keep: dict[str, tuple[float, float]]) -> dict[str, dict[str, float]]:
    """A dram `modes` table with every mode off except the given (transient, permanent) FITs."""
    out = {}
    for name in fm.MODE_NAMES:
        t, p = keep.get(name, (0.0, 0.0))
        out[name] = {"fit_transient": t, "fit_permanent": p}
    return out
