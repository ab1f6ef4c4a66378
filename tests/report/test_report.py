"""report.html as a person meets it: written at the end of training, self-contained,
every section there, the curves readable, the confusion matrix agreeing with the
results, 'attnlab report' with its bad input, and the page rendered in headless Chromium
(not blank, every image loaded, no console error)."""

import base64
import io
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

from attnlab.bench.report import write_bench_report
from attnlab.cli import main
from attnlab.report import Image, Note, Pre, Section, Table, plot_curves, render_html
from attnlab.report.html import write_run_report
from attnlab.report.markdown import markdown_to_html
from attnlab.tasks import report_items
from conftest import DIGITS_WITH_VALIDATION

# The sections of a run's page, from what its task reports (in this order): what the run did first, its
# configuration last.
CLASSIFIER_SECTIONS = ["Results", "Training curves", "Confusion matrix", "Sample predictions", "Attention",
                       "Attention explorer", "Configuration"]
TRANSLATION_SECTIONS = ["Results", "Training curves", "Sample translations", "Attention", "Attention explorer",
                        "Configuration"]


def classifier_predictions(run_dir, device="cpu"):
    """What the run's task hands the report: its predictions on the test set."""
    [predictions] = report_items(run_dir, device=device)
    return predictions

DATA = os.environ.get("ATTNLAB_DATA_DIR")
pytestmark = pytest.mark.filterwarnings("ignore:.*were truncated")  # the tiny text runs cut texts at 32 tokens
TINY = [*DIGITS_WITH_VALIDATION, "train.steps=8", "train.warmup_steps=1", "train.batch_size=32", "train.eval_every=4",
        "train.checkpoint_every=4", "train.log_every=2", "train.tensorboard=false", "train.progress=false",
        "model.options.depth=1"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs") / "digits"
    assert main(["train", "vit-digits", *TINY, "--run-dir", str(folder)]) == 0
    return folder


def _png(data: bytes) -> PILImage.Image:
    image = PILImage.open(io.BytesIO(data))
    image.load()
    return image


def _assert_readable_png(data: bytes) -> None:
    image = _png(data)
    assert image.format == "PNG" and image.width > 400
    assert len(np.unique(np.asarray(image.convert("L")))) > 20  # lines, text and antialiasing, not a blank canvas


def _images(page: str) -> list[str]:
    return re.findall(r"<img\b[^>]*\bsrc=\"([^\"]*)\"", page)


def _assert_self_contained(page: str) -> None:
    assert not re.search(r"\b(src|href)\s*=\s*[\"']?\s*(https?:)?//", page, re.I), "a reference outside the file"
    assert not re.search(r"<script\b|<link\b[^>]*stylesheet|@import|(?<![a-z])url\(", page, re.I)  # not toDataURL(
    images = _images(page)
    assert images
    for src in images:
        assert src.startswith("data:image/png;base64,")
        _png(base64.b64decode(src.split(",", 1)[1]))  # decodes to a real PNG


def _headings(page: str) -> list[str]:
    return re.findall(r"<h2>(.*?)</h2>", page)


# ----------------------------------------------------------------------------- curves


def test_curves_are_readable_pngs(run_dir, tmp_path):
    paths = plot_curves(run_dir / "metrics.jsonl", tmp_path)
    assert [p.name for p in paths] == ["loss.png", "accuracy.png", "lr.png", "throughput.png"]
    for path in paths:
        _assert_readable_png(path.read_bytes())


def test_curves_ignore_a_torn_last_line_and_draw_bleu(tmp_path):
    lines = [{"step": s, "kind": "train", "loss": 3.0 / s, "lr": 1e-3, "samples_per_s": 100.0 + s} for s in (1, 2, 3)]
    lines += [{"step": 3, "kind": "eval", "loss": 1.5, "accuracy": 0.4, "bleu": 12.5}]
    text = "".join(json.dumps(r) + "\n" for r in lines) + '{"step": 4, "kind": "tra'  # the process died mid-line
    (tmp_path / "metrics.jsonl").write_text(text)
    paths = plot_curves(tmp_path / "metrics.jsonl", tmp_path / "curves")
    assert sorted(p.stem for p in paths) == ["accuracy", "bleu", "loss", "lr", "throughput"]
    assert not list((tmp_path / "curves").glob(".*"))  # written atomically: no temporary file left
    for path in paths:
        _assert_readable_png(path.read_bytes())


def test_no_logged_values_draw_no_curve(tmp_path):
    assert plot_curves([{"step": 1, "kind": "train", "loss": "nan"}], tmp_path) == []


# ----------------------------------------------------------------------------- the page


def test_training_writes_a_self_contained_report(run_dir, capsys):
    page = (run_dir / "report.html").read_text()
    _assert_self_contained(page)
    assert _headings(page) == CLASSIFIER_SECTIONS
    assert len(_images(page)) >= 6  # four curves, the confusion matrix, the sample images
    results = json.loads((run_dir / "results.json").read_text())
    assert f"{100 * results['test_accuracy']:.2f}%" in page and "vit_digits_patch2" in page
    assert "model.options.depth" in page  # the configuration, by its dotted keys


def test_confusion_matrix_agrees_with_the_results(run_dir):
    p = classifier_predictions(run_dir, device="cpu")
    results = json.loads((run_dir / "results.json").read_text())
    assert len(p.true) == 360 and p.classes == [str(d) for d in range(10)]
    assert p.accuracy == pytest.approx(results["test_accuracy"], abs=1e-12)
    assert len(p.examples) == 12 and tuple(p.examples[0].shape) == (1, 8, 8)
    assert p.shown[0] == 0 and p.shown[-1] == 359  # spread over the test set, not its first dozen


def test_a_failing_attention_drawing_is_a_note_and_its_traceback_goes_to_the_log(run_dir, tmp_path, monkeypatch):
    def visualize_run(*args, **kwargs):
        raise RuntimeError("an index out of range in the drawing")

    monkeypatch.setattr("attnlab.report.html.visualize_run", visualize_run)
    logged = []
    page = write_run_report(run_dir, tmp_path / "r.html", device="cpu", log=logged.append).read_text()
    assert _headings(page) == CLASSIFIER_SECTIONS
    # a bug is said neutrally, never as "this model shows no attention", and never as exception text
    assert "The attention maps could not be drawn: something failed inside attnlab." in page
    assert "RuntimeError" not in page and "an index out of range" not in page and "No attention maps" not in page
    [line] = logged
    assert line.startswith("warning: report.html: the attention maps could not be drawn")
    assert "Traceback" in line and "RuntimeError: an index out of range in the drawing" in line


def test_a_model_without_attention_weights_is_a_sentence_naming_it_and_what_to_train(run_dir, tmp_path,
                                                                                      monkeypatch):
    from attnlab.errors import AttentionUnavailable

    def unavailable(*args, **kwargs):
        raise AttentionUnavailable("run x cannot be visualized", reason="its attention (LinearAttention) never "
                                   "forms the n x n weight matrix", instead="Train it with the exact kind.")

    monkeypatch.setattr("attnlab.report.html.visualize_run", unavailable)
    monkeypatch.setattr("attnlab.report.html.explore", unavailable)
    logged = []
    page = write_run_report(run_dir, tmp_path / "r.html", device="cpu", log=logged.append).read_text()
    assert ("No attention maps for model vit_digits_patch2: its attention (LinearAttention) never forms the n x n "
            "weight matrix. Train it with the exact kind.") in page
    assert "No attention explorer for model vit_digits_patch2: its attention (LinearAttention)" in page
    assert logged == [] and "cannot be visualized" not in page and "Error" not in page


def test_the_configuration_comes_last_folded_and_the_loss_curve_starts_at_step_1(run_dir):
    page = (run_dir / "report.html").read_text()
    config = page[page.index('<section id="configuration">'):]
    assert re.match(r'<section id="configuration">\s*<h2>Configuration</h2>\s*<details><summary>the \d+ settings',
                    config)
    assert "model.options.depth" in config and "<details open" not in page
    assert page.index('id="results"') < page.index('id="training-curves"') < page.index('id="configuration"')
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert steps == [1, 2, 4, 6, 8]  # the untrained loss first, then every train.log_every=2 steps


def test_render_html_escapes_text_and_embeds_images(tmp_path):
    png = tmp_path / "x.png"
    PILImage.new("RGB", (3, 2), (200, 10, 10)).save(png)
    page = render_html("<b>title</b>", [
        Section("A & B", ["<script>alert(1)</script>", Table([("<i>", 1.5)], ("k", "v")), Pre("x < y"),
                          Note("n > m"), Image(png, 'cap "q"')]),
        Section("A & B", []),
    ])
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<h1>&lt;b&gt;title&lt;/b&gt;</h1>" in page and "<td>&lt;i&gt;</td>" in page
    assert '<td class="num">1.5</td>' in page and "<pre>x &lt; y</pre>" in page
    assert 'id="a-b"' in page and 'id="a-b-2"' in page  # two sections, two anchors
    _assert_self_contained(page)
    with pytest.raises(ValueError, match="image must be PNG, JPEG or GIF"):
        render_html("t", [Section("s", [Image(b"not an image")])])


def test_markdown_pipe_tables_become_html_tables():
    text = "### Speed\n\n| kind | ms |\n| --- | ---: |\n| exact | 1.5 |\n| <b> | 2 |\n\n- skipped: `x` at **n**\n"
    out = markdown_to_html(text)
    assert "<h3>Speed</h3>" in out and '<th style="text-align: right">ms</th>' in out
    assert "<td>exact</td>" in out and '<td style="text-align: right">1.5</td>' in out
    assert "<td>&lt;b&gt;</td>" in out and "<li>skipped: <code>x</code> at <strong>n</strong></li>" in out


def test_bench_report_turns_tables_and_plots_into_one_page(tmp_path):
    from matplotlib.figure import Figure

    (tmp_path / "results.json").write_text(json.dumps({"machine": {"cpu": "test cpu", "cores": 2}, "quick": True,
                                                       "scaling": []}))
    (tmp_path / "table.md").write_text("### Times\n\n| variant | 256 |\n| --- | ---: |\n| exact | 1.0 ms |\n")
    for name in ("time.png", "memory.png"):
        fig = Figure(figsize=(6, 3))
        fig.subplots().plot([1, 2, 3], [1, 4, 9])
        fig.savefig(tmp_path / name)
    page = write_bench_report(tmp_path).read_text()
    _assert_self_contained(page)
    assert _headings(page) == ["Machine", "Tables", "Plots"] and len(_images(page)) == 2
    assert "<td>exact</td>" in page and "test cpu" in page and "the figures mean nothing" in page
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "again.html")]) == 0


