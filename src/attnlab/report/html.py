"""``report.html``: one self-contained page per training run, and one for the attention
benchmark.

A run's page holds its results (``results.json``), its training curves, for a classifier
the confusion matrix on the test set and a few test inputs with their predicted and true
labels, for a translation run a few test sentences with their references and
translations, attention maps and the attention explorer, and last its configuration
(``config.yaml``), folded. Each part that needs more than the run's files (the data set,
a checkpoint, the attention drawing) becomes a short note when it cannot be made, so the
page is always written; the note says what the reader can act on, never an exception:

* a model whose attention cannot be shown (:class:`~attnlab.errors.AttentionUnavailable`:
  it forms no weight matrix, has none, or its family has no drawing): a sentence naming
  the model and what to train instead;
* a run's files or data that do not fit (any other :class:`~attnlab.errors.InputError`,
  e.g. the data set gone): its message;
* anything else is a bug of attnlab's: the page says the part could not be drawn, and the
  traceback goes to ``log`` (the training's output, or standard error).

The generic builder is :func:`~attnlab.report.page.render_html`; it is re-exported here.
"""

from __future__ import annotations

import html
import json
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

from .. import __version__
from ..errors import AttentionUnavailable, InputError
from ..io import atomic_write_bytes, read_json_mapping
from ..tasks import (CHANGES, ClassifierPredictions, SampleTable, Task, TrainedRun, get_task, load_run, model_label,
                     read_config, read_recipe, report_items)
from ..run.skeleton import UnfinishedRunWarning
from ..viz.explorer import explore
from ..viz.explorer.page import script_hashes
from ..viz.run import visualize_run
from .curves import plot_curves, read_metrics
from .page import Details, Html, Image, Note, Part, Pre, Section, Table, data_uri, render_html
from .predictions import confusion_png, image_samples_png

__all__ = ["write_run_report", "write_run_report_safely", "render_html", "Section", "value_text"]


Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _why(exc: BaseException) -> str:
    """An :class:`InputError`'s message as a note says it: its first line, no class name."""
    text = str(exc).strip().splitlines()
    return text[0][:400] if text else "no reason given"


def _failed(what: str, exc: Exception, log: Log) -> Note:
    """The note in place of ``what`` (``"the curves"``) that could not be made: an
    :class:`InputError`'s message (the run's files or data), or for any other exception, a
    bug, a plain sentence, with the traceback written to ``log``."""
    if isinstance(exc, InputError):
        return Note(f"{what[0].upper()}{what[1:]} could not be made: {_why(exc)}")
    log(f"warning: report.html: {what} could not be drawn, a failure inside attnlab (please report it):\n"
        + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip())
    return Note(f"{what[0].upper()}{what[1:]} could not be drawn: something failed inside attnlab. The command that "
                f"wrote this page printed the details; please report them.")


def _unavailable(what: str, model: str, exc: AttentionUnavailable) -> Note:
    """The sentence in place of a model's attention pictures it cannot have."""
    return Note(f"No {what} for model {model}: {exc.reason}." + (f" {exc.instead}" if exc.instead else ""))


def _model_name(run_dir: Path) -> str:
    """The run's model as the report names it (:func:`~attnlab.tasks.model_label`)."""
    return model_label(read_recipe(run_dir).model) or "(unnamed)"


def _number(key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if "accuracy" in key and isinstance(value, float) and 0.0 <= value <= 1.0:
        return f"{100 * value:.2f}%"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.1f}" if abs(value) >= 100 else f"{value:.4g}"


def value_text(key: str, value: Any) -> str:
    """A results value for a table: accuracies as percentages, counts with separators."""
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
    except ValueError as exc:  # an InputError naming the file
        return Section("Results", [Note(f"results.json could not be read: {_why(exc)}")]), {}
    parts: list[Part] = [Table([(k, value_text(k, v)) for k, v in results.items()], ("result", "value"))]
    if results.get("fold_accuracies"):
        parts += ["Test accuracy of each fold (each fold trained on the other nine, tested on its own):",
                  Table([(k, _number("accuracy", a)) for k, a in enumerate(results["fold_accuracies"])],
                        ("fold", "test accuracy"))]
    return Section("Results", parts), results


