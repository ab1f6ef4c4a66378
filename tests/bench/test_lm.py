"""``attnlab bench lm``: generation with and without the cache, cache memory by attention
kind, and length extrapolation, at quick sizes (the figures of a quick run mean nothing;
what is tested is that each part measures what it says and resumes)."""

from __future__ import annotations

import json
import math
import os

import pytest

from attnlab.bench.lm import CACHE_VARIANTS, QUICK, extrapolation_point
from attnlab.cli import main


def test_cli_bench_lm_generation_and_cache_quick_and_resumed(tmp_path, capsys):
    out = tmp_path / "lm"
    assert main(["bench", "lm", "--quick", "--parts", "generation,cache", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "results.json").read_text())
    assert [r["batch"] for r in data["generation"].values()] == list(QUICK["batches"])
    assert all(r["cache_speedup"] > 0 and math.isfinite(r["cached_tokens_per_s"]) for r in data["generation"].values())
    assert list(data["cache"]) == list(CACHE_VARIANTS)
    for record in data["cache"].values():  # the bytes are the formula's, and a window's stay flat
        assert all(p["cache_bytes"] == p["expected_bytes"] for p in record["points"])
        sizes = {p["cache_bytes"] for p in record["points"]}
        assert len(sizes) == (1 if record["window"] else len(QUICK["lengths"]))
    mha, gqa = data["cache"]["multi-head"]["points"][-1], data["cache"]["grouped-query"]["points"][-1]
    assert mha["cache_bytes"] == 4 * gqa["cache_bytes"]  # 8 key/value heads against 2
    assert "| multi-query |" in printed and (out / "table.md").read_text() in printed
    mtime = os.path.getmtime(out / "results.json")
    assert main(["bench", "lm", "--quick", "--parts", "cache", "--out", str(out)]) == 0  # kept, not measured again
    assert json.loads((out / "results.json").read_text())["cache"] == data["cache"] and \
        os.path.getmtime(out / "results.json") >= mtime
    assert main(["bench", "lm", "--parts", "cache", "--out", str(out)]) == 2  # quick results are not full ones
    assert "holds quick results" in capsys.readouterr().err
    assert main(["bench", "lm", "--parts", "speed", "--out", str(out)]) == 2
    assert "--parts takes a comma-separated list of generation, cache, extrapolation, kinds, streaming, kinds_long" in capsys.readouterr().err


def _need_shakespeare() -> None:
    if not (os.environ.get("ATTNLAB_DATA_DIR") and
            os.path.isfile(os.path.join(os.environ["ATTNLAB_DATA_DIR"], "tinyshakespeare", "input.txt"))):
        pytest.skip("Tiny Shakespeare absent: set ATTNLAB_DATA_DIR to a folder holding tinyshakespeare/ (make test does)")


def test_extrapolation_point_trains_once_and_scores_every_window(tmp_path):
    _need_shakespeare()
    settings = dict(steps=QUICK["steps"], batch_size=QUICK["batch_size"], context=QUICK["context"],
                    windows=(32, 64, 128), model=QUICK["model"])
    first = extrapolation_point("alibi", tmp_path / "alibi", **settings)
    assert first["windows"] == [32, 64, 128] and all(math.isfinite(v) for v in first["val_loss"])
    mtime = os.path.getmtime(tmp_path / "alibi" / "results.json")
    assert extrapolation_point("alibi", tmp_path / "alibi", **settings) == first  # scored again, not retrained
    assert os.path.getmtime(tmp_path / "alibi" / "results.json") == mtime


