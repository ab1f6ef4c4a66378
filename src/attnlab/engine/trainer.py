"""A model-agnostic training loop with exact resume.

The trainer sees a model, map-style datasets of ``(input, target)`` pairs and a
:class:`TrainConfig`. Targets are class ids ``(B,)`` for classification, or ``(B, L)``
token ids for sequence outputs ``(B, L, V)`` (translation), where ``-100`` marks
padding that neither the loss nor the accuracy counts. Batches come from :class:`EpochSampler`, whose order is a pure
function of ``(seed, epoch)``; with the RNG state saved in every checkpoint, a run
resumed from step ``k`` replays exactly the steps an uninterrupted run would take.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import distributed
from ..errors import InputError, NonFiniteLossError
from .config import check_bounds
from .checkpoint import (CheckpointError, capture_rng_state, is_sharded_checkpoint, latest_checkpoint, load_checkpoint,
                         load_weights_into, nonfinite_summary, restore_rng_state, save_checkpoint,
                         save_named_checkpoint, save_sharded_checkpoint)
from .sharding import apply_fsdp, choose_mode, held_bytes, load_sharded, local_tensor, save_sharded, whole_tensor
from .device import autocast, make_grad_scaler, resolve_precision, seed_everything, select_device
from .metrics import MetricsLog, TensorBoardLog
from .progress import Progress
from .optim import build_optimizer, warmup_cosine

__all__ = ["TrainConfig", "EpochSampler", "Trainer", "NonFiniteLossError", "IGNORE_INDEX", "flatten_tokens",
           "evaluate_model", "predict_batches"]

IGNORE_INDEX = -100  # target value of padding in sequence targets (torch's and Hugging Face's convention)


@dataclass
class TrainConfig:
    """How to train; the model and data are given separately."""

    steps: int = field(default=1000, metadata={"min": 1})  # optimizer steps in all
    batch_size: int = field(default=64, metadata={"min": 1})  # samples per step and process (see accum_steps)
    optimizer: Literal["adamw", "sgd"] = "adamw"  # weight decay on matrices only
    lr: float = field(default=1e-3, metadata={"gt": 0.0})  # peak learning rate, after the warm-up
    weight_decay: float = field(default=0.05, metadata={"min": 0.0})  # decoupled (AdamW), matrices only
    momentum: float = field(default=0.9, metadata={"min": 0.0, "lt": 1.0})  # SGD only (Nesterov)
    warmup_steps: int = field(default=0, metadata={"min": 0})  # longer than steps: capped at steps, with a note
    min_lr_ratio: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0})  # the cosine ends at lr * this
    label_smoothing: float = field(default=0.0, metadata={"min": 0.0, "lt": 1.0})  # of the cross-entropy targets
    grad_clip: Optional[float] = field(default=1.0, metadata={"gt": 0.0})  # max gradient norm; null: no clipping
    accum_steps: int = field(default=1, metadata={"min": 1})  # micro-batches per optimizer step
    # autocast: bf16 on CPU and CUDA, fp16 on CUDA only; auto: bf16 where this machine runs it fast
    # (a GPU with bfloat16; a CPU with avx512_bf16/amx_bf16 whose bf16 matmul measures >= 1.5x), else fp32
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "fp32"
    ema_decay: Optional[float] = field(default=None, metadata={"gt": 0.0, "lt": 1.0})  # weights averaged over steps; null: none
    grad_checkpointing: bool = False  # recompute activations in backward: less memory, more time
    channels_last: bool = False  # NHWC weights and image batches: faster convolutions on CPU and CUDA
    compile: bool = False  # train through torch.compile(model); evaluation and checkpoints use the plain module
    compile_mode: Optional[Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]] = None
    seed: int = field(default=0, metadata={"min": 0, "max": 2**32 - 1})  # of the initial weights and the data order
    deterministic: bool = False  # deterministic kernels (bit-exact resume on the CPU)
    device: str = "auto"  # auto, cpu, cuda, cuda:N, mps
    log_every: int = field(default=50, metadata={"min": 0})  # steps between metrics.jsonl records (and step 1); 0: none
    eval_every: int = field(default=0, metadata={"min": 0})  # steps between evaluations on the validation set
    # Stop when the validation accuracy (what picks checkpoints/best) has not improved for this many
    # evaluations in a row (train.eval_every steps apart); null: train to train.steps.
    early_stop: Optional[int] = field(default=None, metadata={"min": 1})
    # Stop once training has taken this many minutes (every session of a resumed run counted); null: no budget.
    max_minutes: Optional[float] = field(default=None, metadata={"gt": 0.0})
    checkpoint_every: int = field(default=0, metadata={"min": 0})  # steps between checkpoints; 0: the last only
    # Batches of similar lengths (text): each epoch's permutation is cut into windows of 50
    # batches, each window sorted by length and cut into batches, and the batches shuffled.
    # Less padding, the same randomness across epochs (Hugging Face's group_by_length).
    group_by_length: bool = False
    keep_checkpoints: int = field(default=2, metadata={"min": 1})  # newest valid step checkpoints kept
    # A step whose loss (or gradient norm) is NaN or infinite stops the run with NonFiniteLossError,
    # before the optimizer applies it, so the last checkpoint holds good weights. With N > 0 up to N
    # such steps in a row are skipped instead (no update; the batch is consumed), as large-scale trainers do.
    skip_nonfinite: int = field(default=0, metadata={"min": 0})
    tensorboard: bool = True  # event files in run_dir/tensorboard, beside metrics.jsonl
    progress: bool = True  # a live bar on a terminal; plain lines every progress_seconds otherwise
    progress_seconds: float = field(default=30.0, metadata={"min": 0.0})  # between plain progress lines in logs
    # Processes that read, decode and transform batches beside training (DataLoader workers); 0: the
    # training process does it. With workers, a batch's random augmentation is seeded by (seed, epoch,
    # batch), so an interrupted run resumes exactly; the draws differ from those of workers=0.
    workers: int = field(default=0, metadata={"min": 0})
    # Under torchrun: ddp (every process holds the whole model), fsdp (each holds 1/N of the weights,
    # gradients and optimizer state; the model's blocks sharded) or auto (fsdp when those would take
    # more than half a process's memory, said in the log). Outside torchrun: one process.
    distributed: Literal["ddp", "fsdp", "auto"] = "auto"

    def __post_init__(self) -> None:
        check_bounds(self, "train")  # also for a TrainConfig built directly in Python
        if self.compile_mode is not None and not self.compile:
            raise InputError(f"train.compile_mode applies only with train.compile=true; got compile_mode="
                             f"{self.compile_mode!r} with compile=false")


class EpochSampler:
    """Batches of indices: a fresh permutation per epoch from ``(seed, epoch)``, the
    last incomplete batch dropped. ``rank``/``world`` take every ``world``-th batch
    element, for data-parallel runs.

    With ``lengths`` (one per sample) batches group samples of similar length: the
    permutation is cut into windows of ``window`` global batches, each window is sorted
    by length and cut into batches, and the order of all batches is shuffled. Still a
    pure function of ``(seed, epoch)``, so resume stays exact."""

    def __init__(self, size: int, batch_size: int, seed: int = 0, rank: int = 0, world: int = 1, *,
                 lengths: Tensor | Sequence[int] | None = None, window: int = 50) -> None:
        if size < batch_size * world:
            raise InputError(f"the dataset has {size} samples, fewer than one global batch ({batch_size} x {world})")
        if lengths is not None and len(lengths) != size:
            raise InputError(f"lengths must have one entry per sample ({size}); got {len(lengths)}")
        self.size, self.batch_size, self.seed, self.rank, self.world = size, batch_size, seed, rank, world
        self.lengths = None if lengths is None else torch.as_tensor(lengths)
        self.window = window

    def __len__(self) -> int:
        return self.size // (self.batch_size * self.world)

    def _order(self, epoch: int) -> Tensor:
        gen = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        order = torch.randperm(self.size, generator=gen)
        if self.lengths is None:
            return order
        span = self.batch_size * self.world
        order = order[: len(self) * span]
        win = span * self.window
        # stable sort inside each window (ties keep their random order), then shuffle whole batches
        grouped = torch.cat([w[torch.argsort(self.lengths[w], stable=True)] for w in order.split(win)])
        return grouped.view(len(self), span)[torch.randperm(len(self), generator=gen)].flatten()

    def batches(self, epoch: int, start: int = 0) -> Iterator[list[int]]:
        order = self._order(epoch)
        span = self.batch_size * self.world
        for b in range(start, len(self)):
            chunk = order[b * span : (b + 1) * span]
            yield chunk[self.rank :: self.world].tolist()


def flatten_tokens(out: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Sequence outputs ``(B, L, V)`` and targets ``(B, L)`` -> ``(B*L, V)`` and ``(B*L,)``;
    classification ``(B, C)`` and ``(B,)`` pass through."""
    if y.dim() >= 2 and out.dim() == y.dim() + 1:
        return out.flatten(0, -2), y.flatten()
    return out, y


