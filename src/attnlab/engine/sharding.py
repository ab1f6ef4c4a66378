"""Sharded data parallelism (``train.distributed: fsdp``): PyTorch's FSDP2
(``torch.distributed.fsdp.fully_shard``) under ``torchrun``, with sharded checkpoints written
through ``torch.distributed.checkpoint`` (DCP).

Data-parallel training (``ddp``) keeps the whole model, its gradients and its optimizer state
in every process. FSDP keeps ``1/N`` of each in each of ``N`` processes: a block's parameters
are gathered just before its forward (and again before its backward) and freed after, its
gradients reduce-scattered so that each process keeps the share of the parameters it owns,
and the optimizer updates that share alone. What a process holds is then about
``(weights + gradients + optimizer state) / N`` plus one block's whole weights and the
activations, which is what lets a model train past one device's memory.

Which modules are the blocks is the model's to say: a model that can be sharded has a method
``shard_blocks()`` returning them (a decoder's layers, a ViT's blocks); each becomes one unit
of gathering, and the model itself the unit of what is left (embeddings, the final norm, the
head). The engine names no model.

``train.distributed: auto`` chooses: data-parallel, unless the weights, gradients and
optimizer state would take more than :data:`AUTO_SHARE` of one device's memory (a CPU process's
share of the machine's memory: its memory over the processes on the node), which is said in
the log.

A sharded checkpoint is a DCP folder (``.metadata`` and one ``__<rank>_0.distcp`` file a
process) holding the model's and the optimizer's state under ``model`` and ``optimizer``;
:mod:`attnlab.engine.checkpoint` adds ``state.pt`` and the manifest. DCP records each tensor's
global shape and each shard's place in it, so a checkpoint loads into any number of processes
(:func:`load_sharded`, ``2 -> 1``, ``1 -> 2``, ``2 -> 4``) and into a plain model without a
process group (:func:`read_sharded_weights`, what ``load_run``, ``eval`` and ``export`` use).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Collection

import torch
from torch import Tensor, nn

from ..errors import InputError
from . import distributed

__all__ = ["AUTO_SHARE", "MODES", "shard_blocks", "training_bytes", "choose_mode", "apply_fsdp", "is_sharded",
           "local_tensor", "sharded_state", "load_sharded", "save_sharded", "read_sharded_weights",
           "held_bytes", "whole_copy", "whole_tensor"]

MODES = ("ddp", "fsdp", "auto")
AUTO_SHARE = 0.5  # auto shards when weights + gradients + optimizer state pass this share of a device's memory
_OPTIMIZER_COPIES = {"adamw": 2, "sgd": 1}  # float32 tensors the optimizer keeps per trainable parameter


def shard_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks ``model`` says it is made of (its ``shard_blocks()``), refused in one line
    when it names none."""
    get = getattr(model, "shard_blocks", None)
    blocks = list(get()) if callable(get) else []
    if not blocks:
        raise InputError(f"train.distributed=fsdp shards a model block by block, and {type(model).__name__} names "
                         f"no blocks (it has no shard_blocks()); use train.distributed=ddp")
    return blocks


def training_bytes(model: nn.Module, optimizer: str) -> int:
    """The bytes of ``model``'s weights, the gradients of its trainable ones and the state
    ``optimizer`` keeps for them (AdamW: two moments; SGD: one momentum), float32."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return weights + trainable * (1 + _OPTIMIZER_COPIES.get(optimizer, 2))


def _device_bytes(device: torch.device) -> int:
    """One process's share of its device's memory: a GPU's whole memory, or the machine's
    memory over the processes torchrun started on it."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return pages * size // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def choose_mode(setting: str, model: nn.Module, optimizer: str, device: torch.device) -> tuple[str, str]:
    """``(mode, why)``: ``"single"`` outside torchrun; else ``ddp`` or ``fsdp`` as ``setting``
    says, ``auto`` choosing by :func:`training_bytes` against :data:`AUTO_SHARE` of the device."""
    if setting not in MODES:
        raise InputError(f"train.distributed must be one of {', '.join(MODES)}; got {setting!r}")
    if not distributed.launched():
        if setting == "fsdp":
            raise InputError("train.distributed=fsdp shards the model over the processes torchrun starts; launch "
                             "with torchrun --nproc_per_node N -m attnlab.cli train ... (or leave it at auto)")
        return "single", "one process"
    if setting != "auto":
        return setting, f"train.distributed={setting}"
    need, have = training_bytes(model, optimizer), _device_bytes(device)
    words = (f"weights, gradients and optimizer state take {need / 2**30:.2f} GiB, "
             f"{100 * need / have:.0f}% of a process's {have / 2**30:.1f} GiB")
    if need > AUTO_SHARE * have:
        return "fsdp", f"{words}: more than {100 * AUTO_SHARE:.0f}%, sharded"
    return "ddp", f"{words}: data-parallel"


