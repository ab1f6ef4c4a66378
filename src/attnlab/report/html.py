"""``report.html``: one self-contained page per training run, and one for the attention
benchmark.

A run's page holds its results (``results.json``), its configuration (``config.yaml``),
its training curves, for a classifier the confusion matrix on the test set and a few
test inputs with their predicted and true labels, for a translation run a few test
sentences with their references and translations, and attention maps. Each part that
needs more than the run's files (the data set, a checkpoint, the attention drawing)
becomes a short note when it cannot be made, so the page is always written.

The generic builder is :func:`~attnlab.report.page.render_html`; it is re-exported here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..io import atomic_write_bytes, read_json_mapping
from .curves import plot_curves, read_metrics
from .markdown import markdown_to_html
from .page import Html, Image, Note, Part, Pre, Section, Table, data_uri, render_html
from .predictions import (classifier_predictions, confusion_png, image_samples_png, is_cross_validation,
                          translation_samples)

__all__ = ["write_run_report", "write_bench_report", "is_bench_dir", "render_html", "Section", "RUN_SECTIONS"]

# The sections of a run's page, by task (in this order).
RUN_SECTIONS = {
    "image_classification": ("Results", "Configuration", "Training curves", "Confusion matrix",
                             "Sample predictions", "Attention"),
    "sentiment": ("Results", "Configuration", "Training curves", "Confusion matrix", "Sample predictions",
                  "Attention"),
    "translation": ("Results", "Configuration", "Training curves", "Sample translations", "Attention"),
}


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:400]


def _number(key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if "accuracy" in key and isinstance(value, float) and 0.0 <= value <= 1.0:
        return f"{100 * value:.2f}%"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.1f}" if abs(value) >= 100 else f"{value:.4g}"


def _value(key: str, value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_number(key, v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value) if value else "{}"
    return _number(key, value)


def _flatten(mapping: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``train.lr``-style keys: the names ``attnlab train`` takes as overrides."""
    rows: list[tuple[str, Any]] = []
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            rows += _flatten(value, f"{prefix}{key}.")
        else:
            rows.append((f"{prefix}{key}", value))
    return rows


def _yaml_value(value: Any) -> str:
    """A value as an override would spell it: ``null``, ``true``, ``[1, 2]``, ``{}``."""
    if value is None or isinstance(value, (bool, dict, list)):
        return json.dumps(value)
    return str(value)


def _results(run_dir: Path) -> tuple[Section, dict[str, Any]]:
    path = run_dir / "results.json"
    if not path.is_file():
        return Section("Results", [Note("No results.json yet: the run has not finished.")]), {}
    try:
        results = read_json_mapping(path)
    except ValueError as exc:
        return Section("Results", [Note(f"results.json could not be read: {_why(exc)}")]), {}
    parts: list[Part] = [Table([(k, _value(k, v)) for k, v in results.items()], ("result", "value"))]
    if results.get("fold_accuracies"):
        parts += ["Test accuracy of each fold (each fold trained on the other nine, tested on its own):",
                  Table([(k, _number("accuracy", a)) for k, a in enumerate(results["fold_accuracies"])],
                        ("fold", "test accuracy"))]
    return Section("Results", parts), results


def _config(run_dir: Path) -> Section:
    from ..tasks.common import CHANGES, read_config

    try:
        rows = _flatten(read_config(run_dir))
    except ValueError as exc:
        return Section("Configuration", [Note(f"The configuration could not be read: {_why(exc)}")])
    parts: list[Part] = [
        "The resolved recipe the run was trained with; keys are the dotted names that "
        "'attnlab train RECIPE key=value' overrides.",
        Table([(k, _yaml_value(v)) for k, v in rows], ("key", "value")),
    ]
    if (run_dir / CHANGES).is_file():
        parts += ["Settings changed when the run was resumed (config.yaml keeps the original; the table above "
                  "shows the settings in force at the end):", Pre((run_dir / CHANGES).read_text())]
    return Section("Configuration", parts)


def _curves(run_dir: Path) -> Section:
    try:
        if is_cross_validation(run_dir):
            series = {f"fold {k}": read_metrics(run_dir / f"fold_{k}" / "metrics.jsonl") for k in range(10)
                      if (run_dir / f"fold_{k}").is_dir()}
        else:
            series = {"": read_metrics(run_dir / "metrics.jsonl")}
        paths = plot_curves(series, run_dir / "curves")
    except Exception as exc:  # noqa: BLE001  # a figure that fails must not cost the page
        return Section("Training curves", [Note(f"The curves could not be drawn: {_why(exc)}")])
    if not paths:
        return Section("Training curves", [Note("metrics.jsonl holds no logged step or evaluation yet "
                                                "(train.log_every and train.eval_every decide what is logged).")])
    captions = {"loss": "training loss (solid) and evaluation loss (dashed)", "accuracy": "evaluation accuracy",
                "bleu": "evaluation BLEU", "lr": "learning rate", "throughput": "training samples per second"}
    return Section("Training curves", [Image(p, captions.get(p.stem, p.stem)) for p in paths])