@pytest.mark.long  # trains every kind for its time budget: `make test-long` and CI
def test_kind_point_trains_each_kind_for_the_budget_and_measures_its_cache(tmp_path):
    """The hybrid and plain multi-head attention with a budget of two calibrated steps: the steps
    follow the budget, the cache of the hybrid is its full layer's per token plus its gated
    delta layers' fixed states, and the decoding speed is measured at each length."""
    from attnlab.bench.lm import KINDS, _seconds_per_step, kind_point, lm_markdown

    _need_shakespeare()
    data_dir = os.environ.get("ATTNLAB_DATA_DIR")
    train = ("train.batch_size=2", "text.context=16", "model.options.embed_dim=32", "model.options.mlp_hidden_dim=64")
    step = _seconds_per_step(train, tmp_path / "calibration", 2, data_dir)
    assert step > 0 and not (tmp_path / "calibration").exists()
    rows = {}
    for name in ("multi-head", "3:1 hybrid"):
        rows[name] = kind_point(name, tmp_path / name.replace(":", "to").replace(" ", "-"), (*KINDS[name], *train),
                                steps=3, budget=3 * step, lengths=(8, 12), prompt=4, data_dir=data_dir)
    mha, hybrid = rows["multi-head"], rows["3:1 hybrid"]
    assert mha["steps"] == hybrid["steps"] == 3 and math.isfinite(mha["val_loss"])
    assert (mha["context"], mha["batch_size"]) == (16, 2)
    assert mha["cache_bytes_per_token"] == 2 * 4 * 32 * 4 and mha["cache_bytes_fixed"] == 0  # 4 layers of k and v
    assert hybrid["cache_bytes_per_token"] == 2 * 32 * 4 and hybrid["cache_bytes_fixed"] > 0  # one full layer
    assert [p["new_tokens"] for p in hybrid["decoding"]] == [8, 12]
    from attnlab.bench.machine import machine_info

    from attnlab.bench.lm import streaming_point

    streamed = streaming_point(tmp_path / "multi-head", factor=3, sinks=2)  # context 16: 48 tokens read
    whole, window, sinks = streamed["rows"].values()
    assert streamed["tokens"] == 48 and sinks["cache_bytes"] > window["cache_bytes"]  # the sinks kept besides
    assert whole["loss_within"] == pytest.approx(window["loss_within"], abs=1e-5)  # alike until the window slides
    assert window["loss_past"] != sinks["loss_past"]
    table = lm_markdown({"machine": machine_info("cpu"), "quick": True, "threads": 1, "kinds": rows,
                         "streaming": {"multi-head": streamed}})
    again = kind_point("multi-head", tmp_path / "multi-head-seed1", train, steps=3, budget=3 * step, lengths=(),
                       prompt=4, data_dir=data_dir, seed=1)
    assert again["decoding"] == [] and again["val_loss"] != mha["val_loss"]  # other weights, no decoding timed
    table_seeds = lm_markdown({"machine": machine_info("cpu"), "quick": True, "threads": 1, "kinds": rows,
                               "kinds_seed": {"multi-head": again}})
    assert f"| {mha['val_loss']:.4f} / {again['val_loss']:.4f} |" in table_seeds
    assert "| 3:1 hybrid | 3 |" in table and "B/token +" in table and "| window of 16 + 2 sink tokens |" in table


