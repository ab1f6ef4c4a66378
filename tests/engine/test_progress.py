"""Progress output: a bar on a terminal, short plain lines in logs."""

import io

from attnlab.engine.progress import Progress, format_seconds


def test_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    with Progress(100, stream=out, every=0.0, unit="img") as p:
        for _ in range(3):
            p.update(1, 32, loss=0.5)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # every=0: one per update; closing adds none, step 3 was just printed
    assert lines[-1].startswith("train step 3/100  loss 0.5  ") and "img/s" in lines[-1] and "eta " in lines[-1]
    assert "\r" not in out.getvalue()


def test_plain_lines_are_throttled():
    out = io.StringIO()
    with Progress(1000, stream=out, every=3600.0) as p:
        for _ in range(500):
            p.update(1, 8, loss=1.0)
    assert len(out.getvalue().splitlines()) == 1  # only the closing line


def test_bar_on_a_terminal():
    out = io.StringIO()
    with Progress(10, stream=out, tty=True, desc="fit") as p:
        p.update(5, 40, loss=0.25)
    text = out.getvalue()
    assert "fit" in text and "5/10" in text
    assert "loss 0.25" in text


def test_resume_counts_from_the_start_step():
    out = io.StringIO()
    p = Progress(100, stream=out, every=0.0, start_step=40)
    p.update(10, 0)
    assert p.step == 50 and out.getvalue().splitlines()[-1].startswith("train step 50/100")


def test_format_seconds():
    assert format_seconds(59) == "0:59" and format_seconds(3661) == "1:01:01"


def test_a_slow_rate_keeps_its_digits_and_says_seconds_a_step(monkeypatch):
    import attnlab.engine.progress as progress

    clock = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    out = io.StringIO()
    p = Progress(2000, stream=out, every=0.0, unit="samples")
    clock[0] += 30.0  # one step of 4 samples in 30 s: 0.13 samples/s, not "0"
    p.update(1, 4, loss=2.0)
    line = out.getvalue().splitlines()[-1]
    assert "0.13 samples/s (30.0 s/step)" in line and "eta 16:39:30" in line


def test_the_eta_ends_with_the_time_budget(monkeypatch):
    """train.max_minutes=3: the run stops in minutes, whatever the steps left would take."""
    import attnlab.engine.progress as progress

    clock = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    for tty in (False, True):
        out = io.StringIO()
        p = Progress(2000, stream=out, every=0.0, tty=tty, budget=180.0)
        clock[0] += 30.0
        p.update(1, 4, loss=2.0)
        if p._bar is not None:
            p._bar.refresh()
        assert "eta 2:30" in out.getvalue() and "16:39" not in out.getvalue(), out.getvalue()
        p.close()