def _config(run_dir: Path) -> Section:
    try:
        rows = _flatten(read_config(run_dir))
    except InputError as exc:
        return Section("Configuration", [Note(f"The configuration could not be read: {_why(exc)}")])
    parts: list[Part] = [
        "The resolved recipe the run was trained with; keys are the dotted names that "
        "'attnlab train RECIPE key=value' overrides.",
        Table([(k, _yaml_value(v)) for k, v in rows], ("key", "value")),
    ]
    if (run_dir / CHANGES).is_file():
        parts += ["Settings changed when the run was resumed (config.yaml keeps the original; the table above "
                  "shows the settings in force at the end):", Pre((run_dir / CHANGES).read_text())]
    changed = " and the changes made on resuming" if (run_dir / CHANGES).is_file() else ""
    return Section("Configuration", [Details(f"the {len(rows)} settings of the run{changed}", parts)])


def _curves(run_dir: Path, task: Task, log: Log) -> Section:
    try:
        sub_runs = task.sub_runs(run_dir)
        if sub_runs:
            series = {p.name.replace("_", " "): read_metrics(p / "metrics.jsonl") for p in sub_runs}
        else:
            series = {"": read_metrics(run_dir / "metrics.jsonl")}
        paths = plot_curves(series, run_dir / "curves")
    except Exception as exc:  # noqa: BLE001  # a figure that fails must not cost the page
        return Section("Training curves", [_failed("the curves", exc, log)])
    if not paths:
        return Section("Training curves", [Note("metrics.jsonl holds no logged step or evaluation yet "
                                                "(train.log_every and train.eval_every decide what is logged).")])
    captions = {"loss": "training loss (solid) and evaluation loss (dashed)", "accuracy": "evaluation accuracy",
                "bleu": "evaluation BLEU", "lr": "learning rate", "throughput": "training samples per second"}
    return Section("Training curves", [Image(p, captions.get(p.stem, p.stem)) for p in paths])


def _item_sections(item: object) -> list[Section]:
    """The sections of one of a task's report items, drawn by its type."""
    if isinstance(item, ClassifierPredictions):
        confusion = Section("Confusion matrix", [
            Image(confusion_png(item), f"rows: true class, columns: predicted class; weights: {item.weights}"),
        ])
        if item.examples and not isinstance(item.examples[0], str):
            shown: Part = Image(image_samples_png(item), "mistakes in red")
        else:
            shown = Table([(text, item.classes[item.true[i]], item.classes[item.pred[i]], f"{item.prob[i]:.3f}")
                           for text, i in zip(item.examples, item.shown)],
                          ("test input", "true", "predicted", "probability"))
        return [confusion, Section("Sample predictions", [f"{len(item.examples)} test inputs, evenly spaced through "
                                                          f"the test set, predicted by {item.weights}.", shown])]
    if isinstance(item, SampleTable):
        return [Section(item.title, [item.text, Table(item.rows, item.header)])]
    raise InputError(f"the report cannot show a {type(item).__name__}; tasks give views of attnlab.run.views")


def _task_sections(run: Path | TrainedRun, task: Task, device: str, log: Log) -> list[Section]:
    """What the task shows beside results, configuration and curves; a failure (the data
    set or a checkpoint gone) is a note under the task's usual headings."""
    try:
        return [section for item in report_items(run, device=device) for section in _item_sections(item)]
    except Exception as exc:  # noqa: BLE001
        heading = "Sample outputs" if task.outputs == "text" else "Sample predictions"
        return [Section(heading, [_failed("the predictions on the test set", exc, log)])]


def _attention(run_dir: Path, task: Task, log: Log, loaded: TrainedRun | None = None) -> Section:
    """Attention maps drawn by :func:`attnlab.viz.run.visualize_run`, when it can."""
    sub_runs = task.sub_runs(run_dir)
    target = sub_runs[0] if sub_runs else run_dir
    try:
        paths = visualize_run(loaded or target, out_dir=run_dir / "attention", max_inputs=2,
                              device=_device_of(loaded))
        images = [Image(Path(path).read_bytes(), alt=f"attention map {Path(path).stem}") for path in paths]
        for image in images:
            data_uri(image.source)  # an unreadable picture becomes the note below, not a failed page
    except AttentionUnavailable as exc:  # the model's: it forms no weights, has none, or has no drawing
        return Section("Attention", [_unavailable("attention maps", _model_name(target), exc)])
    except Exception as exc:  # noqa: BLE001  # the data gone (its message), or a bug (the log)
        return Section("Attention", [_failed("the attention maps", exc, log)])
    if not images:
        return Section("Attention", [Note("No attention maps: the drawing returned none for this run.")])
    of = f" of {target.name}" if target != run_dir else ""
    return Section("Attention", [f"Attention maps{of} on up to two test inputs.", *images])