def test_the_calibration_times_the_steps_after_the_warm_up(tmp_path, monkeypatch):
    """The training logs steps 1, n and 2n: a step's time is that of the last n, not of the
    2n - 1 since step 1 (which made every kind's calibration twice its rate)."""
    import attnlab.bench.lm as lm
    import attnlab.tasks as tasks

    clock = [0.0]

    def fake_train(recipe, folder, log):
        folder.mkdir(parents=True)
        for step, at in ((1, 0.0), (3, 10.0), (6, 13.0)):
            clock[0] = at
            log(f"step {step}/6  loss 1.0000  lr 0.001  100 samples/s")
            log(f"step {step}/6  eval loss 1.0")  # not a step's log

    monkeypatch.setattr(tasks, "train", fake_train)
    monkeypatch.setattr(lm.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(lm, "_kind_recipe", lambda *a: None)
    assert lm._seconds_per_step((), tmp_path / "calibration", 3, None) == 1.0
    assert not (tmp_path / "calibration").exists()


def test_kinds_part_retrains_a_kind_whose_time_missed_the_budget_and_seeds_close_kinds(tmp_path, monkeypatch):
    """The decisions of the kinds part, with training replaced by a stand-in whose step times
    differ from the calibration's: multi-head sets the budget by its measured time; a kind
    that took 50% longer is trained once more at its own measured rate; kinds ending closer
    than SEED_GAP to another get a second seed with the same steps, and only they."""
    import attnlab.bench.lm as lm

    calibrated = {name: 0.1 for name in lm.KINDS}
    true_rate = {**calibrated, "multi-head": 0.12, "sinks": 0.15}  # sinks: 50% slower than calibrated
    val = {name: 1.5 + 0.1 * i for i, name in enumerate(lm.KINDS)}  # 0.1 apart...
    val["multi-query"] = val["multi-head"] + 0.01  # ...but these two
    calls = []

    def fake_point(name, folder, overrides, *, steps, budget, lengths, prompt, data_dir=None, seed=0):
        folder.mkdir(parents=True, exist_ok=True)
        calls.append((name, steps, seed))
        assert tuple(overrides) == (*lm.KINDS[name], *QUICK["kinds_train"])
        return {"kind": name, "seed": seed, "steps": steps, "budget_s": budget,
                "train_seconds": steps * true_rate[name], "val_loss": val[name] + seed * 0.001, "decoding": []}

    kinds_of = {tuple((*o, *QUICK["kinds_train"])): name for name, o in lm.KINDS.items()}
    monkeypatch.setattr(lm, "kind_point", fake_point)
    monkeypatch.setattr(lm, "_seconds_per_step", lambda overrides, *a: calibrated[kinds_of[tuple(overrides)]])
    monkeypatch.setattr(lm, "lm_markdown", lambda data: "")
    data = lm.run_lm(tmp_path, parts=["kinds"], quick=True, log=lambda line: None)
    shipped = 4  # QUICK's train.steps
    budget = shipped * 0.12
    assert data["kinds"]["multi-head"]["steps"] == shipped
    assert data["kinds"]["sinks"]["steps"] == round(budget / 0.15) and data["kinds"]["sinks"]["retrained"]
    assert [c for c in calls if c[0] == "sinks"] == [("sinks", round(budget / 0.1), 0), ("sinks", 3, 0)]
    assert not data["kinds"]["latent (kv_rank 64)"]["retrained"]
    assert sorted(data["kinds_seed"]) == ["multi-head", "multi-query"]
    assert data["kinds_seed"]["multi-query"]["steps"] == data["kinds"]["multi-query"]["steps"]
    calls.clear()
    lm.run_lm(tmp_path, parts=["kinds"], quick=True, log=lambda line: None)
    assert calls == []  # resumed: everything kept


def test_long_context_part_trains_the_long_kinds_for_the_recipes_time_at_its_own_context(tmp_path, monkeypatch):
    """kinds_long: the recipe at its own context (multi-head, context 32 when quick) sets the
    budget; every long kind is trained at the long context for that time (steps from its own
    calibration), and the table shows each run's context."""
    import attnlab.bench.lm as lm

    long_context = next(o for o in QUICK["long_train"] if o.startswith("text.context="))
    rate = {lm.LONG_REFERENCE: 0.1, **dict(zip(lm.LONG_KINDS, (0.2, 0.4, 0.1, 0.05, 0.08)))}  # the budget's 1/n
    calls = []

    def fake_point(name, folder, overrides, *, steps, budget, lengths, prompt, data_dir=None, seed=0):
        folder.mkdir(parents=True, exist_ok=True)
        calls.append(name)
        long = long_context in overrides
        assert long == (name != lm.LONG_REFERENCE) and lengths == ()
        if long:
            assert tuple(overrides) == (*lm.LONG_KINDS[name], *QUICK["kinds_train"], *QUICK["long_train"])
        return {"kind": name, "seed": seed, "steps": steps, "budget_s": budget, "context": 256 if long else 32,
                "batch_size": 1 if long else 4, "train_seconds": steps * rate[name], "val_loss": 1.5 + 0.1 * len(calls),
                "test_loss": 1.6, "train_tokens_per_s": 1000.0, "decoding": []}

    def fake_rate(overrides, *a):
        return next(r for name, r in rate.items()
                    if tuple(overrides) == ((*lm.LONG_KINDS[name], *QUICK["kinds_train"], *QUICK["long_train"])
                                            if name in lm.LONG_KINDS else QUICK["kinds_train"]))

    monkeypatch.setattr(lm, "kind_point", fake_point)
    monkeypatch.setattr(lm, "_seconds_per_step", fake_rate)
    data = lm.run_lm(tmp_path, parts=["kinds_long"], quick=True, log=lambda line: None)
    assert calls == [lm.LONG_REFERENCE, *lm.LONG_KINDS] and "kinds_seed" not in data
    budget = 4 * 0.1
    assert all(data["kinds_long"][name]["steps"] == round(budget / rate[name]) for name in lm.LONG_KINDS)
    table = (tmp_path / "table.md").read_text()
    assert "Attention kinds at long context, lm-shakespeare-char for 0 s" in table
    assert f"| {lm.LONG_REFERENCE} | 32 x 4 | 4 |" in table and "| 3:1 hybrid | 256 x 1 |" in table
