"""Store-less replay of a request trace through eviction policies: hit ratios and modeled TTFT.

Every request is a prefix chain of blocks. For each block, in order: a hit is reported with
``on_access(hit=True)``; a miss with ``on_access(hit=False, item=...)``, then room is made with
``victims(need, protected)`` (``protected``: the blocks of the current request touched so far;
the answer held to the contract by :func:`policies.base.checked_victims`), each victim reported
with ``on_remove(EVICTED)``, and the block inserted with ``on_insert``. When ``victims`` answers
``None`` the block is not cached. Time (``now``) is the position of the reference in the flat
sequence of all block references, which is what :class:`Belady` needs.

Metrics per (policy, capacity), over the ``get`` requests (``put`` lines of an access log are
replayed as accesses but not counted):

* block hit ratio: hits over block references;
* prefix-token hit ratio: tokens of the blocks before the request's first miss, over all input
  tokens (only those save prefill; a cached block after a miss does not);
* modeled TTFT per request: the hit prefix loaded from one tier (``blocks * (block_bytes /
  bandwidth + latency)``) plus the rest recomputed at ``recompute_tps`` tokens per second; the
  final forward step that produces the first token is not modeled.

Several tiers (demotion, promotion, prefetch) are in :mod:`rkv.eval.replay.tiers`; tables, JSON and
the plot in :mod:`rkv.eval.replay.report`.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from policies.base import (
    AdmissionPolicy,
    EvictionPolicy,
    Item,
    PolicyError,
    Reason,
    checked_victims,
)
from policies.belady import Belady, InfiniteCache, next_use_positions
from rkv.errors import ConfigError, InputError
from rkv.eval.replay.queue import Lookahead, Pins, parse_lookahead
from rkv.format.traces import Request
from rkv.ui.sizes import UNITS, scale

if TYPE_CHECKING:
    from numpy.typing import NDArray

#: Bytes of one 512-token block of SmolLM2-135M's fp16 KV: 30 layers x (K, V) x 3 heads x 64.
SMOLLM2_BLOCK_BYTES = 30 * 2 * 3 * 64 * 2 * 512
#: Prefill tokens per second of SmolLM2-135M on 2 CPU threads (576 tokens in 1.08 s).
DEFAULT_RECOMPUTE_TPS = 530.0
DEFAULT_BANDWIDTH = 20e9       # bytes/s, a DRAM-like tier
DEFAULT_LATENCY = 1e-7         # seconds per block
DEFAULT_CAPACITIES = ("0.01", "0.02", "0.05", "0.1", "0.2")
BELADY = "belady"
INFINITE = "infinite"


@dataclass(frozen=True)
class CostModel:
    """What a block weighs and what a hit or a miss costs."""

    block_bytes: int = SMOLLM2_BLOCK_BYTES
    bandwidth: float = DEFAULT_BANDWIDTH      # bytes per second when loading a hit
    latency: float = DEFAULT_LATENCY          # seconds per loaded block
    recompute_tps: float = DEFAULT_RECOMPUTE_TPS  # prefill tokens per second on a miss

    def __post_init__(self) -> None:
        if isinstance(self.block_bytes, bool) or not isinstance(self.block_bytes, int) \
                or self.block_bytes < 1:
            raise ConfigError(f"block_bytes must be an integer >= 1, got {self.block_bytes!r}")
        for name in ("bandwidth", "recompute_tps"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ConfigError(f"{name} must be a finite number > 0, got {v!r}")
        if not (isinstance(self.latency, int | float) and math.isfinite(self.latency)
                and self.latency >= 0):
            raise ConfigError(f"latency must be a finite number >= 0, got {self.latency!r}")

    @property
    def load_seconds_per_block(self) -> float:
        return self.block_bytes / self.bandwidth + self.latency


@dataclass
class Trace:
    """A trace flattened for replay: every block reference, its item, and request bounds."""

    refs: list[Hashable]          # block id of every reference
    items: list[Item]             # the Item of each reference (one object per block id)
    starts: list[int]             # request r covers refs[starts[r]:starts[r + 1]]
    tokens: list[int]             # input tokens of each request
    block_tokens: list[int]       # tokens per block of each request
    counted: list[bool]           # True for gets (counted), False for puts
    unique: int                   # distinct block ids
    times: list[float] = field(default_factory=list)  # arrival of each request, seconds
    _next_use: list[int] | None = field(default=None, repr=False)

    @property
    def requests(self) -> int:
        return len(self.tokens)

    @property
    def next_use(self) -> list[int]:
        """Position of the next reference to the same block (``len(refs)``: never)."""
        if self._next_use is None:
            self._next_use = next_use_positions(self.refs)
        return self._next_use

    def queue_ends(self, lookahead: Lookahead) -> list[int]:
        """While request ``r`` is served the queue holds requests ``r + 1 .. ends[r] - 1``
        (:meth:`Lookahead.ends`)."""
        return lookahead.ends(self.requests, self.times)


def prepare(requests: Iterable[Request], cost: CostModel = CostModel()) -> Trace:
    """Flatten ``requests``. A block's :class:`Item` comes from its first reference: size
    ``block_bytes``, parent the previous block, depth its position, group the request's first
    block, miss cost its tokens over ``recompute_tps``."""
    refs: list[Hashable] = []
    items: list[Item] = []
    starts = [0]
    tokens: list[int] = []
    block_tokens: list[int] = []
    counted: list[bool] = []
    times: list[float] = []
    known: dict[Hashable, Item] = {}
    bb, tps = cost.block_bytes, cost.recompute_tps
    for req in requests:
        blocks = req.blocks
        group = blocks[0] if blocks else None
        parent: Hashable = None
        for j, (key, n) in enumerate(zip(blocks, req.block_token_counts(), strict=True)):
            item = known.get(key)
            if item is None:
                item = known[key] = Item(key, size=bb, group=group, depth=j, parent=parent,
                                         miss_cost=n / tps)
            refs.append(key)
            items.append(item)
            parent = key
        starts.append(len(refs))
        tokens.append(req.tokens)
        block_tokens.append(req.block_tokens)
        counted.append(req.op != "put")
        times.append(req.timestamp)
    if not refs:
        raise InputError("the trace has no block references to replay")
    return Trace(refs, items, starts, tokens, block_tokens, counted, len(known), times)


# -- capacities ------------------------------------------------------------------------------------
# Digit counts are bounded: the exact arithmetic of parse_capacity stays cheap.
_CAP = re.compile(r"^\s*([0-9]{0,30}\.?[0-9]{1,30}(?:[eE][+-]?[0-9]{1,3})?)\s*(%|[A-Za-z]*)\s*$")


@dataclass(frozen=True)
class Capacity:
    """A cache size: a fraction of the trace's unique blocks, or absolute bytes."""

    text: str
    fraction: float | None = None
    nbytes: int | None = None

    def resolve(self, trace: Trace, cost: CostModel) -> int:
        """Bytes: fractions become a whole number of blocks (at least one)."""
        if self.nbytes is not None:
            return self.nbytes
        assert self.fraction is not None
        return max(1, round(self.fraction * trace.unique)) * cost.block_bytes


