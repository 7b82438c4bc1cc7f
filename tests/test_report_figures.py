"""The reliability figure's legend names the zero-event upper bounds as such, drawn with
their own look (an open grey marker over a caret), not as a bare caret or a measured rate."""

from __future__ import annotations

import sys
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
