"""Fast paths of victim queries against the general procedures they shortcut."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies import make_policy
from policies.base import Item, PlannedEviction, Reason

ops = st.lists(st.tuples(st.sampled_from(["get", "get", "get", "drop"]), st.integers(0, 30)),
               min_size=1, max_size=150)


@settings(max_examples=200, deadline=None)
@given(ops, st.integers(1, 4), st.frozensets(st.integers(0, 30), max_size=6),
       st.sampled_from(["s3fifo", "s3fifo(small=0.3)", "s3fifo(threshold=2)"]))
def test_s3fifo_single_victim_scan_equals_the_plan(seq: list[tuple[str, int]], need: int,
                                                   protected: frozenset[int], spec: str) -> None:
    """S3-FIFO answers one-victim queries by a direct scan; it must name exactly what the
    simulated walk (PlannedEviction.victims) names, in every state."""
    cap = 8
    pol = make_policy(spec, cap)
    for i, (op, k) in enumerate(seq):
        if op == "drop":
            if k in pol:
                pol.on_remove(k, Reason.DELETED)
            continue
        if k in pol:
            pol.on_access(k, True, i)
            continue
        item = Item(k, size=1 + k % 2)
        pol.on_access(k, False, i, item)
        if pol.used + item.size > cap:
            out = PlannedEviction.victims(pol, pol.used + item.size - cap)
            assert out is not None
            for v in out:
                pol.on_remove(v, Reason.EVICTED)
        pol.on_insert(item, i)
        assert pol.victims(need, protected) == PlannedEviction.victims(pol, need, protected)