def parse_capacity(text: str) -> Capacity:
    """``0.05`` or ``5%``: that fraction of the unique blocks; ``2GiB``, ``5e9`` or ``5e9B``:
    bytes (a bare number above 1 is bytes)."""
    m = _CAP.match(str(text))
    unit = m.group(2).lower() if m else ""
    if m is None or (unit != "%" and unit not in UNITS):
        raise ConfigError(f"bad capacity {text!r} (a fraction like 0.05, a percentage like 5%, "
                          "or bytes like 2GiB)")
    value = float(m.group(1))
    if unit == "%":
        value /= 100
    elif unit or value > 1:
        nbytes = int(scale(m.group(1), unit, f"capacity {text!r}"))   # exact, at most 8 EiB
        if nbytes < 1:
            raise ConfigError(f"capacity {text!r} is less than one byte")
        return Capacity(str(text), nbytes=nbytes)
    if not 0 < value <= 1:
        raise ConfigError(f"capacity fraction must be in (0, 1], got {text!r}")
    return Capacity(str(text), fraction=value)


# -- simulation ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Result:
    """The outcome of one policy at one capacity."""

    policy: str
    capacity: str                 # as asked ("0.05", "2GiB")
    capacity_bytes: int
    capacity_blocks: int
    capacity_fraction: float      # of the trace's unique blocks
    requests: int                 # counted (get) requests
    references: int               # their block references
    hits: int
    tokens: int                   # their input tokens
    prefix_hit_tokens: int
    evictions: int
    ttft_mean: float              # seconds
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    seconds: float                # wall time of the replay loop
    refs_per_second: float        # all references (gets and puts) per second of wall time
    #: With several tiers (:mod:`rkv.eval.replay.tiers`): per-tier hits and bytes moved, top first.
    #: Empty for a one-tier :func:`simulate`.
    tiers: tuple[TierStats, ...] = ()
    lookahead: int = 0            # queued requests the scheduler knew (a count) ...
    lookahead_s: float = 0.0      # ... or the seconds of arrivals it knew (a time window)
    promote: str = ""             # several tiers: "hit" or "never"
    prefetch_budget: int = 0      # several tiers: bytes prefetched at most per request

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.references if self.references else 0.0

    @property
    def prefix_token_hit_ratio(self) -> float:
        return self.prefix_hit_tokens / self.tokens if self.tokens else 0.0

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "tiers": [t.row() for t in self.tiers],
                "hit_ratio": self.hit_ratio,
                "prefix_token_hit_ratio": self.prefix_token_hit_ratio}


