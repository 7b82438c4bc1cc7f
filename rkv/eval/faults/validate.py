"""The validation matrix: campaigns against the analytic model where the model could be wrong.

Each cell is a campaign through the real engine under a fault model chosen so that the
model's share of *lost* (DUE) blocks among the faulty ones sits between about 0.03 and 0.95,
at a mechanism the model computes in its own way: a code at its capability limit, the
record's framing (header vote, preludes), erasures from lost sectors and poisoned lines,
lane faults whose stride aliases with interleaving, shard columns. The campaign's count of
lost blocks is compared with :func:`rkv.reliability.analytic.predict` (``p_due / p_error``,
conditioned on a fault) by an exact two-sided binomial test (:mod:`rkv.eval.faults.validate_power`)
at a Bonferroni level that gives the whole matrix a 1 % false alarm rate; where the model's
share is an estimate from sampled fault patterns, its standard error widens the null. Every
cell is sized in advance (trials x blocks) for at least :data:`SIZE_POWER` power against the
model being wrong by 2x either way on the rarer outcome, and a cell that ends below
:data:`MIN_POWER`, or whose count cannot spread (``n p (1 - p) < 5``), is reported as not
informative and never counted as agreement. A campaign counts outcomes by decoding real
records, the model by binomial tails and class-by-class pattern judgement: two independent
estimates.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rkv.eval.faults.campaign import CampaignConfig, run_campaign
from rkv.eval.faults.validate_power import (
    MAX_N,
    BinomialTest,
    bonferroni,
    required_n,
    spread,
)

#: The false-alarm rate of a whole matrix run (split over its cells by Bonferroni).
FAMILY_LEVEL = 0.01
#: A cell below this power against a 2x error (either way) is not informative.
MIN_POWER = 0.8
#: Cells are sized for this power against a 2x error: above :data:`MIN_POWER` because
#: blocks are cheap here (the matrix then also sees smaller errors, ``detects``), and so that
#: the test that a deliberately wrong model is rejected misses by chance once in 100 runs.
SIZE_POWER = 0.99
#: ``n p (1 - p)`` below this: the count can only confirm a near-certain outcome.
MIN_SPREAD = 5.0
#: Extra trials for direct sampling, whose number of faulty blocks is itself random.
DIRECT_MARGIN = 1.1

#: Block shapes (tokens, KV heads, head dim; fp16 K and V): 2, 4, 16, 32, 64 and 192 KiB.
KIB2, KIB4, KIB16, KIB32, KIB64 = (8, 1, 64), (16, 1, 64), (64, 1, 64), (128, 1, 64), \
    (128, 2, 64)
SMOLLM2 = (256, 3, 64)

_OFF = {"fit_transient": 0.0, "fit_permanent": 0.0}
#: DRAM's word and row faults alone (SC12 rates): conditioned on a fault, the full presets
#: are nearly all bank-sized events that lose any block, so these variants are where
#: poisoned lines, reported as erasures, meet the codes. ``cxl`` adds its link errors.
_SMALL_MODES = {"single-word": {"fit_transient": 1.4, "fit_permanent": 0.3},
                "single-row": {"fit_transient": 0.2, "fit_permanent": 8.2},
                "single-bank": _OFF, "multi-bank": _OFF, "multi-rank": _OFF}
VARIANTS: dict[str, dict[str, Any]] = {
    "dram-ddr5 words+rows": {"preset": "dram-ddr5", "modes": _SMALL_MODES},
    "cxl words+rows": {"preset": "cxl", "controller_fit": 0.0,
                       "media": {"preset": "dram-ddr5", "modes": _SMALL_MODES}},
}


def lane_fault(stride: int, count: int, bits: int = 1) -> dict[str, Any]:
    """DDR4 with one fault mode: a stuck DQ of one device over ``count`` bus words
    ``stride`` bytes apart (``bits`` wrong bits in each), no system ECC, so the host sees the
    flips and the record's code must handle them (the SC12 column-fault rates)."""
    modes: dict[str, dict[str, Any]] = {m: _OFF for m in (
        "single-bit", "single-word", "single-row", "single-bank", "multi-bank", "multi-rank")}
    modes["single-column"] = {"fit_transient": 1.4, "fit_permanent": 5.6,
                              "span_bytes": stride * (count - 1) + 8, "stride_bytes": stride,
                              "bits_per_word": bits}
    return {"preset": "dram-ddr4", "system_ecc": "none", "modes": modes}


