"""Training checkpoints that lose nothing and load no code.

Layout of one checkpoint, a folder ``<root>/step_<N>/``::

    model.safetensors   the weights (tied weights stored once, re-tied on load)
    state.pt            optimizer, scheduler, RNG and data-position state; plain
                        tensors and containers only, read with weights_only=True
    manifest.json       step and sha256 of both files; written last; for weights that
                        leave out frozen ones held elsewhere (LoRA adapters over a
                        pretrained model), ``base``: where those are and their sha256

A sharded checkpoint (``train.distributed: fsdp``, :mod:`attnlab.engine.sharding`) holds,
instead of ``model.safetensors``, the shards every process wrote through
``torch.distributed.checkpoint`` (``.metadata`` and ``__<rank>_0.distcp``: the model's weights
and the optimizer's state), and its manifest says ``"sharded": {"world": N}`` and gives the
sha256 of every file. :func:`save_sharded_checkpoint` writes it (every process calls it);
:func:`load_checkpoint` reads its weights whole, in one process.

Besides the numbered ``step_<N>`` folders a run keeps ``best/`` (the weights with the
best evaluation so far), replaced as a whole by :func:`save_named_checkpoint`;
:func:`resolve_checkpoint` turns ``"last"``, ``"best"`` or a path into a folder.

Every file is written atomically (:func:`attnlab.io.atomic_write`) and the manifest
last, so a folder without a valid manifest is an interrupted save and is ignored by
:func:`latest_checkpoint`. A checkpoint whose files do not match their checksums (a
truncated or corrupted file) raises :class:`CheckpointError`; older checkpoints are kept
(``keep``) and still load.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import warnings
from pathlib import Path
from typing import Any, Collection

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError
from ..jsonfile import parse_json, read_json
from ..io import atomic_write_bytes, read_json_mapping, sha256_file, torch_load_safely

__all__ = [
    "CheckpointError",
    "save_checkpoint",
    "save_sharded_checkpoint",
    "is_sharded_checkpoint",
    "load_checkpoint",
    "list_checkpoints",
    "latest_checkpoint",
    "save_named_checkpoint",
    "resolve_checkpoint",
    "checkpoint_step",
    "load_weights_into",
    "nonfinite_tensors",
    "nonfinite_summary",
    "check_finite",
    "checkpoint_label",
    "checkpoint_base",
    "capture_rng_state",
    "restore_rng_state",
]

WEIGHTS, STATE, MANIFEST = "model.safetensors", "state.pt", "manifest.json"
SHARDS = ".metadata"  # a sharded checkpoint's index of its shards (torch.distributed.checkpoint's)


class CheckpointError(InputError):
    """A checkpoint that is incomplete, corrupted or not one."""


def _untie(weights: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """safetensors refuses tensors that share memory: keep one name per tensor and
    remember the others as aliases."""
    seen: dict[tuple, str] = {}
    unique, aliases = {}, {}
    for name, t in weights.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            unique[name] = t.detach().contiguous().cpu()
    return unique, aliases


def save_checkpoint(root: str | Path, step: int, weights: dict[str, Tensor], state: dict[str, Any],
                    *, keep: int = 2, base: dict[str, Any] | None = None) -> Path:
    """Write checkpoint ``step`` under ``root`` and keep the newest ``keep`` valid ones.

    ``weights``: a model's ``state_dict()``. ``state``: anything ``torch.load`` reads
    back with ``weights_only=True`` (tensors, numbers, strings, lists, dicts), e.g.
    ``{"optimizer": opt.state_dict(), "rng": capture_rng_state(), "epoch": 3}``.
    ``base``: JSON-ready data recorded in the manifest (:func:`checkpoint_base`) when
    ``weights`` leave out frozen weights kept elsewhere: what they are and their checksums.

    Pruning removes only checkpoints older than ``step`` that verify, beyond the
    ``keep - 1`` newest of them: the one just written is never removed, and neither is a
    damaged or newer folder (a damaged one is no substitute for a valid one, and what it
    holds is the user's to inspect).
    """
    if keep < 1:
        raise InputError(f"keep must be >= 1; got {keep}")
    folder = Path(root) / f"step_{step:09d}"
    _replace(folder, step, weights, state, base)
    _prune(root, step, keep)
    return folder


def _prune(root: str | Path, step: int, keep: int) -> None:
    kept = 1
    for old in reversed([p for p in list_checkpoints(root) if checkpoint_step(p) < step]):
        if not _is_valid(old):
            continue
        if kept < keep:
            kept += 1
        else:
            shutil.rmtree(old, ignore_errors=True)


def save_sharded_checkpoint(root: str | Path, name: str, step: int, write_shards: Any, state: dict[str, Any], *,
                            keep: int | None = None, base: dict[str, Any] | None = None) -> Path:
    """Write the sharded checkpoint ``root/<name>`` (``step_<N>`` or ``best``); every process
    of the group calls it. ``write_shards(folder)`` writes each process's shards into
    ``folder`` (a collective: :func:`attnlab.engine.sharding.save_sharded`); rank 0 then adds
    ``state`` and the manifest and puts the folder in place as :func:`save_checkpoint` does,
    so that a process killed at any moment leaves the previous checkpoint whole. ``keep``:
    prune older step checkpoints as :func:`save_checkpoint` does."""
    from . import distributed

    folder = Path(root) / name
    new = folder.with_name(f".{folder.name}.new")
    if distributed.is_main():
        if new.exists():  # left by an interrupted save
            shutil.rmtree(new)
        new.mkdir(parents=True)
    distributed.barrier()
    write_shards(new)
    distributed.barrier()  # every shard is on the disk
    if distributed.is_main():
        try:
            _write_state(new, step, state, base, sharded={"world": distributed.world_size()})
        except BaseException:
            shutil.rmtree(new, ignore_errors=True)
            raise
        _swap(new, folder)
        if keep is not None:
            _prune(root, step, keep)
    distributed.barrier()  # no process reads the checkpoint before it is in place
    return folder


def is_sharded_checkpoint(folder: str | Path) -> bool:
    """Whether a checkpoint folder holds shards (:func:`save_sharded_checkpoint`)."""
    return (Path(folder) / SHARDS).is_file() and not (Path(folder) / WEIGHTS).is_file()


def checkpoint_step(folder: str | Path) -> int:
    """The step in a checkpoint folder's name: ``step_000000800`` (or the
    ``.step_000000800.old`` standing in for it) -> ``800``."""
    return int(Path(folder).name.removeprefix(".").removesuffix(".old").removeprefix("step_"))


# Checkpoints this process wrote or verified: folder -> {file: (size, mtime_ns)}. Pruning
# asks whether each older checkpoint is valid at every save; one whose files are unchanged
# since then needs no second pass of sha256 over every byte of them.
_verified: dict[str, dict[str, tuple[int, int]]] = {}


def _stats(folder: Path) -> dict[str, tuple[int, int]] | None:
    try:
        names = sorted(p.name for p in folder.iterdir()) if (folder / SHARDS).is_file() else (WEIGHTS, STATE, MANIFEST)
        return {n: (st.st_size, st.st_mtime_ns) for n in names for st in [(folder / n).stat()]}
    except OSError:
        return None


def _is_valid(folder: Path) -> bool:
    known = _verified.get(str(folder))
    if known is not None and known == _stats(folder):
        return True
    try:
        _verify(folder)
    except CheckpointError:
        return False
    return True


def _write(folder: Path, step: int, weights: dict[str, Tensor], state: dict[str, Any],
           base: dict[str, Any] | None) -> None:
    from safetensors.torch import save

    unique, aliases = _untie(weights)
    atomic_write_bytes(folder / WEIGHTS, save(unique, metadata={"aliases": json.dumps(aliases)}))
    _write_state(folder, step, state, base)


def _write_state(folder: Path, step: int, state: dict[str, Any], base: dict[str, Any] | None,
                 **extra: Any) -> None:
    """``state.pt``, then the manifest: the sha256 of every file the folder holds by then
    (``extra``: more of the manifest's keys)."""
    # Serialized in memory first: torch.save reports a full disk as a RuntimeError without
    # the errno, and the size is what a message about a full disk needs to say.
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(folder / STATE, buffer.getvalue())
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != MANIFEST)
    manifest: dict[str, Any] = {"step": step, "files": {n: sha256_file(folder / n) for n in files}, **extra}
    if base is not None:
        manifest["base"] = base
    atomic_write_bytes(folder / MANIFEST, json.dumps(manifest, indent=1).encode())