@dataclass(frozen=True)
class TierStats:
    """One tier of a multi-tier replay. Hits count lookups (gets) only, like
    :attr:`Result.hits`; bytes count every movement, puts included (it is traffic either way).
    """

    name: str
    capacity_bytes: int
    bandwidth: float              # bytes per second when loading a hit
    latency: float                # seconds per loaded block
    hits: int = 0                 # block hits served from this tier
    prefix_hits: int = 0          # of which before the request's first miss (they set TTFT)
    written: int = 0              # bytes of new (missed, recomputed) blocks stored here
    demoted_in: int = 0           # bytes demoted here from the tier above
    promoted_in: int = 0          # bytes promoted here on a hit below (top tier only)
    prefetched_in: int = 0        # bytes prefetched here ahead of use (top tier only)
    demoted_out: int = 0          # bytes demoted from here to the tier below
    promoted_out: int = 0         # bytes promoted from here on a hit
    prefetched_out: int = 0       # bytes prefetched from here
    evicted: int = 0              # bytes dropped from the cache from here
    used_at_end: int = 0          # bytes held when the trace ends

    @property
    def moved_in(self) -> int:
        return self.demoted_in + self.promoted_in + self.prefetched_in

    @property
    def moved_out(self) -> int:
        return self.demoted_out + self.promoted_out + self.prefetched_out

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "moved_in": self.moved_in, "moved_out": self.moved_out}