#: Latent sector errors that cluster within a record (the preset's 10 MB neighbourhood
#: shrunk to 128 KiB, four extra sectors on average): several lost sectors in one record.
NVME_CLUSTERED = {"preset": "nvme-tlc", "cluster_bytes": 131072, "cluster_p": 0.8}

#: Worn past the device ECC's cliff: about four of a 64 KiB record's sectors lost in a year.
NVME_WORN = {"preset": "nvme-tlc", "pe_cycles": 10000}


@dataclass(frozen=True)
class CellSpec:
    """One cell: what runs (fault model, protection, residency, block, sampling) and what
    part of the model it checks (``targets``)."""

    name: str
    targets: str
    fault_model: str | dict[str, Any]
    protection: str
    block: tuple[int, int, int] = KIB4
    hours: float = 24.0
    sampling: str = "conditional"
    ber_multiplier: float = 1.0
    blocks: int = 20            # per trial
    label: str = ""             # the fault model as the tables show it

    @property
    def model_label(self) -> str:
        if self.label:
            return self.label
        m = self.fault_model
        if isinstance(m, str):
            return m
        if m.get("model") == "raw-ber":
            return f"raw-ber {m['ber']:g}"
        return str(m.get("preset", "custom"))

    def config(self, trials: int, *, workers: int = 1, seed: int | None = None
               ) -> CampaignConfig:
        t, h, d = self.block
        return CampaignConfig(tier="nvme", fault_model=self.fault_model,
                              protection=self.protection, hours=self.hours, trials=trials,
                              blocks=self.blocks, seed=self.seed if seed is None else seed,
                              workers=workers, sampling=self.sampling, chunk_tokens=t,
                              kv_heads=h, head_dim=d, ber_multiplier=self.ber_multiplier)

    @property
    def seed(self) -> int:
        """A seed of the cell's own (its name's CRC), so that adding a cell reseeds no other."""
        return zlib.crc32(self.name.encode())

    @property
    def data_bytes(self) -> int:
        t, h, d = self.block
        return 4 * t * h * d


def _raw(ber: float) -> dict[str, Any]:
    return {"model": "raw-ber", "ber": ber}