def _replace(folder: Path, step: int, weights: dict[str, Tensor], state: dict[str, Any],
             base: dict[str, Any] | None = None) -> None:
    """Write ``folder`` whole, replacing any folder of that name only once the new one is
    complete: it is written in ``.<name>.new`` first, the old one moved to ``.<name>.old``,
    the new one renamed into place, and the old one removed last. A crash between the two
    renames leaves ``.<name>.old``, which :func:`resolve_checkpoint` and
    :func:`list_checkpoints` fall back to."""
    new = folder.with_name(f".{folder.name}.new")
    if new.exists():  # left by an interrupted save
        shutil.rmtree(new)
    try:
        _write(new, step, weights, state, base)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)  # a full disk: give back what the failed save took
        raise
    _swap(new, folder)


def _swap(new: Path, folder: Path) -> None:
    """Put the complete folder ``new`` in the place of ``folder``: the old one moved to
    ``.<name>.old`` first, removed last."""
    old = folder.with_name(f".{folder.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if folder.exists():
        folder.rename(old)
    new.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    written = _stats(folder)  # checksummed as it was written: valid while these stay the same
    if written is not None:
        _verified[str(folder)] = written


def save_named_checkpoint(root: str | Path, name: str, step: int, weights: dict[str, Tensor],
                          state: dict[str, Any], *, base: dict[str, Any] | None = None) -> Path:
    """Write ``root/<name>/`` (e.g. ``best``), replacing the previous one as a whole
    (see :func:`_replace`: a crash at any moment leaves the old one or the new one)."""
    folder = Path(root) / name
    _replace(folder, step, weights, state, base)
    return folder


def resolve_checkpoint(root: str | Path, which: str = "last") -> Path:
    """``"last"``: the newest valid ``step_<N>``; ``"best"`` (or another name): that
    named checkpoint; anything else: a checkpoint folder path. Verified; raises
    :class:`CheckpointError` naming what was looked for when there is none."""
    root = Path(root)
    if which == "last":
        found = latest_checkpoint(root)
        if found is None:
            raise CheckpointError(f"no complete checkpoint in {root}")
        return found
    if (root / which).is_dir() or not Path(which).is_dir():
        for candidate in (root / which, root / f".{which}.old"):
            if (candidate / MANIFEST).is_file():
                _verify(candidate)
                return candidate
        raise CheckpointError(f"no {which!r} checkpoint in {root} (expected 'last', 'best' or a checkpoint folder)")
    _verify(Path(which))
    return Path(which)


def _verify(folder: Path) -> dict[str, Any]:
    """The manifest of a complete, undamaged checkpoint, else :class:`CheckpointError`:
    every file must match the sha256 that the manifest gives it."""
    manifest = _read_manifest(folder)
    before = _stats(folder)
    for name, digest in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path} is missing")
        if sha256_file(path) != digest:
            raise CheckpointError(f"{path} is corrupted or truncated (its sha256 does not match {MANIFEST})")
    if before is not None and before == _stats(folder):
        _verified[str(folder)] = before
    return manifest