def simulate(trace: Trace, policy: EvictionPolicy, capacity: int, cost: CostModel = CostModel(),
             *, label: str | None = None, capacity_text: str = "",
             admission: AdmissionPolicy | None = None,
             lookahead: int | str | Lookahead = 0) -> Result:
    """Replay ``trace`` through ``policy`` (fresh, empty) managing ``capacity`` bytes.

    ``admission``, when given, is told every access and asked before a miss would evict
    anything: a block it refuses is not cached. ``lookahead`` models a scheduler that knows
    the queued requests (the next N, or those arriving within a time: :mod:`.queue`): their
    cached blocks are protected from eviction (what a serving engine's queue tells the cache;
    with one tier there is nothing to fetch early, so knowing the queue means not evicting
    what it is about to read)."""
    refs, items, starts, counted = trace.refs, trace.items, trace.starts, trace.counted
    nreq = trace.requests
    ahead = parse_lookahead(lookahead)
    ends = trace.queue_ends(ahead)
    queued = Pins()                        # blocks of the queued requests
    # The queued blocks and those the request under way has touched: what may not be
    # evicted. One dict, so that a policy stepping over it tests membership in C.
    pins = Pins()
    tail = 0                               # requests below ``tail`` have joined the queue
    cached: set[Hashable] = set()
    access, insert = policy.on_access, policy.on_insert
    remove = policy.on_remove
    evicted = Reason.EVICTED
    hits = evictions = 0
    lead = [0] * nreq                      # leading hit blocks of each request
    t0 = time.perf_counter()
    for r in range(nreq):
        s, e = starts[r], starts[r + 1]
        if ahead:                               # the queue holds requests r+1 .. ends[r]-1
            if r < tail:                        # request r leaves the queue ...
                queued.drop_all(refs[s:e])
                pins.drop_all(refs[s:e])
            for q in range(max(tail, r + 1), ends[r]):  # ... and the new arrivals join it
                joining = refs[starts[q]:starts[q + 1]]
                queued.add_all(joining)
                pins.add_all(joining)
            tail = max(tail, ends[r])
        protected: set[Hashable] | Pins = pins if ahead else set()
        # Within a request the protected set only grows and every block that enters the
        # cache is protected, so once ``need`` bytes could not be freed, no larger need can
        # be until the next request: skip asking (each ask walks the whole cache, which
        # made one request of n blocks cost n^2).
        futile = math.inf
        first_miss = -1
        rhits = 0
        for i in range(s, e):
            key = refs[i]
            if key in cached:
                access(key, True, i)
                if admission is not None:
                    admission.on_access(key, True, i)
                rhits += 1
            else:
                if first_miss < 0:
                    first_miss = i - s
                item = items[i]
                access(key, False, i, item)
                if admission is not None:
                    admission.on_access(key, False, i)
                need = policy.used + item.size - capacity
                if need > 0:
                    # A block a queued request will read is admitted whatever the rule
                    # says: the scheduler knows it is wanted.
                    if key not in queued and (
                            (admission is not None and not admission.admit(item, i))
                            or not policy.admits(item, i)):
                        protected.add(key)
                        continue
                    out = checked_victims(policy, need, protected) if need < futile else None
                    if out is None:
                        futile = min(futile, need)
                        protected.add(key)
                        continue
                    for v in out:
                        remove(v, evicted)
                        cached.remove(v)
                    evictions += len(out)
                insert(item, i)
                cached.add(key)
            protected.add(key)
        if ahead:
            pins.drop_all(refs[s:e])            # the request's own blocks are free again
        if counted[r]:
            hits += rhits
            lead[r] = e - s if first_miss < 0 else first_miss
    seconds = time.perf_counter() - t0
    return _result(trace, cost, label or policy.name or type(policy).__name__, capacity,
                   capacity_text, lead, hits, evictions, seconds, lookahead=ahead.requests,
                   lookahead_s=float(ahead.seconds))