def _explorer(run_dir: Path, task: Task, log: Log, loaded: TrainedRun | None = None) -> Section:
    """The attention explorer (:func:`attnlab.viz.explore`) on the run's example inputs, in a
    frame of the page, when the run's model records attention weights."""
    sub_runs = task.sub_runs(run_dir)
    target = sub_runs[0] if sub_runs else run_dir
    try:
        page = explore(loaded or target, max_inputs=2, new_tokens=20, device=_device_of(loaded)).html()
    except AttentionUnavailable as exc:
        return Section("Attention explorer", [_unavailable("attention explorer", _model_name(target), exc)])
    except Exception as exc:  # noqa: BLE001
        return Section("Attention explorer", [_failed("the attention explorer", exc, log)])
    frame = (f'<iframe class="explorer" title="attention explorer" sandbox="allow-scripts" '
             f'srcdoc="{html.escape(page, quote=True)}"></iframe>')
    return Section("Attention explorer", [
        "Every head of every layer on the same inputs: choose a layer and heads, hover a token to see where it "
        "looks, open the model view for the grid of all heads (attnlab explore RUN_DIR writes it as a page of its "
        "own, on inputs of one's choice).", Html(frame, tuple(script_hashes(page)))])


def _load_once(run_dir: Path, task: Task, device: str) -> TrainedRun | None:
    """The run, loaded once for the predictions, the attention maps and the explorer (three
    loads took 33 s of all-MiniLM-L6-v2's report); ``None`` for a run of sub-runs, or where
    it does not load (each section then names why)."""
    if task.sub_runs(run_dir):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnfinishedRunWarning)  # each section says so when it loads the run itself
            return load_run(run_dir, device=device)
    except Exception:  # noqa: BLE001  # the sections load it again and report the failure under their headings
        return None


def _device_of(run: TrainedRun | None) -> str:
    """Where the loaded run's model is (the sections leave it there), else the CPU."""
    weights = next(run.model.parameters(), None) if run is not None else None
    return "cpu" if weights is None else str(weights.device)


def write_run_report(run_dir: str | Path, out: str | Path | None = None, *, device: str = "auto",
                     log: Log | None = None) -> Path:
    """Write ``run_dir/report.html`` (or ``out``) for a run directory and return its path.

    The curves' PNGs go to ``run_dir/curves/`` and the attention maps to
    ``run_dir/attention/``; the page embeds them and needs nothing beside itself. The
    sections: results, curves, the task's own (predictions, samples), attention maps, the
    explorer, and the configuration last, folded. ``log`` takes the tracebacks of the parts
    that failed by a bug (default: standard error).
    """
    run_dir = Path(run_dir)
    log = log or _stderr
    recipe = read_recipe(run_dir)  # InputError naming run_dir when it is not a run directory
    task = get_task(recipe.task)
    results_section, _ = _results(run_dir)
    loaded = _load_once(run_dir, task, device)
    sections = [results_section, _curves(run_dir, task, log), *_task_sections(loaded or run_dir, task, device, log),
                _attention(run_dir, task, log, loaded), _explorer(run_dir, task, log, loaded), _config(run_dir)]
    subtitle = (f"{task.describe(recipe)}: {model_label(recipe.model) or '(unnamed)'} on {recipe.data.name}. {run_dir.resolve()}, "
                f"report written {time.strftime('%Y-%m-%d %H:%M:%S')} by attnlab {__version__}.")
    path = Path(out) if out is not None else run_dir / "report.html"
    atomic_write_bytes(path, render_html(f"attnlab run {run_dir.resolve().name}", sections, subtitle).encode())
    return path


def write_run_report_safely(run_dir: str | Path, log=print) -> Path | None:
    """:func:`write_run_report` at the end of a training: a failure is one warning line,
    never an exception (the trained run is worth more than its report)."""
    try:
        start = time.perf_counter()
        path = write_run_report(run_dir, log=log)
        log(f"report: {path} ({time.perf_counter() - start:.1f} s)")
        return path
    except Exception as exc:  # noqa: BLE001  # any failure: the run's files are already safe on disk
        log(f"warning: report.html not written: {type(exc).__name__}: {exc}")
        return None