def _call(model: nn.Module, x: Any) -> Tensor:
    """``model(**x)`` for a dict of named inputs (text: ``input_ids``, ``attention_mask``), else ``model(x)``."""
    return model(**x) if isinstance(x, dict) else model(x)


def _collate(items: Sequence[tuple[Any, Any]]) -> tuple[Tensor, Tensor]:
    xs, ys = zip(*items)
    return torch.stack(list(xs)), torch.as_tensor(ys)


def _move(x: Any, device: torch.device, channels_last: bool = False) -> Any:
    """A tensor, or a dict of tensors (e.g. ``input_ids`` and ``attention_mask``), to the device."""
    if isinstance(x, dict):
        return {k: _move(v, device, channels_last) for k, v in x.items()}
    x = x.to(device, non_blocking=True)
    if channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def _batch(data: Any, idx: list[int], collate: Callable = _collate) -> tuple[Any, Tensor]:
    """A batch from ``data.get_batch(idx)`` when the data set has one (batched transforms), else collated items."""
    if hasattr(data, "get_batch"):
        return data.get_batch(idx)
    return collate([data[i] for i in idx])


def _as_is(batch: Any) -> Any:
    return batch


class _BatchReader(torch.utils.data.Dataset):
    """What a DataLoader worker runs: item ``(epoch, batch, indices)`` -> the batch and its
    position. The random state is set from ``(seed, epoch, batch)`` first, so that random
    augmentation does not depend on which worker reads a batch, nor on a restart."""

    def __init__(self, data: Any, collate: Callable, seed: int | None) -> None:
        self.data, self.collate, self.seed = data, collate, seed

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, item: tuple[int, int, list[int]]) -> tuple[Any, Tensor, int, int]:
        epoch, batch, idx = item
        if self.seed is not None:
            torch.manual_seed((self.seed * 1_000_003 + epoch) * 1_000_003 + batch)
        x, y = _batch(self.data, idx, self.collate)
        return x, y, epoch, batch