def _result(trace: Trace, cost: CostModel, label: str, capacity: int, capacity_text: str,
            lead: list[int], hits: int, evictions: int, seconds: float,
            load: NDArray[Any] | None = None, **extra: Any) -> Result:
    """Summarize a replay. ``load``: seconds to load each counted request's hit prefix
    (default: its blocks at the cost model's one bandwidth and latency); ``extra``: the
    multi-tier fields of :class:`Result`."""
    import numpy as np

    mask = np.asarray(trace.counted, dtype=bool)
    starts = np.asarray(trace.starts, dtype=np.int64)
    nblocks = (starts[1:] - starts[:-1])[mask]
    k = np.asarray(lead, dtype=np.int64)[mask]
    tokens = np.asarray(trace.tokens, dtype=np.int64)[mask]
    bt = np.asarray(trace.block_tokens, dtype=np.int64)[mask]
    hit_tokens = np.minimum(k * bt, tokens)
    if load is None:
        load = k * cost.load_seconds_per_block
    ttft = load + (tokens - hit_tokens) / cost.recompute_tps
    if ttft.size:
        mean = float(ttft.mean())
        p50, p90, p99 = (float(x) for x in np.percentile(ttft, [50, 90, 99]))
    else:
        mean = p50 = p90 = p99 = 0.0
    return Result(
        policy=label, capacity=capacity_text or str(capacity), capacity_bytes=capacity,
        capacity_blocks=capacity // cost.block_bytes,
        capacity_fraction=capacity / (trace.unique * cost.block_bytes),
        requests=int(mask.sum()), references=int(nblocks.sum()), hits=hits,
        tokens=int(tokens.sum()), prefix_hit_tokens=int(hit_tokens.sum()),
        evictions=evictions, ttft_mean=mean, ttft_p50=p50, ttft_p90=p90, ttft_p99=p99,
        seconds=seconds, refs_per_second=len(trace.refs) / seconds if seconds > 0 else 0.0,
        **extra)


def check_specs(policies: Sequence[str], capacity: int) -> None:
    """Build every spec once (eviction and admission), so a bad one is a ConfigError before
    anything runs."""
    from policies import make_admission, make_policy, split_spec

    for spec in policies:
        try:
            evict, admit = split_spec(spec)
            make_policy(evict, capacity)
            make_admission(admit)
        except PolicyError as exc:
            raise ConfigError(str(exc)) from exc


def run_replay(trace: Trace, policies: Sequence[str], capacities: Sequence[Capacity],
               cost: CostModel = CostModel(), *, references: bool = True,
               progress: Callable[[str], None] | None = None,
               lookaheads: Sequence[int | str | Lookahead] = (0,)) -> list[Result]:
    """Every policy spec at every capacity (and every scheduler look-ahead, labelled
    ``spec +queue N`` or ``spec +queue 75s``), then (with ``references``) Belady and the
    infinite cache. A bad spec or look-ahead raises :class:`ConfigError` before anything
    runs."""
    queues = [parse_lookahead(n) for n in lookaheads]
    from policies import make_admission, make_policy, split_spec

    caps = [(c, c.resolve(trace, cost)) for c in capacities]
    check_specs(policies, caps[0][1] if caps else 1)
    out: list[Result] = []
    for spec in policies:
        evict, admit = split_spec(spec)
        for ahead in queues:
            label = f"{spec} +queue {ahead.text}" if ahead else spec
            for c, nbytes in caps:
                if progress:
                    progress(f"{label} at {c.text}")
                adm = None if admit == "all" else make_admission(admit)
                out.append(simulate(trace, make_policy(evict, nbytes), nbytes, cost,
                                    label=label, capacity_text=c.text, admission=adm,
                                    lookahead=ahead))
    if references:
        for c, nbytes in caps:
            if progress:
                progress(f"{BELADY} at {c.text}")
            out.append(simulate(trace, Belady(nbytes, trace.next_use), nbytes, cost,
                                label=BELADY, capacity_text=c.text))
        if caps:
            if progress:
                progress(INFINITE)
            total = trace.unique * cost.block_bytes
            inf = simulate(trace, InfiniteCache(total), total, cost, label=INFINITE)
            for c, nbytes in caps:
                out.append(replace(inf, capacity=c.text, capacity_bytes=nbytes,
                                   capacity_blocks=nbytes // cost.block_bytes,
                                   capacity_fraction=nbytes / total))
    return out
