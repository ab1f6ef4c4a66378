"""Sentence-transformers folders and packaged models: what a careless or hostile folder, zip or
name gets (one line naming the file or the name)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from attnlab.errors import InputError
from attnlab.formats.packaged import _extracted, packaged_model, resolve_packaged
from attnlab.formats.sentence import SentenceEncoder


def test_a_sentence_folder_without_modules_or_pooling_is_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="modules.json"):
        SentenceEncoder.load(tmp_path)
    (tmp_path / "modules.json").write_text(json.dumps({"not": "a list"}))
    with pytest.raises(InputError, match="must hold a list of modules"):
        SentenceEncoder.load(tmp_path)
    (tmp_path / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(InputError, match="Dense"):
        SentenceEncoder.load(tmp_path)
    (tmp_path / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Transformer"}]))
    with pytest.raises(InputError, match="no Pooling module"):
        SentenceEncoder.load(tmp_path)
    (tmp_path / "modules.json").write_bytes(b"\xff\xfe not json")
    with pytest.raises(InputError) as caught:
        SentenceEncoder.load(tmp_path)
    assert "\n" not in str(caught.value)


def test_a_zip_member_outside_its_folder_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("../escape.txt", "x")
    with pytest.raises(InputError, match="outside its folder"):
        _extracted(archive, tmp_path / "out")
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "out").exists()


def test_a_packaged_name_is_checked_and_a_path_of_that_name_wins(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(InputError, match="must be a packaged model"):
        packaged_model("no-such-model")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2-135m-instruct").mkdir()  # a folder of one's own of that name is taken as it is
    assert resolve_packaged("smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert resolve_packaged("anything/else") == "anything/else"


@pytest.mark.parametrize("typed, meant", [("smolm2-135m-instruct", "smollm2-135m-instruct"),
                                          ("SmolLM2-135M-Instruct", "smollm2-135m-instruct"),
                                          ("gemma3-270", "gemma3-270m"), ("all-minilm-l6", "all-minilm-l6-v2")])
def test_a_misspelt_packaged_name_is_told_the_right_one(typed: str, meant: str, tmp_path: Path, monkeypatch,
                                                         capsys) -> None:
    from attnlab.cli import main

    monkeypatch.chdir(tmp_path)  # no file or folder of that name here
    with pytest.raises(InputError, match=f"did you mean {meant}\\?"):
        resolve_packaged(typed)
    assert main(["generate", typed, "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{typed} is neither a file, a folder nor a packaged model" in err
    assert resolve_packaged("runs/my-run") == "runs/my-run" and resolve_packaged("gpt2") == "gpt2"  # not close: as given