def read_batches(data: Any, items: Iterable[tuple[int, int, list[int]]], workers: int, *,
                 collate: Callable = _collate, seed: int | None = None) -> Iterator[tuple[Any, Tensor, int, int]]:
    """``(x, y, epoch, batch)`` for each ``(epoch, batch, indices)`` of ``items``, in order,
    read by ``workers`` DataLoader processes (``0``: here, one after the other)."""
    reader = _BatchReader(data, collate, seed)
    if workers == 0:
        return (reader[item] for item in items)
    # Its own generator: the loader draws its workers' base seed from it, not from the global
    # stream that dropout uses (which a resumed run restores and must find untouched).
    loader = torch.utils.data.DataLoader(reader, sampler=items, batch_size=None, num_workers=workers,
                                         collate_fn=_as_is, prefetch_factor=4, generator=torch.Generator())
    return iter(loader)


def _eval_sums(model: nn.Module, data: Any, starts: Iterable[int], batch_size: int,
               move: Callable[[Any, Tensor], tuple[Any, Tensor]], device: torch.device, precision: str,
               workers: int = 0, collate: Callable = _collate, counted: int | None = None) -> tuple[float, int, int]:
    """``(summed loss, correct, counted)`` over the batches starting at ``starts``, read by
    ``workers`` DataLoader processes (0: here) and put on the device by ``move(x, y)``;
    ``counted``: only the first that many batches count (the others run for a sharded
    model's collectives alone)."""
    loss_sum, correct, count = 0.0, 0, 0
    items = ((0, i, list(range(start, min(start + batch_size, len(data))))) for i, start in enumerate(starts))
    for x, y, _, i in read_batches(data, items, workers, collate=collate):
        x, y = move(x, y)
        with autocast(device, precision):
            out = _call(model, x)
        if counted is not None and i >= counted:
            continue
        out, y = flatten_tokens(out.float(), y)
        real = y != IGNORE_INDEX
        loss_sum += F.cross_entropy(out, y, reduction="sum", ignore_index=IGNORE_INDEX).item()
        correct += ((out.argmax(-1) == y) & real).sum().item()
        count += int(real.sum())
    return loss_sum, correct, count


@torch.no_grad()
def evaluate_model(model: nn.Module, data: Any, *, batch_size: int = 256, device: str | torch.device = "auto",
                   precision: str = "fp32", channels_last: bool = False, workers: int = 0) -> dict[str, float]:
    """Mean ``loss`` and ``accuracy`` of ``model`` over ``data`` (per sample, or per target
    token for sequence outputs), and ``samples``: exactly what :meth:`Trainer.evaluate`
    computes with the same batch size, precision and memory format, so a finished run's
    test figures can be recomputed to the last digit. ``workers``: DataLoader processes
    that read the batches (the figures do not depend on it)."""
    if len(data) == 0:
        raise InputError("data must hold at least one example to evaluate; it holds none")
    device_ = select_device(device) if isinstance(device, str) else device
    model = model.to(device_).eval()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    move = lambda x, y: (_move(x, device_, channels_last), _move(y, device_))  # noqa: E731
    loss_sum, correct, count = _eval_sums(model, data, range(0, len(data), batch_size), batch_size, move,
                                          device_, precision, workers)
    return {"loss": loss_sum / count, "accuracy": correct / count, "samples": len(data)}


@torch.no_grad()
def predict_batches(model: nn.Module, data: Any, *, batch_size: int = 256, device: str | torch.device = "auto",
                    precision: str = "fp32", channels_last: bool = False) -> Iterator[tuple[Tensor, Tensor]]:
    """``(outputs, targets)`` of ``model`` over ``data``, one batch after the other, read,
    moved and computed as :func:`evaluate_model` does (outputs in float32, on the device;
    targets as the data set gives them), so predictions agree with the figures."""
    device_ = select_device(device) if isinstance(device, str) else device
    model = model.to(device_).eval()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    for start in range(0, len(data), batch_size):
        x, y = _batch(data, list(range(start, min(start + batch_size, len(data)))))
        with autocast(device_, precision):
            out = _call(model, _move(x, device_, channels_last))
        yield out.float(), y


