"""benchmarks/reuse_separability.py, whose figures docs/policies.md quotes: the AUC against
the definition (every positive-negative pair), the in-sample table against a hand count, and
the gaps of a small trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.reuse_separability import _table, auc, cells_and_gaps, prefix_gaps


@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=2, max_size=40))
def test_auc_is_the_share_of_pairs_ranked_right(rows: list[tuple[int, bool]]) -> None:
    cells = [(c,) for c, _ in rows]
    y = np.array([int(v) for _, v in rows])
    share = {c: np.mean([v for (d,), v in zip(cells, y, strict=True) if d == c]) for (c,) in cells}
    pos = [share[c] for (c,), v in zip(cells, y, strict=True) if v]
    neg = [share[c] for (c,), v in zip(cells, y, strict=True) if not v]
    got = auc(cells, y)
    if not pos or not neg:
        assert np.isnan(got)
        return
    want = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
    assert got == want or abs(got - want) < 1e-12


def test_table_leaves_out_returns_within_the_queue() -> None:
    # key a: seen at 0, 1 (within a queue of 2), 10; key b: 0 only; key c: 0, 5.
    seen = [("a", (1,), 0.0), ("b", (1,), 0.0), ("c", (2,), 0.0), ("a", (1,), 1.0),
            ("c", (2,), 5.0), ("a", (1,), 10.0)]
    table = _table(seen, queue=2)
    # cell (1,): a@0 left out (returns at 1), a@1 returns at 10 (yes), b@0 no, a@10 no.
    assert table[(1,)] == 1 / 3
    # cell (2,): c@0 returns at 5 (yes), c@5 no.
    assert table[(2,)] == 1 / 2


def test_gaps_and_places_of_a_small_trace(tmp_path: Path) -> None:
    rows = [{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [1, 2, 3]},
            {"timestamp": 1, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
            {"timestamp": 2, "input_length": 512, "output_length": 1, "hash_ids": [9]}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cells, gaps = cells_and_gaps(path)
    assert gaps.tolist() == [1, 1, -1, -1, -1, -1]
    assert [c[0] for c in cells] == [3, 2, 0, 2, 1, 1]  # rest, second-last, partial, full
    assert [c[3] for c in cells] == [0, 0, 0, 1, 1, 0]  # earlier sightings
    # The second request extends [1, 2], last referenced one request before (bucket 1);
    # the others extend nothing.
    assert prefix_gaps(path) == [0, 0, 0, 1, 1, 0]
