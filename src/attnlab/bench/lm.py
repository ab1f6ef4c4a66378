"""``attnlab bench lm``: decoder-only language models, measured on this machine.

Parts (``parts=``), each resumable (a finished item in ``OUT/results.json`` is kept, not
measured again):

* ``generation``: tokens per second of greedy generation by a Llama-style model (4 layers
  of width 256, 8 query and 2 key/value heads, SwiGLU, RMSNorm, rotary positions, random
  weights) at batch 1 and 8, with its key/value cache and without one (the whole sequence
  again at every step), the tokens checked equal. Against ``transformers``' ``generate``
  with the same weights: ``benchmarks/lm_generate.py`` (a peer is never a dependency of
  attnlab itself).
* ``cache``: the key/value cache's bytes and the decoding speed of that model with
  multi-head (8 key/value heads), grouped-query (2), multi-query (1) and sliding-window
  attention as a generation grows to 1k, 4k and 16k tokens; the bytes checked against
  ``2 x layers x kv heads x head size x positions x 4``.
* ``extrapolation``: ``lm-shakespeare-char`` trained with a context of 256 for each kind
  of position (learned, sinusoidal, rotary, ALiBi), its validation part scored in windows
  of 256, 512 and 1,024 characters (the ALiBi paper's claim).
* ``streaming``: the ``kinds`` part's multi-head model (trained at a context of 128) reading
  4x its context of the validation text token by token, its loss past the context with the
  whole cache, with a window of the context alone, and with the window and 4 sink tokens
  (StreamingLLM's claim: flat memory, and a loss that stays bounded only with the sinks).
* ``kinds``: each attention kind of :data:`KINDS` in the same decoder (``lm-shakespeare-char``'s
  4 layers of width 128), trained on Tiny Shakespeare for the wall-clock the shipped recipe
  takes (each kind's steps from a calibration of its step time, so a slower kind trains fewer
  steps): validation and test loss, training tokens per second, the cache's bytes a token
  (per position for a growing cache; the whole for a state of fixed size) and greedy decoding
  speed with the cache after 1k, 4k and 16k generated tokens.
* ``kinds_long``: the kinds made for long inputs (:data:`LONG_KINDS`: exact, sliding window,
  nsa, dsa and the 3:1 hybrid) trained at a context of 2,048 (batch 2: the recipe's 4,096
  tokens a step) for the same wall-clock, which the recipe itself (multi-head attention at
  context 128) measures first and stands beside them: validation and test loss over windows
  of each run's context, training tokens per second.

Every figure is one process's, on the CPU, float32; time it alone on the machine.
``quick``: tiny sizes and budgets, to see that everything runs; its figures mean nothing.
Outputs in ``OUT``: ``results.json`` (rewritten atomically after each item) and ``table.md``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..errors import InputError
from ..io import atomic_write_bytes
from .machine import machine_info, machine_label
from .parts import LM_PARTS

__all__ = ["PARTS", "LLAMA_STYLE", "CACHE_VARIANTS", "POSITION_KINDS", "KINDS", "LONG_KINDS", "LONG_REFERENCE",
           "best_of", "generation_point", "cache_point", "extrapolation_point", "kind_point", "decoding_point", "streaming_point", "run_lm", "lm_markdown"]

PARTS = LM_PARTS
# The model of the generation and cache parts (Llama's block at a size a CPU decodes quickly).
LLAMA_STYLE = dict(vocab_size=256, embed_dim=256, depth=4, num_heads=8, mlp="swiglu", mlp_hidden_dim=688,
                   norm="rmsnorm", norm_eps=1e-6, pos_embed="rope", bias=False, tie_embeddings=False)
# name -> (key/value heads, windowed)
CACHE_VARIANTS = {"multi-head": (8, False), "grouped-query": (2, False), "multi-query": (1, False),
                  "sliding window": (8, True), "sliding window, 2 kv heads": (2, True)}
POSITION_KINDS = ("learned", "sinusoidal", "rope", "alibi")
# The attention kinds side by side: overrides of lm-shakespeare-char (4 layers, 4 heads of 32, context 128).
KINDS = {
    "multi-head": (),
    "grouped-query (2 kv heads)": ("model.options.num_kv_heads=2",),
    "multi-query": ("model.options.num_kv_heads=1",),
    "latent (kv_rank 64)": ("model.options.attention=latent", "model.options.attention_options={kv_rank: 64, rope_dim: 16}"),
    "sinks": ("model.options.attention=sinks",),
    "differential": ("model.options.attention=differential",),
    "gated delta": ("model.options.layer_types=[linear, linear, linear, linear]",),
    "3:1 hybrid": ("model.options.layer_types=[linear, linear, linear, full]",),
    "sparse selection (dsa, 32 keys)": ("model.options.attention=dsa",
                                        "model.options.attention_options={kv_rank: 64, rope_dim: 16, index_topk: 32}"),
    "sliding window (32)": ("model.options.sliding_window=32",),
    "native sparse (nsa: 2 blocks of 8 + window 32)": (
        "model.options.attention=nsa", "model.options.attention_options={block: 8, num_selected: 2, branch_window: 32}"),
}
# The kinds that exist for long inputs, trained at a context of 2,048 (FULL's long_train: batch 2, the
# same 4,096 tokens a step as the recipe's 32 x 128) for the recipe's time at its own context, which
# multi-head attention at context 128 (LONG_REFERENCE, trained first) measures. The sparse kinds'
# sizes have each query read about 256-350 keys of up to 2,048.
LONG_REFERENCE = "multi-head at the recipe's context"
LONG_KINDS = {
    "multi-head": (),
    "sliding window (256)": ("model.options.sliding_window=256",),
    "native sparse (nsa: 4 blocks of 32 + window 128)": (
        "model.options.attention=nsa", "model.options.attention_options={block: 32, num_selected: 4, branch_window: 128}"),
    "sparse selection (dsa, 256 keys)": ("model.options.attention=dsa",
                                         "model.options.attention_options={kv_rank: 64, rope_dim: 16, index_topk: 256}"),
    "3:1 hybrid": ("model.options.layer_types=[linear, linear, linear, full]",),
}

TIME_TOLERANCE = 0.10  # a kind's training time further than this from the budget is trained again
SEED_GAP = 0.02  # nats: kinds whose validation losses are closer than this get a second seed

FULL = dict(new=256, batches=(1, 8), prompt=16, lengths=(1024, 4096, 16384), window=256, steps=300, batch_size=16,
            context=256, windows=(256, 512, 1024), model=(), calibration=20, kinds_train=(),
            long_train=("text.context=2048", "model.options.max_len=2048", "train.batch_size=2"))
QUICK = dict(new=8, batches=(1, 2), prompt=4, lengths=(80, 96), window=16, steps=2, batch_size=4, context=32,
             windows=(32, 64), model=("model.options.depth=1", "model.options.embed_dim=16",
                                       "model.options.num_heads=2", "model.options.mlp_hidden_dim=32"),
             calibration=2, kinds_train=("train.steps=4", "train.batch_size=4", "text.context=32"),
             long_train=("text.context=256", "model.options.max_len=256", "train.batch_size=1"))


def best_of(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """``(the shortest wall time of repeats calls of fn, the last call's result)``."""
    seconds, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        seconds = min(seconds, time.perf_counter() - start)
    return seconds, out


def _model(max_len: int, **options: Any) -> torch.nn.Module:
    from ..models.gpt import GPT

    torch.manual_seed(0)
    return GPT(**{**LLAMA_STYLE, **options}, max_len=max_len).eval()


@torch.no_grad()
def generation_point(batch: int, *, new: int, prompt: int, repeats: int = 3) -> dict[str, Any]:
    """Tokens per second (new tokens of every row over the wall time, best of ``repeats``) of
    cached greedy generation and of the same without the cache, at ``batch``."""
    model = _model(prompt + new, num_kv_heads=2)
    ids = torch.randint(0, LLAMA_STYLE["vocab_size"], (batch, prompt), generator=torch.Generator().manual_seed(batch))
    model.generate(ids, 2)  # warm-up: the joined weights, the rotary table
    cached_s, cached = best_of(lambda: model.generate(ids, new), repeats)
    plain_s, plain = best_of(lambda: model.generate(ids, new, use_cache=False), 1)
    if not torch.equal(cached, plain):
        raise RuntimeError("cached and uncached generation chose different tokens: the figures would be void")
    return {"batch": batch, "new_tokens": new, "cached_tokens_per_s": batch * new / cached_s,
            "uncached_tokens_per_s": batch * new / plain_s, "cache_speedup": plain_s / cached_s}


@torch.no_grad()
def cache_point(variant: str, *, lengths: Sequence[int], window: int, prompt: int, batch: int = 1) -> dict[str, Any]:
    """The cache bytes, decoding tokens per second and step times of ``variant`` (a key of
    :data:`CACHE_VARIANTS`) after each of ``lengths`` new tokens, one greedy run each: a
    prefill through ``forward``, then the decoding steps ``GPT.stream`` takes, written out
    here so that the cache can be read at the end (first checked to give ``generate``'s
    tokens)."""
    from ..attention.cache import DecodingCache
    from ..generation.search import DecoderSession, search

    kv_heads, windowed = CACHE_VARIANTS[variant]
    model = _model(prompt + max(lengths), num_kv_heads=kv_heads, sliding_window=window if windowed else None)
    ids = torch.randint(0, LLAMA_STYLE["vocab_size"], (batch, prompt), generator=torch.Generator().manual_seed(1))

    def decode(n: int) -> tuple[torch.Tensor, list[DecodingCache], list[float]]:
        session, steps = DecoderSession(model, ids, n), _StepClock()
        tokens = torch.stack(list(search(session, n, [], observer=steps)), dim=1)
        return tokens, session.cache, steps.times

    check = min(max(lengths), window + 16 if windowed else 64)  # a window must slide within the check
    if not torch.equal(decode(check)[0], model.generate(ids, check)[:, prompt:]):
        raise RuntimeError(f"{variant}: the timed loop chose other tokens than generate: the figures would be void")
    head_dim = LLAMA_STYLE["embed_dim"] // LLAMA_STYLE["num_heads"]
    per_position = 2 * LLAMA_STYLE["depth"] * kv_heads * head_dim * 4 * batch
    points = []
    for n in lengths:
        _, cache, steps = decode(n)
        # a windowed cache holds the window and its room to slide, or less when the whole generation is shorter
        positions = min(window - 1 + DecodingCache.slide_room, prompt + n) if windowed else prompt + n
        tenth = max(1, len(steps) // 10)
        points.append({"new_tokens": n, "cache_bytes": sum(c.nbytes() for c in cache),
                       "expected_bytes": per_position * positions, "tokens_per_s": batch * len(steps) / sum(steps),
                       "ms_first_tenth": 1000 * sum(steps[:tenth]) / tenth,
                       "ms_last_tenth": 1000 * sum(steps[-tenth:]) / tenth})
    return {"variant": variant, "kv_heads": kv_heads, "window": window if windowed else None, "points": points}


def extrapolation_point(kind: str, run_dir: str | Path, *, steps: int, batch_size: int, context: int,
                        windows: Sequence[int], data_dir: str | None = None,
                        model: Sequence[str] = ()) -> dict[str, Any]:
    """``lm-shakespeare-char`` with ``pos_embed=kind`` trained at ``context`` (kept in
    ``run_dir``: a finished run is scored again without training), and its validation loss
    in windows of each of ``windows`` tokens (every token but a window's first predicted once).
    ``model``: more overrides of the recipe's model (``model.options.depth=1``, ...)."""
    from ..data.batches.lm import LMDataset
    from ..data.source import source_of
    from ..engine.trainer import evaluate_model
    from ..recipes import load_recipe
    from ..tasks import load_run, train

    run_dir = Path(run_dir)
    if not (run_dir / "results.json").is_file():
        recipe = load_recipe("lm-shakespeare-char", [
            f"model.options.pos_embed={kind}", f"model.options.max_len={max(windows)}", f"text.context={context}",
            f"train.steps={steps}", f"train.batch_size={batch_size}", f"train.eval_every={steps}",
            f"train.checkpoint_every={steps}", f"train.warmup_steps={min(100, steps // 10)}", "train.progress=false",
            "train.tensorboard=false", "train.precision=fp32", "generate.max_new_tokens=1",
            *model, *([f"data.data_dir={data_dir}"] if data_dir else [])])
        train(recipe, run_dir, log=lambda line: None)
    run = load_run(run_dir)
    val = source_of(run.recipe.data).load(run.recipe.data).val
    losses = [evaluate_model(run.model, LMDataset(val, run.tokenizer, n), batch_size=max(1, 4096 // n), device="cpu",
                             precision="fp32")["loss"] for n in windows]
    return {"kind": kind, "context": context, "steps": steps, "windows": list(windows), "val_loss": losses}


def _kind_recipe(overrides: Sequence[str], run_steps: Sequence[str], data_dir: str | None) -> Any:
    from ..recipes import load_recipe

    return load_recipe("lm-shakespeare-char", [
        *overrides, *run_steps, "train.progress=false", "train.tensorboard=false", "train.precision=fp32",
        "generate.max_new_tokens=1", *([f"data.data_dir={data_dir}"] if data_dir else [])])


def _seconds_per_step(overrides: Sequence[str], folder: Path, steps: int, data_dir: str | None) -> float:
    """The training time a step of the recipe with ``overrides`` takes: ``steps`` steps after
    ``steps`` of warm-up."""
    from ..tasks import train as train_run

    if folder.exists():
        shutil.rmtree(folder)
    recipe = _kind_recipe(overrides, [f"train.steps={2 * steps}", f"train.eval_every={2 * steps}",
                                      f"train.log_every={steps}", "train.warmup_steps=1"], data_dir)
    times: list[float] = []
    train_run(recipe, folder, log=lambda line: times.append(time.perf_counter())
              if line.startswith("step ") and "samples/s" in line else None)  # steps 1, `steps` and 2 x `steps`
    shutil.rmtree(folder)
    if len(times) >= 2:  # the last `steps` steps: the first log, at step 1, comes before the warm-up's
        return (times[-1] - times[-2]) / steps
    raise RuntimeError(f"{list(overrides)}: the calibration's log gave no step times")


def kind_point(name: str, folder: Path, overrides: Sequence[str], *, steps: int, budget: float,
               lengths: Sequence[int], prompt: int, data_dir: str | None = None, seed: int = 0) -> dict[str, Any]:
    """``lm-shakespeare-char`` with ``overrides`` (kind ``name``'s) trained for ``steps`` steps
    (what ``budget`` seconds allow it) with ``train.seed=seed`` in ``folder``, then measured:
    losses, training speed, cache bytes, and decoding speed after each of ``lengths`` generated
    tokens (none when empty)."""
    from ..tasks import load_run
    from ..tasks import train as train_run

    if not (folder / "results.json").is_file():
        if folder.exists():
            shutil.rmtree(folder)  # an interrupted training: again from the start, for its time to count whole
        recipe = _kind_recipe(overrides, [f"train.steps={steps}", f"train.eval_every={steps}",
                                          f"train.checkpoint_every={steps}", f"train.seed={seed}"], data_dir)
        train_run(recipe, folder, log=lambda line: None)
    results = json.loads((folder / "results.json").read_text())
    run = load_run(folder)
    model = run.model.eval()

    def cache_bytes(positions: int) -> int:
        return sum(block.attn.cache_bytes(1, positions, torch.float32) for block in model.blocks)

    far = 10 ** 6  # what the cache still adds a token there, and what it holds besides (a state, a window)
    per_token = (cache_bytes(far) - cache_bytes(far - 1000)) // 1000
    fixed = cache_bytes(far) - per_token * far
    speeds = decoding_point(model, lengths=lengths, prompt=prompt)
    recipe = run.recipe
    tokens = results["steps"] * recipe.train.batch_size * recipe.text.context
    return {"kind": name, "overrides": list(overrides), "seed": seed, "steps": results["steps"], "budget_s": budget,
            "context": recipe.text.context, "batch_size": recipe.train.batch_size,
            "train_seconds": results["train_seconds"], "train_tokens_per_s": tokens / results["train_seconds"],
            "val_loss": results["val_loss"], "test_loss": results["test_loss"], "params": results["params"],
            "cache_bytes_per_token": per_token, "cache_bytes_fixed": fixed,
            "decoding": speeds}


def _at_equal_time(data: dict[str, Any], part: str, kinds: dict[str, Sequence[str]], reference: str, out: Path, *,
                   calibration_steps: int, lengths: Sequence[int], prompt: int, data_dir: str | None,
                   save: Callable[[], None], done: Callable[[str, str, Callable[[], dict[str, Any]]], None],
                   log: Callable[[str], None]) -> None:
    """Each of ``kinds`` (name -> the recipe's overrides) trained for the wall-clock that the
    recipe's steps take ``reference`` here, into ``data[part]``: each kind's steps from a short
    calibration of its step time (``data[part + '_calibration']``); a kind whose training then
    misses the time by more than TIME_TOLERANCE is trained once more at its own measured rate;
    kinds ending closer than SEED_GAP nats to another get a second seed with the same steps
    (``data[part + '_seed']``, losses only)."""
    from ..recipes import load_recipe

    calibration = data.setdefault(f"{part}_calibration", {})
    for name, overrides in kinds.items():
        if name not in calibration:
            calibration[name] = _seconds_per_step(overrides, out / part / "calibration", calibration_steps, data_dir)
            save()
            log(f"{part} calibration {name}: {calibration[name]:.3f} s a step")
    shipped = load_recipe("lm-shakespeare-char", list(kinds[reference])).train.steps
    folders = {name: out / part / name.split(" (")[0].replace(" ", "-").replace(":", "to").replace("'", "")
               for name in kinds}
    point = dict(lengths=lengths, prompt=prompt, data_dir=data_dir)
    done(part, reference, lambda: kind_point(reference, folders[reference], kinds[reference], steps=shipped,
                                             budget=shipped * calibration[reference], **point))
    rows = data[part]
    budget = rows[reference]["train_seconds"]  # the shipped recipe's training time, measured here
    for name, overrides in kinds.items():
        retrained = False
        while True:
            done(part, name, lambda: {**kind_point(name, folders[name], overrides, budget=budget, **point,
                                                   steps=max(1, round(budget / calibration[name]))),
                                      "retrained": retrained})
            r = rows[name]
            if abs(r["train_seconds"] / budget - 1) <= TIME_TOLERANCE or r.get("retrained"):
                break
            # The short calibration was off (this machine's speed drifts): trained again, once,
            # at the step time its own run measured.
            calibration[name], retrained = r["train_seconds"] / r["steps"], True
            log(f"{part} {name}: trained {r['train_seconds']:.0f} s for a budget of {budget:.0f} s; again with "
                f"{round(budget / calibration[name])} steps")
            del rows[name]
            shutil.rmtree(folders[name])
    val = {name: r["val_loss"] for name, r in rows.items()}
    for name, overrides in kinds.items():
        if any(other != name and abs(val[name] - val[other]) < SEED_GAP for other in val):
            done(f"{part}_seed", name, lambda: kind_point(
                name, folders[name].with_name(folders[name].name + "-seed1"), overrides, steps=rows[name]["steps"],
                budget=budget, **{**point, "lengths": ()}, seed=1))


class _StepClock:
    """An observer of a generation (:class:`~attnlab.generation.search.Step`) that keeps the
    seconds between one chosen token and the next: a decoding step and the choice after it
    (the first choice, after the prompt, is not a step)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.last: float | None = None

    def __call__(self, step: Any) -> None:
        now = time.perf_counter()
        if self.last is not None:
            self.times.append(now - self.last)
        self.last = now


@torch.no_grad()
def decoding_point(model: torch.nn.Module, *, lengths: Sequence[int], prompt: int) -> list[dict[str, Any]]:
    """Greedy decoding with the cache from a random prompt of ``prompt`` tokens, one run per
    length of ``lengths``: tokens per second, the last tenth's ms a token, the cache's bytes."""
    from ..generation.search import DecoderSession, search

    ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(1))
    speeds = []
    for n in lengths:
        session, clock = DecoderSession(model, ids, n), _StepClock()
        for _ in search(session, n, [], observer=clock):  # generate's greedy search, each step timed
            pass
        tenth, times = max(1, n // 10), clock.times
        speeds.append({"new_tokens": n, "tokens_per_s": len(times) / sum(times),
                       "ms_last_tenth": 1000 * sum(times[-tenth:]) / tenth, "cache_bytes": session.cache.nbytes()})
    return speeds


def streaming_point(run_dir: str | Path, *, factor: int = 4, sinks: int = 4) -> dict[str, Any]:
    """The run's model reading ``factor`` times its context of the validation text one token at a
    time: mean loss (nats/token) over the tokens within the context and past it, and the cache's
    bytes at the end, with the whole cache, a window of the context, and the window with
    ``sinks`` sink tokens."""
    from ..data.source import source_of
    from ..tasks import load_run

    run = load_run(run_dir)
    model, context = run.model.eval(), run.recipe.text.context
    val = source_of(run.recipe.data).load(run.recipe.data).val
    text = val if isinstance(val, str) else "".join(val)
    ids = torch.tensor(run.tokenizer.encode(text)[: factor * context + 1])[None]
    rows = {}
    for name, policy in (("whole cache", {}), (f"window of {context}", {"cache_window": context}),
                         (f"window of {context} + {sinks} sink tokens", {"cache_window": context,
                                                                          "sink_tokens": sinks})):
        losses = []
        with torch.no_grad():
            cache = model.new_cache(1, ids.shape[1], **policy)
            for t in range(ids.shape[1] - 1):
                logits = model.decode_step(ids[:, t:t + 1], cache) if model.has_decode_step else \
                    model(ids[:, t:t + 1], cache=cache)[:, -1]
                losses.append(torch.nn.functional.cross_entropy(logits.float(), ids[:, t + 1]).item())
        rows[name] = {"loss_within": sum(losses[:context]) / context,
                      "loss_past": sum(losses[context:]) / len(losses[context:]),
                      "loss_last_context": sum(losses[-context:]) / context, "cache_bytes": cache.nbytes()}
    return {"context": context, "tokens": ids.shape[1] - 1, "sinks": sinks, "rows": rows}


def run_lm(out: str | Path, *, parts: Sequence[str] = PARTS, quick: bool = False, fresh: bool = False,
           data_dir: str | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the chosen ``parts`` into ``out``; returns ``results.json``'s content."""
    for p in parts:
        if p not in PARTS:
            raise InputError(f"parts must be among {list(PARTS)}; got {p!r}")
    s = QUICK if quick else FULL
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    if fresh and (out / "extrapolation").is_dir():
        shutil.rmtree(out / "extrapolation")  # its trained runs, which a later call would score again
    data: dict[str, Any] = json.loads(path.read_text()) if path.is_file() and not fresh else {}
    if data.get("quick", quick) != quick:
        raise InputError(f"{out} holds {'quick' if data['quick'] else 'full'} results; use another --out or --fresh")
    data.update(machine=machine_info("cpu"), quick=quick, threads=torch.get_num_threads())

    def save() -> None:
        atomic_write_bytes(path, json.dumps(data, indent=1).encode())

    def done(part: str, key: str, record: Callable[[], dict[str, Any]]) -> None:
        section = data.setdefault(part, {})
        if key not in section:
            start = time.perf_counter()
            section[key] = record()
            save()
            log(f"{part} {key}: {time.perf_counter() - start:.0f} s")

    if "generation" in parts:
        for batch in s["batches"]:
            done("generation", f"batch {batch}", lambda: generation_point(batch, new=s["new"], prompt=s["prompt"]))
    if "cache" in parts:
        for variant in CACHE_VARIANTS:
            done("cache", variant, lambda: cache_point(variant, lengths=s["lengths"], window=s["window"],
                                                       prompt=s["prompt"]))
    if "extrapolation" in parts:
        for kind in POSITION_KINDS:
            done("extrapolation", kind, lambda: extrapolation_point(
                kind, out / "extrapolation" / kind, steps=s["steps"], batch_size=s["batch_size"],
                context=s["context"], windows=s["windows"], data_dir=data_dir, model=s["model"]))
    equal_time = dict(calibration_steps=s["calibration"], prompt=s["prompt"], data_dir=data_dir, save=save, done=done,
                      log=log)
    if "kinds" in parts:
        _at_equal_time(data, "kinds", {name: (*o, *s["kinds_train"]) for name, o in KINDS.items()}, "multi-head", out,
                       lengths=s["lengths"], **equal_time)
    if "kinds_long" in parts:
        long = {name: (*o, *s["kinds_train"], *s["long_train"]) for name, o in LONG_KINDS.items()}
        _at_equal_time(data, "kinds_long", {LONG_REFERENCE: s["kinds_train"], **long}, LONG_REFERENCE, out,
                       lengths=(), **equal_time)
    if "streaming" in parts:
        trained = out / "kinds" / "multi-head"
        if not (trained / "results.json").is_file():
            raise InputError(f"the streaming part reads the kinds part's multi-head run ({trained}): run --parts "
                             f"kinds first")
        done("streaming", "multi-head", lambda: streaming_point(trained))
    save()
    atomic_write_bytes(out / "table.md", lm_markdown(data).encode())
    return data


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if nbytes < 1024:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.2f} GiB"


def _length(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _seeds(r: dict[str, Any], again: dict[str, Any] | None, key: str) -> str:
    """``r[key]``, and a second seed's after a slash."""
    return f"{r[key]:.4f}" + (f" / {again[key]:.4f}" if again else "")


def lm_markdown(data: dict[str, Any]) -> str:
    """The Markdown tables of ``results.json``'s content."""
    lines = [f"machine: {machine_label(data['machine'])}"
             + (" (quick: the figures mean nothing)" if data.get("quick") else ""), ""]
    if data.get("generation"):
        lines += ["Greedy generation, Llama-style model (4 layers of width 256, 8 query / 2 key-value heads):", "",
                  "| batch | new tokens | with the cache | without | cache speed-up |", "| ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {r['batch']} | {r['new_tokens']} | {r['cached_tokens_per_s']:,.0f} tokens/s | "
                  f"{r['uncached_tokens_per_s']:,.0f} tokens/s | {r['cache_speedup']:.1f}x |"
                  for r in data["generation"].values()]
        lines.append("")
    if data.get("cache"):
        rows = list(data["cache"].values())
        lengths = [p["new_tokens"] for p in rows[0]["points"]]
        labels = [_length(n) for n in lengths]
        lines += ["Key/value cache and decoding speed as a generation grows (batch 1):", "",
                  "| attention | " + " | ".join(f"cache at {x}" for x in labels) + " | "
                  + " | ".join(f"tokens/s at {x}" for x in labels) + f" | ms/token, last 10% of {labels[-1]} "
                  "| bytes as the formula |", "| --- |" + " ---: |" * (2 * len(labels) + 1) + " --- |"]
        for r in rows:
            name = r["variant"] + (f" {r['window']}" if r["window"] and r["variant"] == "sliding window" else "")
            pts = r["points"]
            equal = all(p["cache_bytes"] == p["expected_bytes"] for p in pts)
            lines.append(f"| {name} | " + " | ".join(_size(p["cache_bytes"]) for p in pts) + " | "
                         + " | ".join(f"{p['tokens_per_s']:,.0f}" for p in pts)
                         + f" | {pts[-1]['ms_last_tenth']:.1f} | {'yes' if equal else 'NO'} |")
        lines.append("")
    if data.get("extrapolation"):
        rows = list(data["extrapolation"].values())
        first = rows[0]
        lines += [f"Length extrapolation: lm-shakespeare-char trained at context {first['context']} for "
                  f"{first['steps']} steps, validation loss (nats/char) in windows of:", "",
                  "| positions | " + " | ".join(f"{n:,}" + (" (trained)" if n == first["context"] else "")
                                                for n in first["windows"]) + " |",
                  "| --- |" + " ---: |" * len(first["windows"])]
        lines += [f"| {r['kind']} | " + " | ".join(f"{v:.3f}" for v in r["val_loss"]) + " |" for r in rows]
        lines.append("")
    if data.get("kinds"):
        rank = {name: i for i, name in enumerate(KINDS)}
        rows = sorted(data["kinds"].values(), key=lambda r: rank.get(r["kind"], len(rank)))
        seeds = data.get("kinds_seed", {})
        labels = [_length(p["new_tokens"]) for p in rows[0]["decoding"]]
        budget = data["kinds"]["multi-head"]["train_seconds"] if "multi-head" in data["kinds"] else rows[0]["budget_s"]
        lines += [f"Attention kinds in the same decoder, lm-shakespeare-char for {budget:.0f} s of "
                  f"training each (the shipped recipe's time here, as multi-head attention measured it)"
                  + (f"; a second seed (after the slash) where two kinds end closer than {SEED_GAP} nats" if seeds
                     else "") + ":", "",
                  "| kind | steps | training s | val loss | test loss | training tokens/s | cache (float32, batch 1) | "
                  + " | ".join(f"decoding tokens/s at {x}" for x in labels) + " |",
                  "| --- |" + " ---: |" * (6 + len(labels))]
        for r in rows:
            parts = [f"{r['cache_bytes_per_token']:,} B/token"] if r["cache_bytes_per_token"] else []
            parts += [f"{_size(r['cache_bytes_fixed'])} fixed"] if r["cache_bytes_fixed"] else []
            cache = " + ".join(parts) or "none"
            val, test = (_seeds(r, seeds.get(r["kind"]), key) for key in ("val_loss", "test_loss"))
            lines.append(f"| {r['kind']} | {r['steps']:,} | {r['train_seconds']:.0f} | {val} | {test} | "
                         f"{r['train_tokens_per_s']:,.0f} | {cache} | "
                         + " | ".join(f"{p['tokens_per_s']:,.0f}" for p in r["decoding"]) + " |")
        lines.append("")
    if data.get("kinds_long"):
        rank = {name: i for i, name in enumerate((LONG_REFERENCE, *LONG_KINDS))}
        rows = sorted(data["kinds_long"].values(), key=lambda r: rank.get(r["kind"], len(rank)))
        seeds = data.get("kinds_long_seed", {})
        reference = data["kinds_long"].get(LONG_REFERENCE)
        budget = reference["train_seconds"] if reference else rows[0]["budget_s"]
        lines += [f"Attention kinds at long context, lm-shakespeare-char for {budget:.0f} s of training each (the "
                  "recipe's time at its own context here, as its multi-head run measured it)"
                  + (f"; a second seed (after the slash) where two kinds end closer than {SEED_GAP} nats" if seeds
                     else "") + ":", "",
                  "| kind | context x batch | steps | training s | val loss | test loss | training tokens/s |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in rows:
            val, test = (_seeds(r, seeds.get(r["kind"]), key) for key in ("val_loss", "test_loss"))
            lines.append(f"| {r['kind']} | {r['context']:,} x {r['batch_size']} | {r['steps']:,} | "
                         f"{r['train_seconds']:.0f} | {val} | {test} | {r['train_tokens_per_s']:,.0f} |")
        lines.append("")
    if data.get("streaming"):
        for r in data["streaming"].values():
            lines += [f"Reading {r['tokens']:,} tokens of the validation text one at a time, 4x the trained context "
                      f"of {r['context']} (loss in nats/token):", "",
                      "| cache | within the context | past it | the last context's worth | cache bytes at the end |",
                      "| --- | ---: | ---: | ---: | ---: |"]
            lines += [f"| {name} | {v['loss_within']:.4f} | {v['loss_past']:.4f} | {v['loss_last_context']:.4f} | "
                      f"{_size(v['cache_bytes'])} |" for name, v in r["rows"].items()]
            lines.append("")
    return "\n".join(lines)
