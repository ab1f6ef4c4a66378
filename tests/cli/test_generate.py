"""``attnlab generate`` (and ``predict``, ``explore``) as users of other tools type them:
--max_new_tokens for --max-new-tokens, arguments after ``--`` kept as they are, ``-`` for
standard input; a prompt that is not UTF-8, or past the limit on standard input, is refused in
one line."""

import io

import pytest

from attnlab.cli import main

from test_language_modeling import TEXT, TINY


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm")
    (tmp / "story.txt").write_text(TEXT, encoding="utf-8")
    run_dir = tmp / "run"
    assert main(["train", "lm-text", f"data.path={tmp / 'story.txt'}", *TINY, "text.tokenizer=byte", "--run-dir",
                 str(run_dir)]) == 0
    return run_dir


def stdin_bytes(monkeypatch, data: bytes):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_underscores_in_long_options_are_dashes(lm_run, capsys):
    capsys.readouterr()
    assert main(["generate", str(lm_run), "the cat", "--max-new-tokens", "6", "--temperature", "0"]) == 0
    dashed = capsys.readouterr().out
    assert main(["generate", str(lm_run), "the cat", "--max_new_tokens", "6", "--temperature=0"]) == 0
    assert capsys.readouterr().out == dashed
    assert main(["generate", str(lm_run), "the cat", "--max_new_tokens=6", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == dashed


def test_arguments_after_a_double_dash_keep_their_underscores(lm_run, capsys):
    capsys.readouterr()
    assert main(["generate", str(lm_run), "--max-new-tokens", "2", "--temperature", "0", "--", "--the_cat"]) == 0
    assert capsys.readouterr().out.startswith("--the_cat")


def test_a_dash_prompt_is_standard_input(lm_run, capsys, monkeypatch):
    capsys.readouterr()
    assert main(["generate", str(lm_run), "the cat sat\non the", "--max-new-tokens", "5", "--temperature", "0"]) == 0
    given = capsys.readouterr().out
    stdin_bytes(monkeypatch, b"the cat sat\non the\n")
    assert main(["generate", str(lm_run), "-", "--max-new-tokens", "5", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == given


def test_a_prompt_that_is_not_utf8_is_refused_in_one_line(lm_run, capsys, monkeypatch):
    stdin_bytes(monkeypatch, b"the \xff cat\n")
    assert main(["generate", str(lm_run), "-"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "attnlab generate: error: PROMPT -: standard input is not valid UTF-8 (at byte 4)"
    assert main(["generate", str(lm_run), b"the \xff".decode("utf-8", "surrogateescape")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab generate: error: PROMPT is not valid UTF-8 (byte 0xff at character 4)")
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_prompt_past_the_limit_on_standard_input_is_refused_unread(lm_run, capsys, monkeypatch):
    from attnlab.limits import MAX_LINE_CHARS

    stdin_bytes(monkeypatch, b"a" * (4 * MAX_LINE_CHARS + 10))
    assert main(["generate", str(lm_run), "-"]) == 2
    assert "standard input holds more than 4,000,002 bytes" in capsys.readouterr().err


def test_a_dash_among_predict_inputs_is_standard_input(lm_run, capsys, monkeypatch):
    capsys.readouterr()
    stdin_bytes(monkeypatch, b"the dog\nthe owl\n")
    assert main(["predict", str(lm_run), "the cat", "-", "the fox"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4


def test_a_dash_explore_input_is_standard_input(lm_run, capsys, monkeypatch, tmp_path):
    stdin_bytes(monkeypatch, b"the dog sat\n\nthe owl looked\n")
    assert main(["explore", str(lm_run), "-", "--new-tokens", "2", "--out", str(tmp_path / "page.html")]) == 0
    assert "2 inputs" in capsys.readouterr().out
    stdin_bytes(monkeypatch, b"\xfe\n")
    assert main(["explore", str(lm_run), "-", "--out", str(tmp_path / "other.html")]) == 2
    assert capsys.readouterr().err.strip() == ("attnlab explore: error: INPUT -: standard input is not valid UTF-8 "
                                               "(at byte 0)")
