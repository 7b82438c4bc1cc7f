"""The NAND inputs that rest on little, over their documented ranges
(docs/faultmodels/nvme.md, "Inputs that rest on little"): the wear exponent ``rber_pe_exp``
(1.0 .. 2.6) and the latent-sector clustering ``cluster_p`` (0 .. 0.75) and
``cluster_bytes`` (1 .. 100 MB). The model takes the endpoints, RBER and the device ECC's
losses grow with the exponent past the wear scale and not at all before it, and clustering
adds exactly the documented share of extra lost sectors."""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

import fm_helpers  # noqa: F401  (puts the repository root first on sys.path)
import numpy as np
import pytest

import faultmodels as fm

ALPHA = (1.0, 2.6)
CLUSTER_P = (0.0, 0.75)
CLUSTER_BYTES = (1_000_000, 100_000_000)
BLOCK = 196608


def nand(**over: Any) -> fm.NandModel:
    m = fm.get_model({"preset": "nvme-tlc", **over})
    assert isinstance(m, fm.NandModel)
    return m


@pytest.mark.parametrize("over", [{"rber_pe_exp": a} for a in ALPHA]
                         + [{"cluster_p": q} for q in CLUSTER_P]
                         + [{"cluster_bytes": b} for b in CLUSTER_BYTES])
def test_documented_endpoints_are_accepted(over: dict[str, Any]) -> None:
    m = nand(**over)
    for k, v in over.items():
        assert getattr(m, k) == v
    assert m.p_any_error(BLOCK, 24.0) > 0.0


@pytest.mark.parametrize("over", [{"rber_pe_exp": -0.5}, {"cluster_p": 1.0},
                                  {"cluster_bytes": 1000}])
def test_outside_what_the_model_means_is_refused(over: dict[str, Any]) -> None:
    # A negative exponent would make wear heal the flash; cluster_p = 1 is an endless
    # cluster; a neighbourhood smaller than a sector has no neighbours.
    with pytest.raises(fm.FaultModelError):
        nand(**over)


def test_wear_exponent_matters_only_past_the_wear_scale() -> None:
    hours = 1600.0
    fresh = {nand(pe_cycles=0, rber_pe_exp=a).rber(hours) for a in (*ALPHA, 1.92)}
    assert len(fresh) == 1            # (1 + 0 / P0)^alpha = 1 for every alpha
    for pe in (3000, 10000):
        rber = [nand(pe_cycles=pe, rber_pe_exp=a).rber(hours) for a in (1.0, 1.25, 1.92, 2.6)]
        sec = [nand(pe_cycles=pe, rber_pe_exp=a).p_sector_fail(hours)
               for a in (1.0, 1.25, 1.92, 2.6)]
        assert all(x < y for x, y in pairwise(rber)), rber
        assert all(x <= y for x, y in pairwise(sec)), sec
    # The preset's own points: 730x from fresh to 3,000 P/E at 1.92; linear growth gives 31x.
    ratio = nand(pe_cycles=3000).rber(24.0) / nand(pe_cycles=0).rber(24.0)
    assert ratio == pytest.approx(31.0 ** 1.92, rel=1e-9)
    lin = nand(pe_cycles=3000, rber_pe_exp=1.0).rber(24.0) / nand(pe_cycles=0).rber(24.0)
    assert lin == pytest.approx(31.0, rel=1e-9)


def test_worn_loss_rate_grows_with_the_exponent() -> None:
    # At 10,000 P/E after 1,600 h (the schedule's refresh age there) the device ECC's lost
    # sectors dominate a block's faults, so P(any fault), which is P(DUE) under the checksum
    # alone, follows the exponent; at 1.0 it falls back to the field sector errors.
    p = [nand(pe_cycles=10000, rber_pe_exp=a).p_any_error(BLOCK, 1600.0)
         for a in (1.0, 1.25, 1.92, 2.6)]
    assert all(x <= y for x, y in pairwise(p)), p
    assert p[1] < 1e-6 < p[2] < p[3], p   # up to 1.25 the ECC loses nothing that shows
    field = nand(pe_cycles=10000, rber_pe_exp=1.0, device_ecc="none", lse_rate=0.0)
    assert field.rber(1600.0) < 4e-5   # far below the 40-bit BCH's reach (mean 0.35 bits)


def _lse_sectors(m: fm.NandModel, hours: float) -> float:
    """Expected lost sectors in the block from the latent-sector classes."""
    n_s = -(-BLOCK // m.sector_bytes)
    per_sector = 4.0 * BLOCK / n_s       # bits_per_event of one whole sector
    return sum(c.rate.mean * c.rate.bits_per_event / per_sector
               for c in m.event_classes(BLOCK, hours) if "latent sector" in c.rate.label)


@pytest.mark.parametrize("q,b", [(0.25, 1_000_000), (0.5, 10_000_000), (0.75, 100_000_000)])
def test_clustering_adds_q_over_1_minus_q_lost_sectors(q: float, b: int) -> None:
    # Every episode has q / (1 - q) neighbours on average, anywhere within the window; by
    # translation invariance each sector receives them at that rate: the lost sectors of
    # a block are the unclustered ones times 1 + q / (1 - q), whatever the window.
    base = _lse_sectors(nand(cluster_p=0.0), 24.0)
    got = _lse_sectors(nand(cluster_p=q, cluster_bytes=b), 24.0)
    assert got == pytest.approx(base * (1.0 + q / (1.0 - q)), rel=1e-9)


def test_clustering_makes_multi_sector_losses_and_none_without_it() -> None:
    rng = np.random.default_rng(7)

    def multi(m: fm.NandModel, n: int = 1500) -> int:
        cls = next(c for c in m.event_classes(BLOCK, 24.0)
                   if c.rate.label.startswith("latent sector error (+"))
        hits = 0
        for _ in range(n):
            pat = cls.draw_nonzero(rng)
            hits += sum(e[1] for e in pat.erasures) > m.sector_bytes
        return hits

    assert multi(nand(cluster_p=0.0)) == 0       # one primary per episode (two: ~1e-8)
    narrow = multi(nand(cluster_p=0.75, cluster_bytes=1_000_000))
    wide = multi(nand(cluster_p=0.75, cluster_bytes=100_000_000))
    # 1 MB: 244 sectors each side, a 48-sector block catches a neighbour often; 100 MB:
    # 24,414 each side, almost never.
    assert narrow > 100 > wide, (narrow, wide)


def test_unclustered_block_loss_is_half_the_preset_under_no_code() -> None:
    # With the checksum alone any lost sector loses the block: clustering 0.5 doubles the
    # NVMe loss rate (the field rate's primaries plus as many neighbours).
    from rkv.reliability.analytic import predict

    p0 = predict("none", BLOCK, nand(cluster_p=0.0), 24.0).p_due
    p5 = predict("none", BLOCK, nand(), 24.0).p_due
    assert 1.9 < p5 / p0 < 2.0 + 1e-9, (p0, p5)
    assert math.isfinite(p0) and p0 > 0.0
