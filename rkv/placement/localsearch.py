"""Local search for the fast solver (:mod:`rkv.placement.solver`): greedy repair of a choice
that breaks a limit, then single moves and pairs of moves that save cost within the slack.
Each works on the solver's sorted tables (``f``: costs, per-resource use, tiers, bytes,
limits)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


class Tables(Protocol):
    """The solver's sorted tables a local search reads (:class:`rkv.placement.solver._Fast`):
    per option its cost, resource use, tier and bytes; the limits; the best cost so far."""

    rows: I64
    offsets: I64
    cost: F64
    res: F64
    flat_res: F64
    tier: I64
    nbytes: F64
    lim: F64
    best_cost: float

REL_TOL = 1e-9
_PAIR_CANDIDATES = 160
_BATCH_REPAIR = 64              # above this many blocks, repair moves in batches


def limit_ok(usage: F64, limit: F64) -> npt.NDArray[np.bool_]:
    return usage <= limit * (1 + REL_TOL) + 1e-12


def _deltas(f: Tables, choice: I64) -> tuple[F64, F64]:
    cur_c = f.cost[f.rows, choice]
    dc = f.cost - cur_c[:, None]
    dr = f.res - f.res[:, f.rows, choice][:, :, None]
    return dc, dr


def repair(f: Tables, choice: I64) -> I64 | None:
    """Greedy: move blocks to options that cut the violated resources at the least cost per
    unit cut, never pushing another resource over its limit. A block's moves depend only on
    its own choice, so on puts of more than 64 blocks each round ranks every block's best
    move once and takes them in that order while the set of violated resources stays the
    same (then ranks again); smaller puts take one move per round (the best overall)."""
    choice = choice.copy()
    batch = len(f.rows) > _BATCH_REPAIR
    norm = np.maximum(f.lim, 1e-12)[:, None, None]
    for _ in range(4 * len(f.rows) + 8):
        usage = f.res[:, f.rows, choice].sum(axis=1)
        viol = ~limit_ok(usage, f.lim)
        if not viol.any():
            return choice
        dc, dr = _deltas(f, choice)
        gain = -(dr[viol] / norm[viol]).sum(axis=0)
        slack = (f.lim - usage)[:, None, None]
        ok = np.isfinite(dc) & (gain > 0) & ((dr <= slack) | viol[:, None, None]).all(axis=0)
        if not ok.any():
            return None
        ratio = np.where(ok, np.maximum(dc, 0) / np.where(ok, gain, 1) + np.minimum(dc, 0),
                         np.inf)
        best_j = np.argmin(ratio, axis=1)
        best_r = ratio[f.rows, best_j]
        cand = np.argsort(best_r, kind="stable")[:int(np.isfinite(best_r).sum())]
        moves = dr[:, cand, best_j[cand]].T.tolist()
        used = usage.tolist()
        lim = (f.lim * (1 + REL_TOL) + 1e-12).tolist()
        hard = [not v for v in viol.tolist()]
        top = f.lim.tolist()
        for i, d in zip(cand.tolist(), moves, strict=True):
            if any(h and u + x > t for h, u, x, t in zip(hard, used, d, top, strict=True)):
                continue
            choice[i] = best_j[i]
            used = [u + x for u, x in zip(used, d, strict=True)]
            if not batch or any(not h and u <= m
                                for h, u, m in zip(hard, used, lim, strict=True)):
                break          # a violated resource is met: rank again
    return None


def improve(f: Tables, choice: I64, *, pairs: bool) -> I64:
    choice = choice.copy()
    for _ in range(8):
        changed = _one_opt(f, choice)
        if pairs:
            changed = _two_opt(f, choice) or changed
        if not changed:
            break
    return choice


def _one_opt(f: Tables, choice: I64) -> bool:
    """Single moves that save cost within the slack, largest saving first (one per block)."""
    flat = f.offsets + choice
    usage = f.flat_res[:, flat].sum(axis=1)
    slack = f.lim * (1 + REL_TOL) + 1e-12 - usage
    if (slack < 0).any():
        return False
    dc = f.cost - f.cost.ravel()[flat][:, None]
    ok = dc < -1e-12 * (1 + abs(f.best_cost))
    if not ok.any():
        return False
    # A move changes the KL and the bytes of the tier it enters (and of the one it leaves,
    # which only frees room): the checks per resource, without a (resources, n, m) array.
    kl_cur, t_cur, nb_cur = (a.ravel()[flat] for a in (f.res[0], f.tier, f.nbytes))
    room = slack[1:][f.tier]
    enter = np.where(f.tier == t_cur[:, None], f.nbytes - nb_cur[:, None], f.nbytes)
    ok &= (f.res[0] - kl_cur[:, None] <= slack[0]) & (enter <= room)
    if not ok.any():
        return False
    gain = np.where(ok, dc, np.inf)
    best_j = np.argmin(gain, axis=1)
    best_g = gain[f.rows, best_j]
    cand = np.argsort(best_g)[:int(np.isfinite(best_g).sum())]
    j = best_j[cand]
    d = np.zeros((len(slack), len(cand)))
    cols = np.arange(len(cand))
    d[0] = f.res[0][cand, j] - kl_cur[cand]
    d[1 + f.tier[cand, j], cols] += f.nbytes[cand, j]
    d[1 + t_cur[cand], cols] -= nb_cur[cand]
    # Greedy in order of saving: a move is taken if it fits what the ones before left. The
    # prefix that fits is taken at once; past the first that does not, one by one.
    left = slack[:, None] - np.concatenate((np.zeros((len(slack), 1)),
                                            np.cumsum(d, axis=1)[:, :-1]), axis=1)
    fits = (d <= left).all(axis=0)
    stop = len(cand) if fits.all() else int(np.argmin(fits))
    taken = list(range(stop))
    rest = slack - d[:, :stop].sum(axis=1)
    pos = stop
    while pos < len(cand):
        # Past a move that does not fit, the next that does, then the run that fits after it.
        now = (d[:, pos:] <= rest[:, None]).all(axis=0)
        if not now.any():
            break
        a = pos + int(np.argmax(now))
        dd = d[:, a:]
        left = rest[:, None] - np.concatenate((np.zeros((len(rest), 1)),
                                               np.cumsum(dd, axis=1)[:, :-1]), axis=1)
        fits = (dd <= left).all(axis=0)
        run = len(fits) if fits.all() else int(np.argmin(fits))
        taken.extend(range(a, a + run))
        rest = rest - dd[:, :run].sum(axis=1)
        pos = a + run
    choice[cand[taken]] = j[taken]
    return True


def _two_opt(f: Tables, choice: I64) -> bool:
    """One improving pair of moves in two different blocks whose sum fits the slack."""
    usage = f.res[:, f.rows, choice].sum(axis=1)
    slack = f.lim * (1 + REL_TOL) + 1e-12 - usage
    dc, dr = _deltas(f, choice)
    fin = np.isfinite(dc)
    fin[f.rows, choice] = False
    bi, oj = np.nonzero(fin)
    if bi.size == 0:
        return False
    mdc = dc[bi, oj]
    mdr = dr[:, bi, oj]
    if bi.size > 2 * _PAIR_CANDIDATES:
        gains = np.argpartition(mdc, _PAIR_CANDIDATES)[:_PAIR_CANDIDATES]
        frees = (mdr < 0).any(axis=0)
        rel = np.where(frees, mdc, np.inf)
        releases = np.argpartition(rel, _PAIR_CANDIDATES)[:_PAIR_CANDIDATES]
        sel = np.unique(np.concatenate((gains, releases)))
        bi, oj, mdc, mdr = bi[sel], oj[sel], mdc[sel], mdr[:, sel]
    tot = mdc[:, None] + mdc[None, :]
    ok = (tot < -1e-12 * (1 + abs(f.best_cost))) & (bi[:, None] != bi[None, :])
    for k in range(len(slack)):
        if not ok.any():
            return False
        ok &= (mdr[k][:, None] + mdr[k][None, :]) <= slack[k]
    if not ok.any():
        return False
    a, b = np.unravel_index(int(np.argmin(np.where(ok, tot, np.inf))), tot.shape)
    choice[bi[a]] = oj[a]
    choice[bi[b]] = oj[b]
    return True