def apply_fsdp(model: nn.Module, precision: str) -> None:
    """Shard ``model`` in place, block by block and then the rest, with the mixed-precision
    policy of ``precision``: parameters gathered in bfloat16 (or float16) for the forward
    and backward where it says so, gradients reduced in float32."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # public from torch 2.6 on
        raise InputError(f"train.distributed=fsdp needs FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.6); "
                         f"this is torch {torch.__version__}: use train.distributed=ddp") from None
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
    for block in shard_blocks(model):
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` was sharded by :func:`apply_fsdp`."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch < 2.6: nothing was sharded
        return False
    return isinstance(model, FSDPModule)


def local_tensor(t: Tensor) -> Tensor:
    """This process's shard of a sharded tensor (a DTensor), or ``t`` itself."""
    return t.to_local() if _is_dtensor(t) else t


def whole_tensor(t: Tensor) -> Tensor:
    """The whole of a sharded tensor (a DTensor; a collective), or ``t`` itself."""
    return t.full_tensor() if _is_dtensor(t) else t


def _is_dtensor(t: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.5: no public DTensor, and no FSDP2 to make one
        return False
    return isinstance(t, DTensor)


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """What this process holds of the weights, gradients and optimizer state, in bytes (its
    shards, when sharded)."""
    def size(t: Tensor | None) -> int:
        return 0 if t is None else local_tensor(t).numel() * local_tensor(t).element_size()

    params = list(model.parameters())
    state = sum(size(v) for s in optimizer.state.values() for v in s.values() if isinstance(v, Tensor) and v.dim())
    return {"weights": sum(size(p) for p in params), "gradients": sum(size(p.grad) for p in params),
            "optimizer": state}


def sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer | None,
                  skip: Collection[str] = ()) -> dict[str, Any]:
    """``{"model": ..., "optimizer": ...}`` as DCP saves and loads them (each process's
    shards), without the weights ``skip`` names (the frozen weights a LoRA run keeps elsewhere)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    weights = get_model_state_dict(model)
    state: dict[str, Any] = {"model": {k: v for k, v in weights.items() if k not in skip}}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    return state


def save_sharded(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None, *,
                 skip: Collection[str] = ()) -> None:
    """Every process writes its shards of the model (and the optimizer) into ``folder``; a
    collective."""
    import torch.distributed.checkpoint as dcp

    dcp.save(sharded_state(model, optimizer, skip), checkpoint_id=str(folder))


def load_sharded(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None, *,
                 skip: Collection[str] = ()) -> None:
    """Load a sharded checkpoint, written by any number of processes, into this sharded
    ``model`` (and ``optimizer``); a collective. ``skip``: weights the checkpoint leaves out,
    which the model holds already."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    state = sharded_state(model, optimizer, skip)
    dcp.load(state, checkpoint_id=str(folder))
    set_model_state_dict(model, state["model"], options=StateDictOptions(strict=not skip))
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optimizer"])


def read_sharded_weights(folder: Path) -> dict[str, Tensor]:
    """The whole weights of a sharded checkpoint, read in one process without a process
    group: each tensor made at the global shape the checkpoint's index gives and filled from
    every process's shards."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    index = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    weights = {key.removeprefix("model."): torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
               for key, meta in index.items() if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)}
    with warnings.catch_warnings():  # DCP says it loads in one process: what no_dist asks for
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": weights}, checkpoint_id=str(folder), no_dist=True)
    return weights


def whole_copy(model: nn.Module, build: Any) -> nn.Module | None:
    """A plain model (``build()``) holding the whole weights of the sharded ``model``, on
    rank 0 (``None`` on the others): for what one process does alone with a model, such as
    a task's scoring, whose decoding reads weights outside the forward. A collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not distributed.is_main():
        return None
    plain = build()
    plain.load_state_dict(weights)
    return plain
