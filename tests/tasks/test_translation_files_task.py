"""Your own parallel text: line-aligned files (plain or gzipped) or a TSV, any language codes, held-out splits."""

import gzip
import json

import pytest

import attnlab
from attnlab.cli import main
from attnlab.errors import InputError
from attnlab.recipes import load_recipe
from attnlab.tasks import recipe_dict
from attnlab.data.source import source_of

WORDS = {"un": "one", "deux": "two", "trois": "three", "chat": "cat", "chien": "dog", "rouge": "red", "vert": "green"}


def pairs(n, seed=0):
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(list(WORDS)) for _ in range(rng.randint(2, 5))]
        out.append((" ".join(words), " ".join(WORDS[w] for w in words)))
    return out


def write(folder, split, data, src="xx", tgt="yy", gz=False):
    folder.mkdir(parents=True, exist_ok=True)
    for lang, side in ((src, 0), (tgt, 1)):
        text = "\n".join(p[side] for p in data) + "\n"
        if gz:
            with gzip.open(folder / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write(text)
        else:
            (folder / f"{split}.{lang}").write_text(text, encoding="utf-8")
    return folder


def file_splits(data):
    """The parts of the parallel-files source, by name, and how many pairs it skipped."""
    splits = source_of(data).load(data)
    return {"train": splits.train, "val": splits.val, "test": splits.test}, splits.skipped


def data(root, *overrides):
    return load_recipe("translation-files", [f"data.root={root}", "data.source=xx", "data.target=yy",
                                             *overrides]).data


def test_one_pair_of_files_is_split_at_random_but_reproducibly(tmp_path):
    write(tmp_path / "c", "train", pairs(100), gz=True)
    splits, skipped = file_splits(data(tmp_path / "c", "data.val_size=10", "data.test_size=0.2"))
    assert [len(splits[k]) for k in ("train", "val", "test")] == [70, 10, 20] and skipped == 0
    assert set(splits["train"]) | set(splits["val"]) | set(splits["test"]) == set(pairs(100))
    assert file_splits(data(tmp_path / "c", "data.val_size=10", "data.test_size=0.2"))[0] == splits


def test_val_and_test_files_and_a_tsv_are_read_as_they_are(tmp_path):
    write(tmp_path / "c", "train", pairs(30))
    write(tmp_path / "c", "val", pairs(4, 1))
    (tmp_path / "c" / "test.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs(6, 2)), encoding="utf-8")
    splits, _ = file_splits(data(tmp_path / "c"))
    assert [len(splits[k]) for k in ("train", "val", "test")] == [30, 4, 6]
    assert splits["test"] == pairs(6, 2)


def test_lines_that_do_not_pair_up_are_one_error_naming_both_files(tmp_path):
    folder = write(tmp_path / "c", "train", pairs(10))
    (folder / "train.yy").write_text("just one line\n")
    with pytest.raises(InputError, match=r"train\.xx has 10 lines but .*train\.yy has 1"):
        file_splits(data(folder))
    run = tmp_path / "run"
    assert main(["train", "translation-files", f"data.root={folder}", "data.source=xx", "data.target=yy",
                 "--run-dir", str(run)]) == 2
    assert not run.exists()  # named before a run directory was made


def test_blank_sides_are_an_error_or_skipped_and_counted(tmp_path):
    data_ = pairs(20)
    data_[4] = ("", data_[4][1])
    folder = write(tmp_path / "c", "train", data_)
    with pytest.raises(InputError, match=r"line 5"):
        file_splits(data(folder))
    splits, skipped = file_splits(data(folder, "data.skip_blank=true"))
    assert skipped == 1 and sum(map(len, splits.values())) == 19


def test_settings_that_do_not_fit_their_data_are_refused():
    with pytest.raises(InputError, match="data.source must be one of 'de', 'en', 'fr', 'cs' for multi30k"):
        load_recipe("translate-multi30k", ["data.source=xx"])
    with pytest.raises(InputError, match="data.root applies to data.name=files"):
        load_recipe("translate-multi30k", ["data.root=corpus"])
    assert "root" not in recipe_dict(load_recipe("translate-multi30k"))["data"]
    with pytest.raises(InputError, match="data.root must name a folder of parallel files"):
        file_splits(load_recipe("translation-files").data)


def test_a_files_run_trains_translates_and_evaluates_pairs_of_ones_own(tmp_path, capsys):
    folder = write(tmp_path / "c", "train", pairs(300))
    run_dir = tmp_path / "run"
    assert main(["train", "translation-files", f"data.root={folder}", "data.source=xx", "data.target=yy",
                 "model.name=transformer_tiny", "model.options={}", "text.vocab_size=300", "text.min_frequency=1",
                 "train.steps=30", "train.batch_size=32", "train.warmup_steps=5", "train.eval_every=15",
                 "train.checkpoint_every=10", "translate.average_checkpoints=2", "train.log_every=0",
                 "train.progress=false", "--run-dir", str(run_dir)]) == 0
    results = json.loads((run_dir / "results.json").read_text())
    run = attnlab.load_run(run_dir)
    again = run.evaluate()
    assert again["bleu"] == results["bleu"] and again["test_accuracy"] == results["test_accuracy"]
    [out] = run.translate(["un chat rouge"])
    assert isinstance(out, str)
    tsv = tmp_path / "mine.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in pairs(5, 7)), encoding="utf-8")
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--data", str(tsv)]) == 0
    assert "| test samples | 5 |" in capsys.readouterr().out
