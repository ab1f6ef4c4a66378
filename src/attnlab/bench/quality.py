"""What each attention kind can still learn: accuracy after a fixed training budget.

Two tasks, the same budget for every kind:

* **Needle** (synthetic, long range; :class:`NeedleDataset`): a sequence of ``n`` tokens
  (``n >= 1024`` in the benchmark) starts with a class token; one of the other
  positions, uniformly at random, holds one of 10 *value* tokens and every other
  position one of 52 *noise* tokens. The label is the value. The classifier reads the
  class token only (``pooling="cls"``), so the value has to travel through attention
  from wherever it lies to position 0: a kind that cannot reach across the sequence
  (a narrow window) is near chance (10%) for far needles; a kind that blurs the
  attention (a crude kernel) has to learn a sharp lookup.
* **MR** sentiment: the shipped ``sentiment-mr`` recipe (fixed split) with only the
  attention kind changed (:func:`mr_accuracy`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from ..engine.trainer import TrainConfig, Trainer
from ..errors import InputError
from ..models import create_model
from ..recipes import load_recipe
from ..tasks import train
from .scaling import VARIANTS

__all__ = ["NeedleDataset", "needle_accuracy", "mr_accuracy", "ensure_mr_run", "NUM_VALUES"]

PAD, CLS = 0, 1
NUM_VALUES, NUM_NOISE = 10, 52
VALUE0 = 2  # value tokens 2..11, noise tokens 12..63
VOCAB = VALUE0 + NUM_VALUES + NUM_NOISE


class NeedleDataset:
    """``size`` needle sequences of length ``n``, generated from ``seed``; see the module docstring.

    ``get_batch(idx)`` -> ``({"input_ids": (B, n) int64}, labels (B,))``.
    ``positions`` holds each sample's needle position (1..n-1), for accuracy by distance.
    """

    def __init__(self, size: int, n: int, seed: int) -> None:
        if n < 2 or size < 1:
            raise InputError(f"NeedleDataset needs size >= 1 and n >= 2; got size={size}, n={n}")
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(VALUE0 + NUM_VALUES, VOCAB, (size, n), generator=g)
        ids[:, 0] = CLS
        self.labels = torch.randint(0, NUM_VALUES, (size,), generator=g)
        self.positions = torch.randint(1, n, (size,), generator=g)
        ids[torch.arange(size), self.positions] = VALUE0 + self.labels
        self.ids, self.n = ids, n

    def __len__(self) -> int:
        return len(self.labels)

    def get_batch(self, idx: list[int]) -> tuple[dict[str, Tensor], Tensor]:
        i = torch.as_tensor(idx)
        return {"input_ids": self.ids[i]}, self.labels[i]


def needle_accuracy(kind: str, options: dict[str, Any], *, n: int = 1024, steps: int = 300, batch_size: int = 16,
                    lr: float = 1e-3, width: int = 64, depth: int = 2, heads: int = 4, train_size: int = 8192,
                    test_size: int = 1024, seed: int = 0, device: str = "auto",
                    log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train a small classifier with attention ``kind`` on the needle task for ``steps``
    steps and test it on fresh sequences. Returns ``{accuracy, near_accuracy,
    far_accuracy, train_seconds, ...}`` (near: needles in the first quarter)."""
    torch.manual_seed(seed)
    model = create_model("sentiment_transformer_small", vocab_size=VOCAB, num_classes=NUM_VALUES, embed_dim=width,
                         depth=depth, num_heads=heads, max_len=n, pooling="cls", drop_rate=0.0, attn_drop_rate=0.0,
                         pos_drop_rate=0.0, padding_idx=None, attention=kind, attention_options=options)
    train = NeedleDataset(train_size, n, seed=seed + 1)
    test = NeedleDataset(test_size, n, seed=seed + 2)
    cfg = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, weight_decay=0.01, warmup_steps=steps // 10,
                      seed=seed, device=device, log_every=max(steps // 5, 1), tensorboard=False, progress=False)
    trainer = Trainer(model, train, cfg, log=log)
    start = time.perf_counter()
    trainer.fit()
    seconds = time.perf_counter() - start
    model.eval()
    correct = []
    with torch.no_grad():
        for s in range(0, len(test), 64):
            x, y = test.get_batch(list(range(s, min(s + 64, len(test)))))
            out = model(x["input_ids"].to(trainer.device))
            correct.append(out.argmax(-1).cpu() == y)
    hit = torch.cat(correct)
    near = test.positions < n // 4
    return {"task": "needle", "kind": kind, "options": options, "n": n, "accuracy": hit.float().mean().item(),
            "near_accuracy": hit[near].float().mean().item(), "far_accuracy": hit[~near].float().mean().item(),
            "steps": steps, "batch_size": batch_size, "train_seconds": seconds, "chance": 1 / NUM_VALUES}


def mr_accuracy(kind: str, options: dict[str, Any], run_dir: str | Path, *, overrides: list[str] = (),
                log: Callable[[str], None] = print) -> dict[str, Any]:
    """The ``sentiment-mr`` recipe (fixed split) with attention ``kind``: test accuracy.

    ``overrides`` are extra ``key.sub=value`` recipe overrides. Needs the MR data
    (``ATTNLAB_DATA_DIR``)."""
    sets = [f"model.options.attention={kind}", f"model.options.attention_options={_yaml_flow(options)}",
            "train.progress=false", "train.tensorboard=false", *overrides]
    recipe = load_recipe("sentiment-mr", sets)
    results = train(recipe, run_dir, log=log)
    return {"task": "mr", "kind": kind, "options": options, "accuracy": results["test_accuracy"],
            "train_seconds": results["train_seconds"], "samples_per_s": results["samples_per_s"],
            "steps": results["steps"], "overrides": list(overrides)}


def _yaml_flow(options: dict[str, Any]) -> str:
    """``{"sliding_window": 16}`` -> ``{sliding_window: 16}``, an override value read back as YAML."""
    return "{" + ", ".join(f"{k}: {v}" for k, v in options.items()) + "}"


# The kinds compared, and their settings on MR, whose sentences (at most 96 tokens) are
# shorter than most of the benchmark's windows: there each kind is scaled down so that
# it still attends to a part of the sentence only (local, sparse) or through fewer
# summaries than tokens (linformer, nystrom).
QUALITY_KINDS = ("exact", "local", "sparse", "linear", "performer", "linformer", "nystrom", "topk", "lsh", "latent",
                 "sinks", "differential", "dsa")  # gated_delta is causal only: the needle is read at position 0
MR_OPTIONS: dict[str, dict[str, Any]] = {
    "local": {"sliding_window": 8},
    "sparse": {"pattern": "bigbird", "block": 8, "window_blocks": 3, "global_blocks": 1, "random_blocks": 1},
    "performer": {"num_features": 64},
    "linformer": {"seq_len": 96, "k": 32},
    "nystrom": {"num_landmarks": 16},
    "topk": {"top_k": 4},
    "lsh": {"bucket_size": 8, "n_buckets": 4},  # chunks of 8 (16 keys a query), as local's window
    "latent": {"kv_rank": 32},  # a quarter of the width (128), as the needle's below
    "dsa": {"kv_rank": 32, "index_topk": 8},  # keys a query keeps, as local's window
}
# The needle's classifier is 64 wide: the scaling part's latent sizes (made for width 512) scaled
# to it; dsa keeps 64 of the 1,024 keys.
NEEDLE_OVERRIDES: dict[str, dict[str, Any]] = {"latent": {"kv_rank": 16}, "dsa": {"kv_rank": 16, "index_topk": 64}}
NEEDLE_N, NEEDLE_STEPS = 1024, 200


def needle_options(kind: str, n: int) -> dict[str, Any]:
    """The scaling benchmark's settings of ``kind`` at length ``n`` (with :data:`NEEDLE_OVERRIDES`)."""
    return {**VARIANTS[kind].options(n), **NEEDLE_OVERRIDES.get(kind, {})}


def run_quality(store: Any, kinds: list[str], out: Path, *, quick: bool = False, device: str = "cpu",
                data_dir: str | None = None, log: Callable[[str], None] = print) -> None:
    """Needle and MR accuracy of each of ``kinds`` not yet in ``store``."""
    n, steps = (256, 4) if quick else (NEEDLE_N, NEEDLE_STEPS)
    for kind in kinds:
        if store.find("quality", task="needle", kind=kind):
            continue
        t0 = time.perf_counter()
        rec = needle_accuracy(kind, needle_options(kind, n), n=n, steps=steps, depth=1, heads=2, lr=3e-3,
                              device=device, log=lambda s: None)
        store.add("quality", rec)
        log(f"needle n={n} {kind:>9}: accuracy {100 * rec['accuracy']:.1f}% (near {100 * rec['near_accuracy']:.1f}%, "
            f"far {100 * rec['far_accuracy']:.1f}%), {time.perf_counter() - t0:.0f} s")
    for kind in kinds:
        ensure_mr_run(store, kind, out, quick=quick, device=device, data_dir=data_dir, log=log)


def ensure_mr_run(store: Any, kind: str, out: Path, *, quick: bool = False, device: str = "cpu",
                  data_dir: str | None = None, log: Callable[[str], None] = print) -> Path:
    """The MR run of ``kind`` at its :data:`MR_OPTIONS`, ``out/runs/mr-<kind>``: trained,
    and its accuracy added to ``store``, when ``store`` has no record of it yet."""
    run_dir = out / "runs" / f"mr-{kind}"
    if store.find("quality", task="mr", kind=kind):
        return run_dir
    extra = ["train.steps=4", "train.warmup_steps=1", "train.eval_every=2", "train.checkpoint_every=0"] if quick else []
    if data_dir:
        extra.append(f"data.data_dir={data_dir}")
    if device != "cpu":
        extra.append(f"train.device={device}")
    t0 = time.perf_counter()
    rec = mr_accuracy(kind, MR_OPTIONS.get(kind, {}), run_dir, overrides=extra, log=lambda s: None)
    store.add("quality", rec)
    log(f"MR {kind:>9}: accuracy {100 * rec['accuracy']:.2f}% ({time.perf_counter() - t0:.0f} s)")
    return run_dir