class Trainer:
    """``Trainer(model, train_data, config, eval_data=..., run_dir=...).fit()``.

    ``loss_fn(outputs, targets)`` defaults to cross-entropy with the configured label
    smoothing. ``lr_scales`` (``{parameter name prefix: multiplier}``, see
    :func:`~attnlab.engine.optim.param_groups`) gives parts of the model other rates;
    parameters with ``requires_grad=False`` are not trained. Checkpoints go to
    ``run_dir/checkpoints`` and metrics to ``run_dir/metrics.jsonl`` when ``run_dir`` is given.

    ``base``: the model's frozen parameters (``requires_grad=False``) come from weights
    kept elsewhere, which ``base`` describes (JSON-ready: a file and its sha256): checkpoints
    then hold the trainable parameters and the buffers alone, with ``base`` in their
    manifest (:func:`~attnlab.engine.checkpoint.checkpoint_base`), and :meth:`resume`
    expects the model to hold those frozen weights already. LoRA runs use it: a
    checkpoint of adapters over a 110 M-parameter model takes megabytes.

    Data-parallel under torchrun (after :func:`~attnlab.engine.distributed.init_distributed`):
    ``batch_size`` is per process, each rank trains on its share of every global batch of
    ``batch_size x world`` through DistributedDataParallel, and rank 0 alone logs and writes.
    With ``distributed: fsdp`` (:mod:`~attnlab.engine.sharding`) the model is sharded instead
    and the checkpoints are sharded: every process writes its shards.
    """

    def __init__(self, model: nn.Module, train_data: Any, config: TrainConfig, *, eval_data: Any = None,
                 run_dir: str | Path | None = None, loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
                 collate: Callable[[Sequence[Any]], tuple[Tensor, Tensor]] = _collate, log: Callable[[str], None] = print,
                 lr_scales: dict[str, float] | None = None, base: dict[str, Any] | None = None) -> None:
        self.cfg = config
        self.base = base
        seed_everything(config.seed, config.deterministic)
        self.device = distributed.local_device(config.device)  # select_device, or this rank's device under torchrun
        self.model = model.to(self.device)
        if config.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        if config.grad_checkpointing:
            if not hasattr(model, "set_grad_checkpointing"):
                raise InputError(f"grad_checkpointing: {type(model).__name__} has no set_grad_checkpointing()")
            model.set_grad_checkpointing(True)
        self.train_data, self.eval_data, self.collate = train_data, eval_data, collate
        # Modules with a loss of their own (DeepSeek's sparse attention's indexer): `take_aux_loss()`
        # returns what their last training forward kept (already weighted) or None, and forgets it.
        self._aux_modules = [m for m in model.modules() if callable(getattr(m, "take_aux_loss", None))]
        self.log = log if distributed.is_main() else (lambda _msg: None)  # rank 0 alone logs and writes
        self.loss_fn = loss_fn or (
            lambda out, y: F.cross_entropy(*flatten_tokens(out, y), ignore_index=IGNORE_INDEX,
                                           label_smoothing=config.label_smoothing)
        )
        self.precision, why = resolve_precision(config.precision, self.device)
        if config.precision == "auto":
            self.log(f"precision auto: {self.precision} ({why})")
        self.mode, why = choose_mode(config.distributed, model, config.optimizer, self.device)
        if config.distributed == "auto" and self.mode != "single":
            self.log(f"train.distributed auto: {self.mode} ({why})")
        if self.mode == "fsdp":
            for key, value in (("ema_decay", config.ema_decay), ("compile", config.compile)):
                if value:
                    raise InputError(f"train.{key} is not supported with train.distributed=fsdp (an EMA copy or a "
                                     f"compiled graph of a sharded model); leave train.{key} out, or use "
                                     f"train.distributed=ddp")
            apply_fsdp(self.model, self.precision)  # before the optimizer: it steps the shards
        lengths = getattr(train_data, "lengths", None) if config.group_by_length else None
        if config.group_by_length and lengths is None:
            raise InputError(f"train.group_by_length needs a data set with per-sample lengths; "
                             f"{type(train_data).__name__} has no 'lengths'")
        self.sampler = EpochSampler(len(train_data), config.batch_size, config.seed,
                                    rank=distributed.rank(), world=distributed.world_size(), lengths=lengths)
        self.optimizer = build_optimizer(model, config.optimizer, config.lr, config.weight_decay,
                                         momentum=config.momentum, lr_scales=lr_scales)
        warmup = min(config.warmup_steps, config.steps)
        if warmup < config.warmup_steps:  # a recipe shortened with train.steps=N keeps working
            self.log(f"note: train.warmup_steps={config.warmup_steps} is longer than train.steps={config.steps}; "
                     f"the warm-up is capped at {warmup} steps")
        self.scheduler = warmup_cosine(self.optimizer, config.steps, warmup, config.min_lr_ratio)
        self.scaler = make_grad_scaler(self.device, self.precision)
        self.ema = copy.deepcopy(model).eval().requires_grad_(False) if config.ema_decay else None
        self.step, self.epoch, self.batch_in_epoch = 0, 0, 0
        self._nonfinite_in_a_row = 0  # steps skipped in a row for a non-finite loss (train.skip_nonfinite)
        self.held: dict[str, int] | None = None  # fsdp: the bytes this process holds, at this session's first step
        self._saved_step: int | None = None  # the step whose checkpoint run_dir already holds
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.metrics: MetricsLog | None = None
        self.tensorboard: TensorBoardLog | None = None
        self.best: float | None = None  # best evaluation accuracy so far; its weights are checkpoints/best
        self.best_step: int | None = None  # the step of that evaluation
        self.stale_evals = 0  # evaluations in a row since `best` last improved (train.early_stop)
        self.stopped: str | None = None  # why fit ended before train.steps, in words (None: it did not)
        if config.early_stop is not None and (eval_data is None or not config.eval_every):
            why = "this run has no validation part" if eval_data is None else "train.eval_every=0"
            self.log(f"note: train.early_stop={config.early_stop} counts evaluations on the validation part, and "
                     f"{why}: the run trains to train.steps={config.steps}")
        self.train_seconds = 0.0  # training wall time over all sessions of a resumed run
        self._fit_start: float | None = None
        # Under torchrun: train_step runs the DDP wrapper (gradients averaged over ranks);
        # self.model stays the plain module for state_dict, checkpoints and evaluation.
        self.train_model: nn.Module = self.model
        if self.mode == "ddp" and distributed.world_size() > 1:
            self.train_model = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        if config.compile:  # compiles on the first step; shares self.model's parameters, so no "_orig_mod." keys
            self.train_model = torch.compile(self.train_model, mode=config.compile_mode)

    # ----------------------------------------------------------------- state
    def state(self) -> dict[str, Any]:
        state = {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "best": self.best,
                 "best_step": self.best_step, "stale_evals": self.stale_evals,
                 "train_seconds": self.train_seconds + self._session_seconds(),
                 "nonfinite_in_a_row": self._nonfinite_in_a_row,
                 "scheduler": self.scheduler.state_dict(),
                 "scaler": self.scaler.state_dict(), "rng": capture_rng_state(), "config": asdict(self.cfg)}
        if self.mode != "fsdp":  # a sharded checkpoint holds the optimizer's state in its shards
            state["optimizer"] = self.optimizer.state_dict()
        if self.ema is not None:
            state["ema"] = self._saved(self.ema.state_dict())
        return state

    def _frozen(self) -> set[str]:
        """The state-dict keys that checkpoints leave out: the frozen parameters, with ``base``."""
        if self.base is None:
            return set()
        return {n for n, p in self.model.named_parameters(remove_duplicate=False) if not p.requires_grad}

    def _saved(self, weights: dict[str, Tensor]) -> dict[str, Tensor]:
        """What a checkpoint keeps of a state dict (of the model or its EMA: the same keys)."""
        frozen = self._frozen()
        return {k: v for k, v in weights.items() if k not in frozen} if frozen else weights

    def save(self) -> Path:
        """Checkpoint the current step. Under torchrun every rank calls it, rank 0 alone writes."""
        if self.run_dir is None:
            raise InputError("save needs a run_dir")
        folder = self.run_dir / "checkpoints" / f"step_{self.step:09d}"
        if self._saved_step == self.step:  # written by fit, or resumed from: rewriting it would only
            return folder                  # open a window in which a kill loses it
        self._check_weights("checkpoint")
        if self.mode == "fsdp":
            frozen = self._frozen()
            folder = save_sharded_checkpoint(
                self.run_dir / "checkpoints", folder.name, self.step,
                lambda shards: save_sharded(shards, self.model, self.optimizer, skip=frozen), self.state(),
                keep=self.cfg.keep_checkpoints, base=self.base)
        elif distributed.is_main():
            folder = save_checkpoint(self.run_dir / "checkpoints", self.step, self._saved(self.model.state_dict()),
                                     self.state(), keep=self.cfg.keep_checkpoints, base=self.base)
        distributed.barrier()  # no rank runs ahead of a checkpoint being written
        self._saved_step = self.step
        return folder

    def resume(self, folder: str | Path | None = None) -> None:
        """Continue from ``folder``, or from the newest valid checkpoint of ``run_dir`` (the one
        rank 0 finds, under torchrun: every rank loads the same)."""
        if folder is None:
            found = latest_checkpoint(self.run_dir / "checkpoints") if self.run_dir and distributed.is_main() else None
            if self.run_dir is None or (folder := distributed.broadcast_object(found)) is None:
                raise InputError(f"no checkpoint to resume from in {self.run_dir}")
        if self.mode == "fsdp" or is_sharded_checkpoint(folder):
            state = self._resume_sharded(Path(folder))
        else:
            weights, state = load_checkpoint(folder, map_location=self.device)
            load_weights_into(self.model, weights, folder, base_keys=self._frozen())
        try:
            if "optimizer" in state:
                self.optimizer.load_state_dict(state["optimizer"])
        except ValueError as exc:  # torch: "... doesn't match the size of optimizer's group"
            raise CheckpointError(f"{folder}: its optimizer state does not fit this model's parameters ({exc}): "
                                  f"it was written by an earlier attnlab whose model held its weights in other "
                                  f"parameters (exact attention packed its query, key and value projections in "
                                  f"one); the weights load (eval, predict, and model.checkpoint={self.run_dir} to "
                                  f"start a new run from them), the training cannot resume") from None
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None and "ema" in state:
            load_weights_into(self.ema, state["ema"], folder, base_keys=self._frozen())
        self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        self.best = state.get("best")
        self.best_step = state.get("best_step")
        self.stale_evals = state.get("stale_evals", 0)
        self.train_seconds = state.get("train_seconds", 0.0)
        self._nonfinite_in_a_row = state.get("nonfinite_in_a_row", 0)
        restore_rng_state(state["rng"])
        if self.run_dir is not None and Path(folder).parent == self.run_dir / "checkpoints":
            self._saved_step = self.step  # this run's own checkpoint: save() need not write it again

    def _resume_sharded(self, folder: Path) -> dict[str, Any]:
        """Load a sharded checkpoint (written by any number of processes) into this sharded
        model and its optimizer; returns the rest of its state."""
        if not is_sharded_checkpoint(folder) or self.mode != "fsdp":
            have = "sharded" if is_sharded_checkpoint(folder) else "a whole model's"
            raise CheckpointError(f"{folder} holds {have} checkpoint, and this run trains with train.distributed="
                                  f"{self.cfg.distributed} ({self.mode}): resume a sharded run under torchrun with "
                                  f"train.distributed=fsdp (any number of processes), a data-parallel run as it "
                                  f"trained; its weights load anywhere (model.checkpoint={self.run_dir})")
        _, state = load_checkpoint(folder, map_location="cpu", weights=False)
        load_sharded(folder, self.model, self.optimizer, skip=self._frozen())
        return state

    # ----------------------------------------------------------------- loop
    def _batches(self) -> Iterator[tuple[Any, Tensor]]:
        """The training batches from the current position on, on the device. The position
        (``epoch``, ``batch_in_epoch``) advances as each batch is taken, not as workers read
        ahead, so a checkpoint records the batches that were trained on."""
        def positions() -> Iterator[tuple[int, int, list[int]]]:
            epoch, start = self.epoch, self.batch_in_epoch
            while True:
                for b, idx in enumerate(self.sampler.batches(epoch, start), start):
                    yield epoch, b, idx
                epoch, start = epoch + 1, 0

        seed = self.cfg.seed if self.cfg.workers else None  # workers=0 keeps the global random stream
        for x, y, epoch, b in read_batches(self.train_data, positions(), self.cfg.workers, collate=self.collate,
                                           seed=seed):
            self.epoch, self.batch_in_epoch = epoch, b + 1
            if self.batch_in_epoch == len(self.sampler):
                self.epoch, self.batch_in_epoch = epoch + 1, 0
            yield self._move(x, y)

    def _move(self, x: Any, y: Tensor) -> tuple[Any, Tensor]:
        return _move(x, self.device, self.cfg.channels_last), y.to(self.device, non_blocking=True)

    def _aux_loss(self) -> Tensor | float:
        """The sum of the modules' own losses from the forward just run (0.0 when none)."""
        losses = [loss for m in self._aux_modules if (loss := m.take_aux_loss()) is not None]
        return sum(losses[1:], losses[0]) if losses else 0.0

    def train_step(self, batches: Iterator[tuple[Any, Tensor]]) -> float:
        cfg = self.cfg
        self.train_model.train()
        total = 0.0
        for i in range(cfg.accum_steps):
            x, y = next(batches)
            # DDP: gradients are all-reduced once, in the last micro-batch's backward
            last = i == cfg.accum_steps - 1 or distributed.world_size() == 1  # (train_model may be compiled)
            if self.mode == "fsdp":  # FSDP: gradients reduce-scattered in the last micro-batch's backward alone
                self.model.set_requires_gradient_sync(last)
            with contextlib.nullcontext() if last or self.mode == "fsdp" else self.train_model.no_sync():
                with autocast(self.device, self.precision):
                    task = self.loss_fn(_call(self.train_model, x), y) / cfg.accum_steps
                    loss = task + self._aux_loss() / cfg.accum_steps
                self.scaler.scale(loss).backward()
            total += task.item()  # the task's loss is what the log and the metrics show
        finite = math.isfinite(total)
        if finite:  # the gradient norm is checked with clipping or without (max_norm inf: the norm alone)
            self.scaler.unscale_(self.optimizer)
            norm = whole_tensor(nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip or math.inf))
            # fp16's scaler skips steps with inf gradients itself; elsewhere they are divergence
            finite = self.scaler.is_enabled() or bool(torch.isfinite(norm))
        if distributed.world_size() > 1:  # every rank takes the same decision
            finite = distributed.all_reduce_sum(torch.tensor([float(not finite)], device=self.device)).item() == 0
        if not finite:
            self._skip_nonfinite(total)
            return total
        self._nonfinite_in_a_row = 0
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.mode == "fsdp" and self.held is None:  # the first step: gradients and optimizer state exist now
            self.held = held_bytes(self.model, self.optimizer)
            self.log("this process holds " + ", ".join(f"{v / 2**20:,.2f} MiB of {k}" for k, v in self.held.items())
                     + f" (its share of {distributed.world_size()} processes)")
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        if self.ema is not None:
            with torch.no_grad():
                for e, p in zip(self.ema.state_dict().values(), self.model.state_dict().values()):
                    if e.is_floating_point():
                        e.lerp_(p, 1 - cfg.ema_decay)
                    else:  # counters such as BatchNorm's num_batches_tracked
                        e.copy_(p)
        self.step += 1
        return total

    def _skip_nonfinite(self, loss: float) -> None:
        """A step with a non-finite loss or gradient: no update. Stop (the default), or
        skip it while fewer than ``skip_nonfinite`` such steps came in a row."""
        self.optimizer.zero_grad(set_to_none=True)
        self._nonfinite_in_a_row += 1
        what = f"loss {loss}" if not math.isfinite(loss) else "gradient norm not finite"
        if self._nonfinite_in_a_row > self.cfg.skip_nonfinite:
            in_a_row = f" ({self._nonfinite_in_a_row} such steps in a row)" if self._nonfinite_in_a_row > 1 else ""
            raise NonFiniteLossError(
                f"training diverged at step {self.step + 1}: {what}{in_a_row}; the weights were not updated"
                f"{self._last_good()}. Lower train.lr, set train.grad_clip, or set train.skip_nonfinite=N to skip up "
                f"to N such steps")
        self.log(f"warning: step {self.step + 1}: {what}; skipped without an update "
                 f"({self._nonfinite_in_a_row} of at most {self.cfg.skip_nonfinite} in a row)")
        self.scheduler.step()  # the step is consumed, so a resumed run replays the same schedule
        self.step += 1

    def _last_good(self) -> str:
        """Which checkpoint a diverged run leaves to the user (empty without one)."""
        if self._saved_step is None or self.run_dir is None:
            return ""
        where = f"checkpoint step {self._saved_step} in {self.run_dir / 'checkpoints'}"
        if self._saved_step == self.step:  # the very weights whose loss or gradient was not finite
            return (f"; {where} holds these weights (finite, but they gave this step's non-finite values): an "
                    f"earlier checkpoint, if kept, is the last one known to train")
        return f"; {where} holds the last good weights"

    def _check_weights(self, what: str) -> None:
        """Refuse to write a ``what`` (checkpoint) whose weights (or EMA weights) hold a NaN
        or an infinity: :class:`NonFiniteLossError`. An update with finite gradients can
        still overflow a weight, so the gradient check alone does not guarantee this."""
        for label, module in (("weights", self.model), ("EMA weights", self.ema)):
            if module is None:
                continue
            summary = nonfinite_summary({k: local_tensor(v) for k, v in module.state_dict().items()})
            if self.mode == "fsdp":  # each process sees its shards: all decide together
                bad = distributed.all_reduce_sum(torch.tensor([float(summary is not None)], device=self.device))
                if bad.item() and summary is None:
                    summary = ("some", "the shards of another process")
            if summary is not None:
                count, names = summary
                raise NonFiniteLossError(
                    f"training diverged by step {self.step}: {count} {label} tensors hold NaN or infinity ({names}); "
                    f"no {what} was written{self._last_good()}. Lower train.lr or set train.grad_clip")

    @torch.no_grad()
    def evaluate(self, data: Any = None, model: nn.Module | None = None) -> dict[str, float]:
        """Mean loss and accuracy over ``data`` (default: eval_data): per sample for
        classification, per target token (padding left out) for sequence outputs.

        Under torchrun a collective: every rank must call it; each evaluates every
        ``world``-th batch and all get the summed result."""
        data = self.eval_data if data is None else data
        if len(data) == 0:
            raise InputError("eval_data must hold at least one example to evaluate; it holds none")
        model = (model or self.ema or self.model).eval()
        world, bs = distributed.world_size(), self.cfg.batch_size
        starts = list(range(distributed.rank() * bs, len(data), bs * world))
        counted = len(starts)
        if self.mode == "fsdp":  # every process takes part in every forward: those without a batch left repeat one
            starts += [0] * (-(-len(data) // (bs * world)) - counted)
        loss_sum, correct, count = _eval_sums(model, data, starts, bs, self._move, self.device, self.precision,
                                              self.cfg.workers, self.collate, counted=counted)
        if world > 1:
            sums = distributed.all_reduce_sum(torch.tensor([loss_sum, correct, count], dtype=torch.float64,
                                                           device=self.device))
            loss_sum, correct, count = sums[0].item(), sums[1].item(), sums[2].item()
        return {"loss": loss_sum / count, "accuracy": correct / count}

    def record_evaluation(self, result: dict[str, float], **extra: Any) -> bool:
        """Log an evaluation (metrics.jsonl, TensorBoard) and keep ``checkpoints/best`` when
        its accuracy beats every earlier one. Returns whether it was the best so far."""
        if self.metrics:
            self.metrics.log(self.step, kind="eval", **extra, **result)
        if self.tensorboard:
            self.tensorboard.log(self.step, "eval", result)
        score = result.get("accuracy")
        improved = score is not None and (self.best is None or score > self.best)
        if score is not None:
            self.stale_evals = 0 if improved else self.stale_evals + 1
        if improved:
            self._check_weights("best checkpoint")  # NaN weights score by chance: never keep them as best
            self.best, self.best_step = score, self.step
            if self.run_dir is not None and self.mode == "fsdp":
                frozen = self._frozen()
                save_sharded_checkpoint(self.run_dir / "checkpoints", "best", self.step,
                                        lambda shards: save_sharded(shards, self.model, None, skip=frozen),
                                        {"step": self.step, "eval": result}, base=self.base)
            elif self.run_dir is not None and distributed.is_main():
                save_named_checkpoint(self.run_dir / "checkpoints", "best", self.step,
                                      self._saved((self.ema or self.model).state_dict()),
                                      {"step": self.step, "eval": result}, base=self.base)
        return improved

    def _session_seconds(self) -> float:
        """Seconds since this process's ``fit`` started (0 outside ``fit``)."""
        return 0.0 if self._fit_start is None else time.perf_counter() - self._fit_start

    def _open_logs(self) -> None:
        if self.run_dir is None or not distributed.is_main():
            return
        if self.metrics is None:
            self.metrics = MetricsLog.open(self.run_dir / "metrics.jsonl", resume_step=self.step)
        if self.tensorboard is None and self.cfg.tensorboard:
            self.tensorboard = TensorBoardLog(self.run_dir / "tensorboard", resume_step=self.step)

    def close(self) -> None:
        """Close the metrics and TensorBoard files (``fit`` leaves them open for a final evaluation)."""
        for log in (self.metrics, self.tensorboard):
            if log is not None:
                log.close()
        self.metrics = self.tensorboard = None

    def fit(self) -> dict[str, Any]:
        """Train to ``config.steps``, evaluating, logging and checkpointing on the way.
        Returns ``steps``, ``train_seconds``, ``samples_per_s`` and the last evaluation."""
        cfg = self.cfg
        self._open_logs()
        batches = self._batches()
        start, first = time.perf_counter(), self.step
        self._fit_start = start
        world = distributed.world_size()
        per_step = cfg.batch_size * cfg.accum_steps * world  # global samples per optimizer step
        show = cfg.progress and distributed.is_main()
        budget = None if cfg.max_minutes is None else 60 * cfg.max_minutes - self.train_seconds
        progress = Progress(cfg.steps, start_step=self.step, every=cfg.progress_seconds, budget=budget) \
            if show else None
        say = progress.write if progress else self.log
        result: dict[str, Any] = {}
        try:
            while self.step < cfg.steps:
                if (reason := self._stop_reason()) is not None:  # checked first: a resumed run may be done
                    self.stopped = reason
                    say(f"stopped at step {self.step} of {cfg.steps}: {reason}")
                    break
                loss = self.train_step(batches)
                if progress:
                    progress.update(1, per_step, loss=loss)
                # step 1 too: the curves start from the untrained loss, not from log_every's first record
                if cfg.log_every and (self.step % cfg.log_every == 0 or self.step in (1, cfg.steps)):
                    if world > 1:  # the global batch's loss: the mean of the ranks'
                        loss = distributed.all_reduce_sum(torch.tensor([loss], device=self.device)).item() / world
                    rate = (self.step - first) * per_step / (time.perf_counter() - start)
                    lr = self.optimizer.param_groups[0]["lr"]
                    if not progress:
                        self.log(f"step {self.step}/{cfg.steps}  loss {loss:.4f}  lr {lr:.3g}  {rate:,.0f} samples/s")
                    values = {"loss": loss, "lr": lr, "samples_per_s": rate}
                    if self.metrics:
                        self.metrics.log(self.step, **values, elapsed_s=self.train_seconds + self._session_seconds())
                    if self.tensorboard:
                        self.tensorboard.log(self.step, "train", values)
                if self.eval_data is not None and cfg.eval_every and self.step % cfg.eval_every == 0:
                    result = self.evaluate()
                    say(f"step {self.step}/{cfg.steps}  eval " + "  ".join(f"{k} {v:.4f}" for k, v in result.items()))
                    self.record_evaluation(result, elapsed_s=self.train_seconds + self._session_seconds())
                if self.run_dir is not None and cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                    self.save()
        finally:
            if progress:
                progress.close()
        elapsed = time.perf_counter() - start
        self.train_seconds += elapsed
        self._fit_start = None
        return {"steps": self.step, "train_seconds": self.train_seconds, "precision": self.precision,
                "samples_per_s": self.step * per_step / max(self.train_seconds, 1e-9), "stopped": self.stopped,
                **result}

    def _stop_reason(self) -> str | None:
        """Why training ends now, before ``train.steps``: ``train.early_stop`` evaluations in
        a row without a better validation accuracy, or ``train.max_minutes`` of training
        spent (counted over every session of a resumed run, as the checkpoints record it).
        ``None``: go on. Under torchrun every rank takes rank 0's decision."""
        cfg = self.cfg
        if cfg.early_stop is not None and self.eval_data is not None and cfg.eval_every and \
                self.stale_evals >= cfg.early_stop:
            return (f"the validation accuracy has not improved for {self.stale_evals} evaluations (train.early_stop="
                    f"{cfg.early_stop}); the best, {self.best:.4f}, was at step {self.best_step}")
        if cfg.max_minutes is None:
            return None
        used = self.train_seconds + self._session_seconds()
        spent = used >= 60 * cfg.max_minutes
        if distributed.world_size() > 1:  # the ranks' clocks differ: rank 0's decides
            spent = bool(distributed.broadcast_object(spent))
        if spent:
            return f"the time budget is spent (train.max_minutes={cfg.max_minutes:g}; {used / 60:.1f} minutes trained)"
        return None