def _read_manifest(folder: Path) -> dict[str, Any]:
    """A checkpoint's manifest, which must name both files with their sha256 (an empty or
    foreign manifest would skip every check), else :class:`CheckpointError`."""
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{folder} is not a complete checkpoint (no {MANIFEST}: the save was interrupted)")
    try:
        manifest = read_json(manifest_path)
    except InputError as exc:
        raise CheckpointError(f"{manifest_path} is unreadable: {str(exc).removeprefix(f'{manifest_path} is ')}") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if (not isinstance(files, dict) or not ({WEIGHTS, STATE} <= files.keys() or {SHARDS, STATE} <= files.keys())
            or not all(isinstance(d, str) and len(d) == 64 for d in files.values())
            or not all(isinstance(n, str) and n and "/" not in n and "\\" not in n and n not in (".", "..")
                       for n in files)
            or not isinstance(manifest.get("step"), int)):
        raise CheckpointError(f"{manifest_path} is damaged: expected {{\"step\": N, \"files\": {{\"{WEIGHTS}\": "
                              f"SHA256, \"{STATE}\": SHA256}}}}; got {json.dumps(manifest)[:200]}")
    return manifest


def load_checkpoint(folder: str | Path, map_location: str | torch.device = "cpu", *,
                    weights: bool = True) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """``(weights, state)`` of a checkpoint folder, verified against its manifest; a sharded
    one's weights read whole (``weights=False``: none read, ``{}``)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    folder = Path(folder)
    manifest = _verify(folder)
    if not weights:
        tensors = {}
    elif "sharded" in manifest:
        from .sharding import read_sharded_weights

        tensors = {k: v.to(map_location) for k, v in read_sharded_weights(folder).items()}
    else:
        tensors = load_file(str(folder / WEIGHTS), device=str(map_location))
        with safe_open(str(folder / WEIGHTS), framework="pt") as f:
            aliases = parse_json((f.metadata() or {}).get("aliases", "{}"), f"{folder / WEIGHTS}'s aliases")
        for alias, name in aliases.items():
            tensors[alias] = tensors[name]
    try:
        state = torch_load_safely(folder / STATE, map_location)
    except ValueError as exc:  # a pickle that would run code, or a foreign file
        raise CheckpointError(f"{folder / STATE} could not be loaded safely: {exc}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{folder / STATE} must hold a mapping of training state; got {type(state).__name__}")
    return tensors, state


def nonfinite_tensors(weights: dict[str, Tensor]) -> list[str]:
    """The names of the floating-point tensors of ``weights`` that hold a NaN or an infinity."""
    return [name for name, t in weights.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def nonfinite_summary(weights: dict[str, Tensor]) -> tuple[str, str] | None:
    """``("40 of 56", "blocks.0.attn.q_proj.weight, ... and 37 more")``: how many floating
    tensors of ``weights`` hold NaN or infinity, and which; ``None`` when all are finite."""
    bad = nonfinite_tensors(weights)
    if not bad:
        return None
    floating = sum(t.is_floating_point() for t in weights.values())
    return f"{len(bad)} of {floating}", ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")


def check_finite(weights: dict[str, Tensor], source: str | Path) -> None:
    """:class:`CheckpointError` naming ``source`` when any weight is NaN or infinite: the
    weights of a diverged run, which no evaluation, prediction or resume can use."""
    summary = nonfinite_summary(weights)
    if summary is not None:
        count, names = summary
        raise CheckpointError(f"the weights in {source} are not finite ({count} tensors hold NaN or infinity: "
                              f"{names}): they come from a diverged run and cannot be used; take an earlier "
                              f"checkpoint")


def load_weights_into(model: torch.nn.Module, weights: dict[str, Tensor], source: str | Path, *,
                      base_keys: Collection[str] = ()) -> None:
    """``model.load_state_dict(weights)``, refused with a :class:`CheckpointError` that
    names ``source`` and the mismatched keys when the weights belong to another model
    (torch's own error is a wall of text that reads like a crash), or when they are not
    finite (:func:`check_finite`). ``base_keys``: keys ``weights`` may leave out, whose
    values the model holds already (the frozen weights under LoRA adapters)."""
    weights = dict(weights)
    for name, module in model.named_modules():  # weights of earlier versions, as each module reads them now
        upgrade = getattr(module, "upgrade_state_dict", None)
        if callable(upgrade):
            upgrade(weights, f"{name}." if name else "")
    own = model.state_dict()
    missing = [k for k in own if k not in weights and k not in base_keys]
    unexpected = [k for k in weights if k not in own]
    shapes = [f"{k} {tuple(weights[k].shape)} (model {tuple(own[k].shape)})"
              for k in own if k in weights and weights[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        def few(keys: list[str]) -> str:
            return ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")

        parts = [f"{what} {few(keys)}" for what, keys in
                 (("missing", missing), ("unexpected", unexpected), ("other shapes:", shapes)) if keys]
        raise CheckpointError(f"the weights in {source} do not fit this model ({type(model).__name__}): "
                              f"{'; '.join(parts)}; they were written for another model or configuration")
    check_finite(weights, source)
    model.load_state_dict(weights, strict=not base_keys)


def list_checkpoints(root: str | Path, *, valid_only: bool = True) -> list[Path]:
    """Checkpoint folders ``step_<N>`` under ``root``, oldest first; by default only
    complete ones (with a manifest; checksums are verified on load). A ``.step_<N>.old``
    left by a crash while a folder was being replaced stands in for its missing ``step_<N>``."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = {p.name: p for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()}
    for p in root.glob(".step_*.old"):
        name = p.name[1:-4]
        if p.is_dir() and name[5:].isdigit() and name not in found:
            found[name] = p
    ordered = [found[n] for n in sorted(found)]
    return [p for p in ordered if (p / MANIFEST).is_file()] if valid_only else ordered


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest checkpoint that verifies; damaged newer ones are skipped with a warning."""
    for folder in reversed(list_checkpoints(root)):
        try:
            _verify(folder)
        except CheckpointError as exc:
            warnings.warn(f"skipping damaged checkpoint: {exc}; an older one is used instead, "
                          f"and the damaged folder is left in place (delete it once you no longer need it)")
            continue
        return folder
    return None


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generators, as weights-only-loadable values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuples(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(x: Any) -> Any:
    """random.setstate needs tuples; a round trip through some loaders gives lists."""
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


def average_checkpoints(folders: list[str | Path]) -> dict[str, Tensor]:
    """The element-wise mean of the weights of ``folders`` (Vaswani et al., 2017, §6.1:
    averaging the last checkpoints). Floating-point tensors are averaged in float64 and
    cast back; other tensors (counters) are taken from the last folder."""
    if not folders:
        raise InputError("folders must name at least one checkpoint; got none")
    total: dict[str, Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for folder in folders:
        weights, _ = load_checkpoint(folder)
        if total and weights.keys() != total.keys():
            raise CheckpointError(f"{folder} holds other weights than {folders[0]}; only one run's checkpoints average")
        for name, w in weights.items():
            dtypes[name] = w.dtype
            if w.is_floating_point():
                total[name] = total[name] + w.double() if name in total else w.double()
            else:
                total[name] = w
    return {n: (t / len(folders)).to(dtypes[n]) if t.is_floating_point() else t for n, t in total.items()}


def checkpoint_base(folder: str | Path) -> dict[str, Any] | None:
    """The ``base`` a checkpoint's manifest records (:func:`save_checkpoint`): ``None`` for
    a checkpoint that holds every weight."""
    base = _read_manifest(Path(folder)).get("base")
    return base if isinstance(base, dict) else None


def checkpoint_label(folder: Path) -> str:
    """``checkpoint best (step 1200)``: which weights, for captions."""
    manifest = folder / "manifest.json"
    step = read_json_mapping(manifest).get("step") if manifest.is_file() else None
    return f"checkpoint {folder.name}" + (f" (step {step})" if step is not None else "")