CELLS: tuple[CellSpec, ...] = (
    CellSpec("rs-limit", "RS at its capability: > t = 8 wrong bytes in a codeword",
             _raw(2e-3), "rs(255,239)"),
    CellSpec("bch-limit", "BCH at its capability: > t = 8 wrong bits in a chunk",
             _raw(1e-3), "bch(m=13,t=8)"),
    CellSpec("framing", "header and prelude vote (three copies, bitwise): the payload "
             "code (t = 32) almost never fails", _raw(8e-3), "rs(255,191)", KIB2),
    CellSpec("framing+payload", "framing and payload losses together, about half each",
             _raw(4e-3), "rs(255,223)"),
    CellSpec("shard-column", "shard RS: > m damaged shards and a column with > m/2 errors",
             _raw(3e-4), "shardrs(k=8,m=2)"),
    CellSpec("shard-m4", "shard RS with m = 4: > 4 damaged shards and > 2 errors in a column",
             _raw(2e-3), "shardrs(k=4,m=4)"),
    CellSpec("spares-data", "checksum only, direct sampling: damage that misses the data "
             "(one header copy, the checksum) is recovered", _raw(1e-4), "none", KIB2,
             sampling="direct"),
    CellSpec("lane-interleave8", "lane aliasing: every 64th byte lands in one of 8 "
             "interleaved codewords (plain RS corrects it all)", lane_fault(64, 12),
             "rs(255,239,interleave=8)", KIB16, label="ddr4 lane 12x64 B"),
    CellSpec("lane-interleave16", "lane aliasing with interleave = 16 (every 128th byte)",
             lane_fault(128, 12), "rs(255,239,interleave=16)", KIB16,
             label="ddr4 lane 12x128 B"),
    CellSpec("lane-bch", "a lane of 2-bit errors against BCH's bit capability (chunk "
             "boundaries split it)", lane_fault(64, 6, 2), "bch(m=13,t=8)", KIB16,
             label="ddr4 lane 6x64 B x2 bits"),
    CellSpec("poisoned-lines", "DRAM lines poisoned by SEC-DED, decoded as erasures "
             "(2e + f <= 16 per codeword)", VARIANTS["dram-ddr5 words+rows"],
             "rs(255,239,interleave=8)", KIB16, label="dram-ddr5 words+rows"),
    CellSpec("cxl-link", "CXL link errors (corrected) against rare media faults: 1 hour",
             VARIANTS["cxl words+rows"], "rs(255,239,interleave=8)", KIB16, hours=1.0,
             label="cxl words+rows"),
    CellSpec("cxl-30d", "CXL link errors and media faults over 30 days",
             VARIANTS["cxl words+rows"], "rs(255,239,interleave=8)", KIB16, hours=720.0,
             label="cxl words+rows"),
    CellSpec("sector-parity", "a lost 4 KiB sector (erasures) survives RS only on parity "
             "and framing", "nvme-tlc", "rs(255,239)", SMOLLM2, blocks=10),
    CellSpec("sectors-spread", "several lost sectors against shard RS m = 2 with the framing "
             "spread over sectors (any two survive)", NVME_CLUSTERED, "shardrs(k=16,m=2)",
             KIB64, blocks=10, label="nvme-tlc clustered LSE"),
    CellSpec("sectors-cliff", "past the device ECC's cliff (10,000 P/E, a year): lost "
             "sectors by the binomial count per record, direct sampling", NVME_WORN,
             "shardrs(k=16,m=2)", KIB64, hours=8760.0, sampling="direct", blocks=10,
             label="nvme-tlc 10k P/E"),
    CellSpec("sectors-small-shards", "a lost sector over several 2 KiB shards (columns "
             "get <= 2 erasures) and clusters of them", NVME_CLUSTERED, "shardrs(k=16,m=2)",
             KIB32, blocks=10, label="nvme-tlc clustered LSE"),
)
#: Cells outside the model's stated approximations, kept out of the default matrix because
#: the matrix rejects them (a slow test checks that it still does): accelerated 2e9 times,
#: both latent-sector-error classes of ``nvme-tlc`` (a record's own errors with their
#: neighbours, and neighbours of an error nearby) fire in most records, and ``predict``
#: judges each class alone (combinations of events of different classes are second order in
#: the rate and ignored, :mod:`rkv.reliability.analytic`), so three sectors lost between them
#: are missed: the model says 0.24 of the faulty blocks are lost, campaigns see about 0.46.
BEYOND: tuple[CellSpec, ...] = (
    CellSpec("lse-accelerated", "two classes' lost sectors in one record (cross-class "
             "combinations, ignored by the model)", "nvme-tlc", "shardrs(k=16,m=2)", SMOLLM2,
             ber_multiplier=2e9, blocks=10, label="nvme-tlc x 2e9"),
)
#: The quick subset (seconds; the default tests run it).
QUICK = ("rs-limit", "framing", "shard-column", "lane-interleave8")


def cells(quick: bool = False) -> list[CellSpec]:
    """The cells of the full matrix, or of the quick subset."""
    return [c for c in CELLS if c.name in QUICK] if quick else list(CELLS)


@dataclass(frozen=True)
class Plan:
    """A cell sized before it runs: the model's share, its test and the trials it needs."""

    spec: CellSpec
    test: BinomialTest
    p_error: float
    n_needed: int
    trials: int

    @property
    def expected_n(self) -> float:
        blocks = self.trials * self.spec.blocks
        return blocks * (self.p_error if self.spec.sampling == "direct" else 1.0)


def plan_cell(spec: CellSpec, level: float, power: float = SIZE_POWER,
              trials: int | None = None) -> Plan:
    """Predict the cell's share and size it: the smallest trial count whose faulty blocks
    give ``power`` against both 2x errors at ``level`` (or ``trials`` as given)."""
    from rkv.reliability.analytic import predict

    cfg = spec.config(1)
    p = predict(cfg.protection_pipeline(), cfg.data_bytes, cfg.model(), cfg.hours)
    share, se = _share(p)
    test = BinomialTest(share, se, level)
    n = required_n(test, power)
    if trials is None:
        direct = spec.sampling == "direct"
        per_trial = spec.blocks * (p.p_error if direct else 1.0)
        trials = max(1, math.ceil(n * (DIRECT_MARGIN if direct else 1.0) / per_trial))
        if not direct and n < MAX_N:
            for _ in range(50):     # the power of a discrete test zig-zags with n
                if min(test.powers(trials * spec.blocks)) >= power:
                    break
                trials += 1
    return Plan(spec, test, p.p_error, n, trials)


