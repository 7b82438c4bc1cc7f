"""P(DUE) where production targets sit, against first principles written here, and the
importance-sampled campaign against the same values.

    .venv/bin/python benchmarks/bench_framing.py [--json benchmarks/results/framing.json]

**Bit errors** (``raw-ber``, 192 KiB blocks, 1 h). First principles, written in this file and
not taken from :mod:`rkv.eval.faults`: a block is lost when its framing is (three copies of the
header, or of the 8-byte prelude, each with an error and two sharing a wrong bit: a Markov
chain over bit positions, exact) or when some decoding unit holds more than ``t`` errors (RS:
``P(Binomial(255, q) > t)`` per codeword with ``q = 1 - (1 - p)^8``, the last codeword
shortened; BCH: ``P(Binomial(bits, p) > t)`` per 512-byte chunk with its ecc), the regions
being disjoint bytes. ``predict`` and a campaign with ``tilt = "auto"`` (real records through
the engine, 400 blocks) are compared with it; the z-score uses the campaign's own standard
error.

**The NVMe point** (``nvme-tlc``, 24 h, 192 KiB, ``shardrs(k=16,m=2)``): ``predict`` (exact
counts, the default) with its stated standard error, the sampled-draws variant, and the
latent-sector-cluster term checked by plain sampling of the model's own realizations
(400,000 draws of one event, judged where three or more sectors are lost).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

import faultmodels
from rkv.eval.faults.campaign import CampaignConfig, run_campaign
from rkv.reliability.analytic import predict
from rkv.reliability.fatality import judge, layout_for

BLOCK = 196608
SHAPE = {"chunk_tokens": 256, "kv_heads": 3, "head_dim": 64}      # 192 KiB of fp16
POINTS = (("rs(255,239)", 4e-7), ("bch(m=13,t=8)", 5e-7), ("rs(255,223)", 1e-9),
          ("rs(255,251)", 1e-12))


def copies_lost(nbytes: int, p: float) -> float:
    """P(three copies of ``nbytes`` bytes are lost): a Markov chain over the bit positions
    (state: which copies hold an error, whether a position is wrong in two); sums of
    positive terms only, so exact to rounding at any ``p``."""
    q = 1.0 - p
    pats = [(m, p ** bin(m).count("1") * q ** (3 - bin(m).count("1"))) for m in range(8)]
    ok = np.zeros(8)            # no position wrong twice yet, by the set of copies hit
    bad = np.zeros(8)           # some position wrong twice
    ok[0] = 1.0
    for _ in range(8 * nbytes):
        n_ok, n_bad = np.zeros(8), np.zeros(8)
        for m, w in pats:
            idx = np.arange(8) | m
            if bin(m).count("1") >= 2:
                np.add.at(n_bad, idx, (ok + bad) * w)
            else:
                np.add.at(n_ok, idx, ok * w)
                np.add.at(n_bad, idx, bad * w)
        ok, bad = n_ok, n_bad
    return float(bad[7])


def log_binom_tail(n: int, q: float, t: int) -> float:
    """log P(Binomial(n, q) > t)."""
    j = np.arange(t + 1, n + 1, dtype=np.float64)
    terms = np.array([math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(n - x + 1)
                      for x in j]) + j * math.log(q) + (n - j) * math.log1p(-q)
    top = float(terms.max())
    return top + math.log(float(np.exp(terms - top).sum()))


def payload_lost(code: str, p: float) -> float:
    """P(some decoding unit of a 192 KiB payload fails), from the codes' documented layouts
    (docs/ecc.md): RS(255, k) codewords of k data bytes, the last one shortened; BCH(13, t)
    chunks of 512 data bytes with 13 ecc bytes (t = 8)."""
    if code.startswith("rs"):
        k = int(code.split(",")[1].rstrip(")"))
        t = (255 - k) // 2
        q = -math.expm1(8 * math.log1p(-p))
        full, rest = divmod(BLOCK, k)
        units = [(255, full)] + ([(rest + 255 - k, 1)] if rest else [])
    else:
        t, q = 8, p
        units = [(8 * (512 + 13), BLOCK // 512)]
    log_ok = math.fsum(c * math.log1p(-math.exp(log_binom_tail(n, q, t))) for n, c in units)
    return -math.expm1(log_ok)


def lse_by_plain_sampling(draws: int = 400_000) -> dict[str, float]:
    """P(a latent-sector event loses the block | one event) from the model's own
    realizations (judged where three or more sectors are lost: fewer never are, which
    tests/campaign/test_framing_sectors.py checks against the decoder)."""
    m = faultmodels.get_model("nvme-tlc")
    lay = layout_for("shardrs(k=16,m=2)", BLOCK)
    cls = m.event_classes(lay.record, 24.0)[2]
    rng = np.random.default_rng(2026)
    hits = 0.0
    for _ in range(draws):
        pat = cls.realize(1, rng)
        if len(pat.erasures) >= 3:
            hits += judge(lay, pat)[0]
    f = hits / draws
    return {"draws": draws, "fatal": f, "se": math.sqrt(f * (1 - f) / draws),
            "p_fire": -math.expm1(cls.log_p0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--blocks", type=int, default=400)
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    print("| code | BER | first principles (framing + payload) | predict | ratio "
          "| IS estimate (rel. err) | z(IS vs first principles) |")
    print("|---|---|---|---|---|---|---|")
    for code, ber in POINTS:
        model = faultmodels.get_model({"model": "raw-ber", "ber": ber})
        hlen = layout_for(code, BLOCK).hlen
        frame = -math.expm1(math.log1p(-copies_lost(hlen, ber)) + math.log1p(-copies_lost(8, ber)))
        pay = payload_lost(code, ber)
        fp = frame + pay - frame * pay
        got = predict(code, BLOCK, model, 1.0).p_due
        t = time.perf_counter()
        s = run_campaign(CampaignConfig(fault_model={"model": "raw-ber", "ber": ber},
                                        protection=code, hours=1.0, trials=args.blocks // 10,
                                        blocks=10, tilt="auto", seed=3, **SHAPE))
        is_s = time.perf_counter() - t
        due = s.importance["due"] if s.importance else {"estimate": 0.0, "stderr": 0.0}
        est, se = float(due["estimate"]), float(due["stderr"])
        z = (est - fp) / se if se > 0 else math.inf
        rows.append({"code": code, "ber": ber, "hlen": hlen, "framing": frame,
                     "payload": pay, "first_principles": fp, "predict": got,
                     "is_estimate": est, "is_stderr": se, "is_seconds": is_s,
                     "is_blocks": s.blocks})
        print(f"| {code} | {ber:g} | {fp:.4g} ({frame:.3g} + {pay:.3g}) | {got:.4g} | "
              f"{got / fp:.5f} | {est:.4g} ({se / est if est else math.inf:.1%}) | {z:+.1f} |",
              flush=True)
    nvme = faultmodels.get_model("nvme-tlc")
    for exact in (False, True):
        t = time.perf_counter()
        p = predict("shardrs(k=16,m=2)", BLOCK, nvme, 24.0, exact_counts=exact)
        sec = time.perf_counter() - t
        rows.append({"nvme_exact_counts": exact, "p_due": p.p_due, "p_due_se": p.p_due_se,
                     "seconds": sec})
        print(f"nvme-tlc 24 h shardrs(k=16,m=2), exact_counts={exact}: {p.p_due:.4g} "
              f"+- {p.p_due_se:.2g} ({sec:.1f} s)", flush=True)
    t = time.perf_counter()
    lse = lse_by_plain_sampling()
    lse["seconds"] = time.perf_counter() - t
    rows.append({"nvme_lse_plain": lse})
    print(f"latent-sector cluster term by plain sampling: {lse['p_fire'] * lse['fatal']:.3g} "
          f"+- {lse['p_fire'] * lse['se']:.2g} ({lse['draws']} draws, {lse['seconds']:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
