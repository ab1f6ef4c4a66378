"""Training curves from ``metrics.jsonl``: loss (train and eval), accuracy and BLEU,
learning rate and throughput against the training step, one PNG each.

Several runs can be drawn together (the ten folds of a cross-validation): pass a
mapping of names to records. Figures are drawn with matplotlib's object API
(``Figure``, no ``pyplot``), so nothing here changes the caller's backend or global
state, and no display is needed.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..engine.metrics import read_metrics
from ..io import atomic_write_bytes

__all__ = ["read_metrics", "plot_curves", "CURVES"]

# file stem -> (record kind, value key, y label, title); drawn when some record has the key.
CURVES: dict[str, tuple[str, str, str, str]] = {
    "loss": ("", "loss", "loss", "Loss"),  # both kinds: train and eval
    "accuracy": ("eval", "accuracy", "accuracy", "Accuracy on the evaluation set"),
    "bleu": ("eval", "bleu", "BLEU", "BLEU on the evaluation set"),
    "lr": ("train", "lr", "learning rate", "Learning rate"),
    "throughput": ("train", "samples_per_s", "samples / s", "Training throughput"),
}

Records = Sequence[Mapping[str, Any]]


def _points(records: Records, kind: str, key: str) -> list[tuple[int, float]]:
    """``(step, value)`` pairs of finite numbers (``"nan"`` is stored as text: skipped), by step."""
    pts = []
    for r in records:
        value = r.get(key)
        if r.get("kind", "train") == kind and isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value) and isinstance(r.get("step"), int):
                pts.append((r["step"], float(value)))
    return sorted(pts)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def _figure(title: str, ylabel: str):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.subplots()
    ax.set_title(title, fontsize=13)
    ax.set_xlabel("training step", fontsize=11)
    ax.set_ylabel(ylabel, fontsize=11)
    ax.tick_params(labelsize=10)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _draw(stem: str, series: Mapping[str, Records]) -> bytes | None:
    kind, key, ylabel, title = CURVES[stem]
    fig, ax = _figure(title, ylabel)
    colours = [f"C{i % 10}" for i in range(len(series))]
    drawn = 0
    for (name, records), colour in zip(series.items(), colours):
        prefix = f"{name} " if name else ""
        kinds = ("train", "eval") if not kind else (kind,)
        for k in kinds:
            pts = _points(records, k, key)
            if stem == "throughput" and len(pts) > 1 and pts[0][0] == 1:
                pts = pts[1:]  # step 1's rate is mostly start-up (the first batch read, first allocations)
            if not pts:
                continue
            steps, values = zip(*pts)
            style = {"linestyle": "--", "marker": "o", "markersize": 4} if k == "eval" and len(kinds) > 1 else {}
            label = f"{prefix}{k}" if len(kinds) > 1 else (name or k)
            ax.plot(steps, values, color=colour, label=label, linewidth=1.6, **style)
            drawn += 1
    if not drawn:
        return None
    if key == "accuracy":
        from matplotlib.ticker import PercentFormatter

        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    if key == "lr":
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    if drawn > 1:
        ax.legend(fontsize=9 if drawn <= 6 else 7, ncol=1 if drawn <= 6 else 2)
    fig.tight_layout()
    return _png(fig)


def plot_curves(metrics: Records | Mapping[str, Records] | str | Path, out_dir: str | Path) -> list[Path]:
    """Write ``loss.png``, ``accuracy.png``, ``bleu.png``, ``lr.png``, ``throughput.png``
    into ``out_dir`` (each only when the records hold its values); returns their paths.

    ``metrics``: a ``metrics.jsonl`` path, its records, or ``{name: records}`` for several
    runs on one set of axes. A torn last line of the file is ignored.
    """
    if isinstance(metrics, (str, Path)):
        metrics = read_metrics(metrics)
    series: Mapping[str, Records] = metrics if isinstance(metrics, Mapping) else {"": metrics}
    out_dir = Path(out_dir)
    written = []
    for stem in CURVES:
        png = _draw(stem, series)
        if png is not None:
            path = out_dir / f"{stem}.png"
            atomic_write_bytes(path, png)
            written.append(path)
    return written
