"""What ``attnlab export`` of a classifier refuses before any work, in one line: an ``--out`` below a
file or that is a folder, an export over an earlier one without ``--force``; a full disk leaves
no file and keeps the earlier export whole."""

from __future__ import annotations

from attnlab.cli import main

from refusals import capped_cli, one_line


def test_export_over_an_existing_file_needs_force(digits_run, tmp_path, capsys):
    out = tmp_path / "digits.pt"
    assert main(["export", str(digits_run), "--format", "torchscript", "--out", str(out)]) == 0
    first = out.read_bytes()
    capsys.readouterr()
    assert main(["export", str(digits_run), "--format", "torchscript", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out}, {tmp_path / 'digits.preprocessing.json'} exist already; pass --force" in err
    assert out.read_bytes() == first
    assert main(["export", str(digits_run), "--format", "torchscript", "--out", str(out), "--force"]) == 0


def test_an_export_below_a_file_is_refused_naming_out_before_any_work(digits_run, tmp_path, capsys):
    existing = tmp_path / "existing.onnx"
    existing.write_bytes(b"an earlier export")
    for out in (existing / "sub.onnx", existing / "a" / "b"):
        # a run that does not exist: the --out check comes first, before the run is loaded
        assert main(["export", str(tmp_path / "no-run"), "--out", str(out)]) == 2
        line = one_line(capsys.readouterr().err)
        assert f"--out {out}: {existing} is a file, not a folder" in line and "choose another --out" in line
        assert main(["export", str(digits_run), "--out", str(out)]) == 2
        one_line(capsys.readouterr().err)
    assert existing.read_bytes() == b"an earlier export" and sorted(p.name for p in tmp_path.iterdir()) == \
        ["existing.onnx", "run"]
    (tmp_path / "folder.onnx").mkdir()
    assert main(["export", str(digits_run), "--out", str(tmp_path / "folder.onnx")]) == 2
    assert f"--out {tmp_path / 'folder.onnx'} is a folder; give a .onnx file" in one_line(capsys.readouterr().err)


def test_an_export_onto_a_full_disk_leaves_no_file_and_keeps_an_earlier_export(text_run, tmp_path):
    out = tmp_path / "export" / "model.pt"
    done = capped_cli("export", str(text_run), "--format", "torchscript", "--out", str(out), fsize=20_000)
    assert done.returncode == 1, done.stderr
    line = one_line(done.stderr)
    assert line.startswith(f"attnlab export: error: could not write {out} (") and "File too large" in line
    # the tokenizer (a few KB) and the preprocessing.json would fit: none of the three files is left, nor a
    # temporary one
    assert not out.parent.exists() or not list(out.parent.iterdir())
    assert capped_cli("export", str(text_run), "--format", "torchscript", "--out", str(out)).returncode == 0
    before = {p.name: p.read_bytes() for p in out.parent.iterdir()}
    assert sorted(before) == ["model.preprocessing.json", "model.pt", "model.tokenizer.json"]
    done = capped_cli("export", str(text_run), "--format", "torchscript", "--out", str(out), "--force", fsize=20_000)
    assert done.returncode == 1 and "could not write" in one_line(done.stderr)
    assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == before  # the earlier export, whole
