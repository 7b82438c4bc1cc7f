"""The reliability figure's legend names the zero-event upper bounds as such, drawn with
their own look (an open grey marker over a caret), not as a bare caret or a measured rate."""

from __future__ import annotations

import sys
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from test_sweep_report import grid

from rkv.eval.sweep.report_plot import _plt, figure_reliability
from rkv.eval.sweep.report_rows import settings


def test_legend_has_the_upper_bound_entry_with_its_look() -> None:
    plt = _plt()
    fig = figure_reliability(plt, settings(grid()), set())
    try:
        (legend,) = fig.legends
        texts = [t.get_text() for t in legend.get_texts()]
        entry = [t for t in texts if t.startswith("upper bound (no events seen)")]
        assert len(entry) == 1
    finally:
        plt.close(fig)


def test_pareto_offsets_keep_the_order_of_the_bytes() -> None:
    """Points of one bit-width are drawn a few points apart in the order of their bytes: the
    old offsets (in legend order) put rs223, which stores more, left of bch40, on it."""
    from rkv.eval.sweep.report_plot import GID_MEASURED, figure_pareto

    plt = _plt()
    fig = figure_pareto(plt, settings(grid()), set())
    try:
        ax = fig.axes[0]
        fig.canvas.draw()
        pts = []
        for c in ax.collections:
            if c.get_gid() != GID_MEASURED:
                continue
            (x, y), = c.get_offsets()
            (dx, _), = c.get_offset_transform().transform([(x, y)])
            pts.append((round(float(y), 12), float(x), float(dx)))
        by_y: dict[float, list[tuple[float, float]]] = {}
        for y, x, dx in pts:
            by_y.setdefault(y, []).append((x, dx))
        assert len(by_y) == 4                          # the four bit-widths
        for row in by_y.values():
            row.sort()
            shown = [dx for _, dx in row]
            assert shown == sorted(shown)
            assert min(b - a for a, b in pairwise(shown)) > 5.0
    finally:
        plt.close(fig)
