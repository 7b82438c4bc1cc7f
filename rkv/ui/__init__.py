"""Output helpers shared by the command line and the reports: tables (:mod:`rkv.ui.tables`:
a rich table on a terminal, plain text when captured, JSON, CSV or Markdown from the same
rows), progress (:mod:`rkv.ui.progress`: a bar with rate and ETA on a terminal, periodic
plain lines otherwise) and byte sizes (:func:`human_bytes`)."""

from __future__ import annotations

from rkv.ui.progress import Progress
from rkv.ui.sizes import human_bytes
from rkv.ui.tables import FORMATS, Column, check_format, echo_table, render

__all__ = ["FORMATS", "Column", "Progress", "check_format", "echo_table", "human_bytes",
           "render"]