# ----------------------------------------------------------------------------- the command


def test_report_command_writes_the_page(run_dir, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert main(["report", str(run_dir), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    _assert_self_contained(out.read_text())


@pytest.mark.parametrize("make", [lambda tmp: tmp, lambda tmp: tmp / "missing", lambda tmp: tmp / "file.txt"])
def test_report_command_refuses_what_is_not_a_run(tmp_path, capsys, make):
    (tmp_path / "file.txt").write_text("x")
    assert main(["report", str(make(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "attnlab report: error: RUN_DIR must be a run directory" in err
    assert not (tmp_path / "report.html").exists()


def test_a_failing_report_does_not_lose_the_run(tmp_path, monkeypatch, capsys):
    def broken(run_dir, *args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr("attnlab.report.html.write_run_report", broken)
    run = tmp_path / "run"
    assert main(["train", "vit-digits", *TINY, "train.steps=2", "train.eval_every=0", "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "warning: report.html not written: RuntimeError: disk full" in out
    assert (run / "results.json").is_file() and not (run / "report.html").exists()


# ----------------------------------------------------------------------------- text tasks


@pytest.fixture(scope="module")
def no_attention_drawing():
    """The text runs' reports without attention maps: drawing them is attnlab.viz's to
    test (tests/viz/test_visualize.py), and costs most of these reports' time."""
    def explore(*args, **kwargs):
        raise RuntimeError("not made in these tests")

    with pytest.MonkeyPatch.context() as m:
        m.setattr("attnlab.report.html.visualize_run", lambda *args, **kwargs: [])
        m.setattr("attnlab.report.html.explore", explore)
        yield


MR_TINY = ["model.name=sentiment_transformer_tiny", "model.options={}", "text.vocab_size=1000", "text.max_length=32",
           "train.batch_size=32", "train.warmup_steps=1", "train.log_every=1", "train.progress=false",
           "train.tensorboard=false", "train.steps=4", "train.eval_every=2", "train.checkpoint_every=2"]
needs_mr = pytest.mark.skipif(not DATA or not (Path(DATA) / "mr").is_dir(),
                              reason="MR absent: set ATTNLAB_DATA_DIR to a folder holding mr/ (make test does)")


@pytest.fixture(scope="module")
def mr_run(tmp_path_factory, no_attention_drawing):
    run = tmp_path_factory.mktemp("mr") / "split"
    assert main(["train", "sentiment-mr", *MR_TINY, "--run-dir", str(run)]) == 0
    return run


@needs_mr
def test_sentiment_report_has_a_confusion_matrix_and_sentences(mr_run):
    page = (mr_run / "report.html").read_text()
    _assert_self_contained(page)
    assert _headings(page) == CLASSIFIER_SECTIONS
    assert "<th>test input</th>" in page and page.count("<td>positive</td>") + page.count("<td>negative</td>") >= 12
    assert "No attention maps: the drawing returned none" in page
    p = classifier_predictions(mr_run, device="cpu")
    results = json.loads((mr_run / "results.json").read_text())
    assert len(p.true) == 1066 and p.accuracy == pytest.approx(results["test_accuracy"], abs=1e-12)
    assert {p.true[i] for i in p.shown} == {0, 1}  # the test part lists one class first: both are shown


@needs_mr
def test_cross_validation_report_pools_the_folds(mr_run, tmp_path, no_attention_drawing):
    """The top folder of a 10-fold run: every fold's curves, and one confusion matrix of
    every sentence, each predicted by the fold that held it out. Two folds are faked from
    the split run (the report reads folders; how their weights were trained is no matter)."""
    import yaml

    from attnlab.data.readers.mr import load_mr, mr_folds

    top = tmp_path / "cv"
    config = yaml.safe_load((mr_run / "config.yaml").read_text())
    config["data"]["protocol"] = "cv10"
    for k in (0, 1):
        shutil.copytree(mr_run, top / f"fold_{k}")
    for folder in (top, top / "fold_0", top / "fold_1"):
        (folder / "config.yaml").write_text(yaml.safe_dump(config))
    (top / "fold_0" / "report.html").unlink()
    page = write_run_report(top, device="cpu").read_text()
    _assert_self_contained(page)
    assert _headings(page) == CLASSIFIER_SECTIONS and "10-fold cross-validation" in page
    assert "training loss (solid)" in page and "No results.json yet" in page  # the folds are still running
    p = classifier_predictions(top, device="cpu")
    folds = mr_folds(load_mr(DATA)[1], 10, seed=config["data"]["seed"])
    assert len(p.true) == len(folds[0][1]) + len(folds[1][1]) and "each of the 2 folds" in p.weights


@pytest.fixture(scope="module")
def mini_multi30k(tmp_path_factory):
    """The first 200 / 10 / 10 pairs of Multi30k, in the data directory layout."""
    import gzip

    from attnlab.data.readers.multi30k import load_multi30k

    if not DATA or not (Path(DATA) / "multi30k").is_dir():
        pytest.skip("Multi30k absent: set ATTNLAB_DATA_DIR to a folder holding multi30k/")
    root = tmp_path_factory.mktemp("data")
    (root / "multi30k").mkdir()
    for split, prefix, n in (("train", "train", 200), ("val", "val", 10), ("test", "test_2016_flickr", 10)):
        pairs = load_multi30k(split, DATA)[:n]
        for lang, side in (("de", 0), ("en", 1)):
            with gzip.open(root / "multi30k" / f"{prefix}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("".join(p[side] + "\n" for p in pairs))
    return root


def test_translation_report_shows_sources_references_and_translations(mini_multi30k, tmp_path, no_attention_drawing):
    import html

    from attnlab.data.readers.multi30k import load_multi30k

    run = tmp_path / "tr"
    assert main(["train", "translate-multi30k", "--run-dir", str(run), f"data.data_dir={mini_multi30k}",
                 "model.name=transformer_tiny", "model.options={}", "text.vocab_size=500", "text.max_length=32",
                 "train.batch_size=16", "train.steps=4", "train.warmup_steps=1", "train.log_every=1",
                 "train.progress=false", "train.tensorboard=false", "train.eval_every=2", "train.checkpoint_every=2",
                 "translate.average_checkpoints=2", "translate.num_beams=2"]) == 0
    page = (run / "report.html").read_text()
    _assert_self_contained(page)
    assert _headings(page) == TRANSLATION_SECTIONS
    assert "<th>source</th><th>reference</th><th>translation</th>" in page
    source, reference = load_multi30k("test", mini_multi30k)[0]
    hypothesis = (run / "translations.test.txt").read_text(encoding="utf-8").splitlines()[0]
    row = f"<td>{html.escape(source)}</td><td>{html.escape(reference)}</td><td>{html.escape(hypothesis)}</td>"
    assert row in page
    assert "<td>bleu</td>" in page  # the report is written after BLEU joined results.json


# ----------------------------------------------------------------------------- in a browser

def _look(driver, page: Path) -> dict:
    """Open ``page`` as a person would; what loaded, what the console said, a screenshot."""
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(page.resolve().as_uri())
    state = driver.execute_script("""
        return {ready: document.readyState,
                images: Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.alt]),
                height: document.body.scrollHeight};""")
    state["errors"] = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    state["screenshot"] = _png(driver.get_screenshot_as_png())
    return state


def test_report_renders_in_a_browser(browser, run_dir):
    state = _look(browser, run_dir / "report.html")
    assert state["ready"] == "complete" and state["errors"] == []
    assert len(state["images"]) >= 6
    for complete, width, alt in state["images"]:
        assert complete and width > 0, f"image {alt!r} did not load"
    shot = state["screenshot"].convert("L")
    assert shot.width >= 1000 and len(np.unique(np.asarray(shot))) > 20  # text and figures, not a blank page
    assert state["height"] > 2000  # every section laid out, not just the title
    # the attention explorer, in its frame, runs its script under the report's policy
    from selenium.webdriver.support.ui import WebDriverWait

    frame = browser.find_element("css selector", "iframe.explorer")
    window = browser.execute_script("return document.documentElement.clientWidth")
    assert frame.size["width"] > 1100 and frame.size["width"] >= window - 60  # the window's width, less margins
    left = frame.location["x"]
    assert 0 < left < 40 and left + frame.size["width"] <= window  # and within it: no sideways scrolling
    browser.switch_to.frame(frame)
    try:
        WebDriverWait(browser, 30).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
        assert browser.execute_script("return document.querySelectorAll('.tok-left').length") > 0
        # at the window's width (not the text's 1,100 px column), its head view's lines spread over it: the
        # frame may start at a browser's default 300 px and take its width a moment later, which redraws it
        WebDriverWait(browser, 10).until(lambda d: int(d.execute_script(
            "return document.getElementById('head-svg').getAttribute('width')")) > 600)
    finally:
        browser.switch_to.default_content()
    assert [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_the_browser_check_sees_a_broken_page(browser, tmp_path):
    """The check above can fail: a broken image and a blocked external reference are caught."""
    page = tmp_path / "broken.html"
    html = render_html("broken", [Section("s", ["text"])])
    page.write_text(html.replace("</body>", '<img alt="bad" src="data:image/png;base64,AAAA">'
                                            '<img alt="far" src="https://example.invalid/x.png"></body>'))
    state = _look(browser, page)
    assert [(c and w > 0) for c, w, _ in state["images"]] == [False, False]
    assert state["errors"]  # the policy refused the outside image, and said so


# ---------------------------------------------------------------------------- a damaged results.json


@pytest.mark.parametrize("content", ["", "[1, 2]", "{not json"])
def test_a_bad_results_json_does_not_stop_the_report(digits_run, tmp_path, capsys, content):
    run = digits_run
    (run / "results.json").write_text(content)
    assert main(["report", str(run)]) == 0
    assert "results.json could not be read" in (run / "report.html").read_text()