def _share(p: Any) -> tuple[float, float]:
    """The model's share of lost blocks among faulty ones, and its standard error."""
    if p.p_error <= 0:
        return 0.0, 0.0
    return min(1.0, p.p_due / p.p_error), p.p_due_se / p.p_error


@dataclass(frozen=True)
class Cell:
    """One cell's campaign and its comparison with the model."""

    name: str
    targets: str
    model: str
    protection: str
    hours: float
    data_bytes: int
    sampling: str
    trials: int
    blocks: int            # faulty blocks (n)
    due: int               # lost among them (k)
    recovered: int         # corrected or masked
    sdc: int
    p_due: float           # the model's share of lost blocks among faulty ones
    p_due_se: float        # its standard error (sampled pattern judgement; 0: exact)
    rarer: str             # "lost" or "recovered": the outcome the 2x errors are about
    level: float           # the cell's false-alarm budget (Bonferroni)
    p_value: float
    power_2x: float        # P(reject) if the rarer outcome were twice as frequent
    power_half: float      # ... half as frequent
    detects: float         # the smallest error ratio either way seen with MIN_POWER
    informative: bool
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rejects(self) -> bool:
        return self.p_value <= BinomialTest(self.p_due, self.p_due_se, self.level).binom_level

    @property
    def agrees(self) -> bool | None:
        """True / False for an informative cell; None (no evidence either way) otherwise."""
        return (not self.rejects) if self.informative else None

    @property
    def ok(self) -> bool:
        """No informative disagreement and no silent corruption (rkv's end-to-end checksum
        makes any SDC a bug, informative cell or not)."""
        return self.sdc == 0 and self.agrees is not False


@dataclass(frozen=True)
class Evaluation:
    """A count tested against a model share: the p-value, the power the cell had, and
    whether it counts (enough power against both 2x errors, a count that can spread)."""

    p_value: float
    power_2x: float
    power_half: float
    detects: float
    informative: bool


def evaluate(test: BinomialTest, due: int, n: int, min_power: float = MIN_POWER) -> Evaluation:
    """``due`` lost blocks of ``n`` faulty ones tested against ``test``."""
    if n == 0:
        return Evaluation(1.0, 0.0, 0.0, math.inf, False)
    p2, ph = test.powers(n)
    informative = spread(n, test.p) >= MIN_SPREAD and min(p2, ph) >= min_power
    return Evaluation(test.pvalue(due, n), p2, ph, test.detectable(n, min_power),
                      informative)


def run_cell(plan: Plan, *, workers: int = 1, min_power: float = MIN_POWER) -> Cell:
    """Run one planned cell and test its count of lost blocks."""
    spec = plan.spec
    s = run_campaign(spec.config(plan.trials, workers=workers))
    share, se = _share(s.prediction)
    test = replace(plan.test, p=share, se=se)   # (the same prediction, recomputed)
    n = s.blocks - s.counts["clean"]
    due = s.counts["due"]
    e = evaluate(test, due, n, min_power)
    return Cell(spec.name, spec.targets, spec.model_label, spec.protection, spec.hours,
                spec.data_bytes, s.sampling, plan.trials, n, due,
                s.counts["corrected"] + s.counts["masked"], s.counts["sdc"], share, se,
                "lost" if share <= 0.5 else "recovered", test.level, e.p_value, e.power_2x,
                e.power_half, e.detects, e.informative, s.seconds,
                {"degraded": s.counts["degraded"], "n_needed": plan.n_needed})


