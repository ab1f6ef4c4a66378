"""Look inside a run: training curves, and a self-contained ``report.html``.

* :func:`write_run_report`: ``RUN_DIR/report.html`` for a training run (results, curves,
  confusion matrix or translations, attention maps, the configuration folded at the end);
  written at the end of ``attnlab train`` and by ``attnlab report RUN_DIR``.
* :func:`plot_curves`: the curves of ``metrics.jsonl`` as PNGs.
* :func:`render_html`: the page builder both use (sections of text, tables, images).
"""

from .curves import plot_curves
from .html import write_run_report, write_run_report_safely
from .page import Details, Html, Image, Note, Pre, Section, Table, render_html

__all__ = ["write_run_report", "write_run_report_safely", "plot_curves", "render_html", "Section",
           "Image", "Table", "Pre", "Note", "Html", "Details"]