def _classifier(run_dir: Path, device: str) -> list[Section]:
    try:
        p = classifier_predictions(run_dir, device=device)
    except Exception as exc:  # noqa: BLE001  # the data set or the checkpoint may be gone
        note = Note(f"Predictions on the test set could not be computed: {_why(exc)}")
        return [Section("Confusion matrix", [note]), Section("Sample predictions", [note])]
    confusion = Section("Confusion matrix", [
        Image(confusion_png(p), f"rows: true class, columns: predicted class; weights: {p.weights}"),
    ])
    if p.examples and not isinstance(p.examples[0], str):
        shown: Part = Image(image_samples_png(p), "mistakes in red")
    else:
        shown = Table([(text, p.classes[p.true[i]], p.classes[p.pred[i]], f"{p.prob[i]:.3f}")
                       for text, i in zip(p.examples, p.shown)], ("test sentence", "true", "predicted", "probability"))
    return [confusion, Section("Sample predictions", [f"{len(p.examples)} test inputs, evenly spaced through the "
                                                      f"test set, predicted by {p.weights}.", shown])]


def _translations(run_dir: Path) -> Section:
    try:
        rows = translation_samples(run_dir)
    except Exception as exc:  # noqa: BLE001
        return Section("Sample translations", [Note(f"No sample translations: {_why(exc)}")])
    return Section("Sample translations", [
        "The first test sentences (test_2016_flickr) with the run's beam-search translations.",
        Table(rows, ("source", "reference", "translation")),
    ])


def _attention(run_dir: Path) -> Section:
    """Attention maps drawn by :func:`attnlab.viz.run.visualize_run`, when it can."""
    target = run_dir / "fold_0" if is_cross_validation(run_dir) else run_dir
    try:
        from ..viz.run import visualize_run

        paths = visualize_run(target, out_dir=run_dir / "attention", max_inputs=2)
        images = [Image(Path(path).read_bytes(), alt=f"attention map {Path(path).stem}") for path in paths]
        for image in images:
            data_uri(image.source)  # an unreadable picture becomes the note below, not a failed page
    except Exception as exc:  # noqa: BLE001  # e.g. an efficient attention kind that forms no weights
        return Section("Attention", [Note(f"No attention maps: {_why(exc)}")])
    if not images:
        return Section("Attention", [Note("No attention maps: the drawing returned none for this run.")])
    of = f" of {target.name}" if target != run_dir else ""
    return Section("Attention", [f"Attention maps{of} on up to two test inputs.", *images])


def write_run_report(run_dir: str | Path, out: str | Path | None = None, *, device: str = "auto") -> Path:
    """Write ``run_dir/report.html`` (or ``out``) for a run directory and return its path.

    The curves' PNGs go to ``run_dir/curves/`` and the attention maps to
    ``run_dir/attention/``; the page embeds them and needs nothing beside itself.
    """
    from .. import __version__
    from ..tasks.common import read_recipe

    run_dir = Path(run_dir)
    recipe = read_recipe(run_dir)  # ValueError naming run_dir when it is not a run directory
    results_section, results = _results(run_dir)
    sections = [results_section, _config(run_dir), _curves(run_dir)]
    if recipe.task == "translation":
        sections.append(_translations(run_dir))
    else:
        sections += _classifier(run_dir, device)
    sections.append(_attention(run_dir))
    what = "10-fold cross-validation" if is_cross_validation(run_dir) else recipe.task.replace("_", " ")
    subtitle = (f"{what}: {recipe.model.name} on {recipe.data.name}. {run_dir.resolve()}, "
                f"report written {time.strftime('%Y-%m-%d %H:%M:%S')} by attnlab {__version__}.")
    path = Path(out) if out is not None else run_dir / "report.html"
    atomic_write_bytes(path, render_html(f"attnlab run {run_dir.resolve().name}", sections, subtitle).encode())
    return path


# ----------------------------------------------------------------------------- the benchmark


def is_bench_dir(folder: str | Path) -> bool:
    """An ``attnlab bench attention`` output folder: its ``results.json``, no ``config.yaml``."""
    folder = Path(folder)
    if (folder / "config.yaml").is_file() or not (folder / "results.json").is_file():
        return False
    try:
        data = json.loads((folder / "results.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and any(k in data for k in ("scaling", "quality", "studies"))


def write_bench_report(out_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``out_dir/report.html`` (or ``out``) from the benchmark's ``results.json``,
    ``table.md`` (its Markdown tables, as HTML tables) and ``time.png``/``memory.png``."""
    from .. import __version__

    out_dir = Path(out_dir)
    if not (out_dir / "results.json").is_file():
        raise InputError(f"out_dir must be an 'attnlab bench attention' output folder with results.json; "
                         f"{out_dir} has none")
    data = read_json_mapping(out_dir / "results.json")
    table = out_dir / "table.md"
    if table.is_file():
        text = table.read_text(encoding="utf-8")
    else:
        from ..bench.report import markdown

        text = markdown(data)
    machine = data.get("machine", {})
    about: list[Part] = [Table([(k, _value(k, v)) for k, v in machine.items()], ("machine", "value"))]
    if data.get("quick"):
        about.insert(0, Note("A quick run (tiny sizes and budgets): it shows that the benchmark runs; "
                             "the figures mean nothing."))
    plots: list[Part] = [Image(out_dir / name, caption) for name, caption in
                         (("time.png", "time against sequence length"),
                          ("memory.png", "peak memory against sequence length")) if (out_dir / name).is_file()]
    sections = [
        Section("Machine", about),
        Section("Tables", [Html(markdown_to_html(text))]),
        Section("Plots", plots or [Note("No time.png or memory.png: the scaling part has not run.")]),
    ]
    subtitle = (f"{out_dir.resolve()}, report written {time.strftime('%Y-%m-%d %H:%M:%S')} "
                f"by attnlab {__version__}.")
    path = Path(out) if out is not None else out_dir / "report.html"
    atomic_write_bytes(path, render_html("attnlab bench attention", sections, subtitle).encode())
    return path