def run_matrix(quick: bool = False, *, trials: int | None = None, workers: int = 1,
               level: float = FAMILY_LEVEL, power: float | None = None,
               progress: Callable[[int, int, Cell], None] | None = None,
               specs: list[CellSpec] | None = None) -> list[Cell]:
    """Plan and run every cell (the quick subset with ``quick``; ``specs`` to choose);
    ``trials`` overrides the sizing (power is then reported at what that gives)."""
    todo = specs if specs is not None else cells(quick)
    alpha = bonferroni(level, len(todo))
    target = power if power is not None else SIZE_POWER
    out = []
    for i, spec in enumerate(todo):
        cell = run_cell(plan_cell(spec, alpha, target, trials), workers=workers)
        out.append(cell)
        if progress is not None:
            progress(i + 1, len(todo), cell)
    return out


def verdict(cells: list[Cell]) -> str:
    """One line: informative cells that agree, those that do not, and the rest."""
    inf = [c for c in cells if c.informative]
    agree = sum(1 for c in inf if c.agrees)
    level = sum(c.level for c in cells)
    line = (f"{agree} of {len(inf)} informative cells agree with the model (exact two-sided "
            f"binomial test, family-wise level {level:.2g}, Bonferroni)")
    if len(inf) < len(cells):
        line += f"; {len(cells) - len(inf)} not informative (not counted)"
    sdc = sum(c.sdc for c in cells)
    if sdc:
        line += f"; {sdc} silently corrupted block(s)"
    return line


def _status(c: Cell) -> str:
    if c.sdc:
        return "SDC"
    return {True: "agrees", False: "REJECTS", None: "not informative"}[c.agrees]


def table_rows(cells: list[Cell]) -> list[dict[str, Any]]:
    return [{**asdict(c), "verdict": _status(c),
             "model_share": f"{c.p_due:.3g}" + (f" ± {c.p_due_se:.1g}" if c.p_due_se else ""),
             "block": f"{c.data_bytes // 1024} KiB"} for c in cells]


def markdown(cells: list[Cell], fmt: str = "markdown") -> str:
    """The cells as a table through :mod:`rkv.ui` (``markdown`` by default: the form
    docs/reliability.md shows; ``text`` for a terminal)."""
    from rkv.ui import Column, render

    cols = [Column("name", "cell"), Column("model", "fault model"), Column("protection"),
            Column("block", align="right"), Column("blocks", "faulty", "right"),
            Column("due", "lost", "right"), Column("model_share", "model", "right"),
            Column("p_value", "p-value", "right", ".2g"),
            Column("power_2x", "power 2x", "right", ".2f"),
            Column("power_half", "power 0.5x", "right", ".2f"),
            Column("detects", "detects", "right", _ratio), Column("verdict")]
    return render(table_rows(cells), cols, fmt=fmt).rstrip("\n")


def _ratio(r: float) -> str:
    return "-" if math.isinf(r) else f"{r:.2f}x"


def describe(specs: list[CellSpec] | None = None, fmt: str = "markdown") -> str:
    """What each cell runs and targets, as a table."""
    from rkv.ui import Column, render

    rows = [{"name": s.name, "targets": s.targets, "model": s.model_label,
             "protection": s.protection, "hours": s.hours,
             "block": f"{s.data_bytes // 1024} KiB", "sampling": s.sampling,
             "quick": "yes" if s.name in QUICK else ""}
            for s in (specs if specs is not None else list(CELLS))]
    cols = [Column("name", "cell"), Column("targets"), Column("model", "fault model"),
            Column("protection"), Column("hours", align="right", fmt="g"),
            Column("block", align="right"), Column("sampling"), Column("quick")]
    return render(rows, cols, fmt=fmt).rstrip("\n")


def to_json(cells: list[Cell]) -> list[dict[str, Any]]:
    """Every cell as plain JSON values (``detects`` is null where no error ratio is seen)."""
    return [{**asdict(c), "detects": None if math.isinf(c.detects) else c.detects,
             "rejects": c.rejects, "agrees": c.agrees, "ok": c.ok} for c in cells]


def z_score(count: int, n: int, p: float) -> float:
    """Two-sided z of ``count`` successes in ``n`` against probability ``p`` (0 when the
    difference is within one count of a degenerate expectation). Not the matrix's test any
    more (that is exact, :mod:`rkv.eval.faults.validate_power`); kept for quick checks elsewhere."""
    var = n * p * (1.0 - p)
    diff = count - n * p
    if var < 1.0:
        return 0.0 if abs(diff) <= 1.0 else math.copysign(math.inf, diff)
    return diff / math.sqrt(var)
