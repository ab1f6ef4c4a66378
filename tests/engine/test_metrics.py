"""metrics.jsonl: appended records, torn lines tolerated, resume drops what comes after."""

import pytest
import torch

from attnlab.engine.metrics import MetricsLog, read_metrics
from attnlab.errors import InputError

from conftest import train_digits


def test_records_are_appended_as_json_lines(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    with MetricsLog(path) as log:
        log.log(1, loss=torch.tensor(0.5), lr=1e-3)
        log.log(2, kind="eval", accuracy=0.9, bad=float("nan"))
    records = read_metrics(path)
    assert [(r["step"], r["kind"]) for r in records] == [(1, "train"), (2, "eval")]
    assert records[0]["loss"] == 0.5 and records[1]["accuracy"] == 0.9 and records[1]["bad"] == "nan"


def test_torn_last_line_is_ignored_but_a_bad_middle_line_is_an_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsLog(path) as log:
        log.log(1, loss=1.0)
    with path.open("a") as f:
        f.write('{"step": 2, "lo')
    assert [r["step"] for r in read_metrics(path)] == [1]
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2 is not a JSON record"):
        read_metrics(path)


def test_resume_drops_records_after_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsLog(path) as log:
        for step in range(1, 8):
            log.log(step, loss=1.0 / step)
    with MetricsLog.open(path, resume_step=4) as log:
        log.log(5, loss=0.1)
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4, 5]


# ---------------------------------------------------------------------------- damaged lines


def test_binary_garbage_in_metrics_jsonl_is_named_on_resume_before_anything_is_written(digits_run, capsys):
    lines = (digits_run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    (digits_run / "metrics.jsonl").write_bytes(lines[0] + b"\xff\xfe\x00garbage\n" + b"".join(lines[1:]))
    assert train_digits(digits_run, "train.steps=6", "--resume", "--allow-changes") == 2
    err = capsys.readouterr().err
    assert "metrics.jsonl: line 2 is not a JSON record" in err and "move it aside" in err
    assert "Traceback" not in err and not (digits_run / "config.changes.yaml").exists()


def test_a_metrics_line_nested_too_deep_is_a_damaged_line_not_a_crash(tmp_path):
    from attnlab.engine.metrics import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "train", "step": 1, "loss": 2.0}\n' + "[" * 5000 + "]" * 5000 + "\n"
                    '{"kind": "train", "step": 2, "loss": 1.0}\n')
    with pytest.raises(InputError, match=r"metrics.jsonl: line 2 is not a JSON record \(the file is damaged"):
        read_metrics(path)  # (Python's parser alone raises a RecursionError here)
