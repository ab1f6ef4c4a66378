"""Files that survive crashes and loading that runs no code.

* :func:`atomic_write`: write to a temporary file in the same folder, flush and fsync
  it, then ``os.replace`` it over the target and fsync the folder. A reader sees the
  old file or the new one, never a half-written one, even after a power cut.
* :func:`read_state_dict`: tensors from ``.safetensors``, or from ``.pth``/``.pt``/
  ``.bin`` with ``torch.load(weights_only=True)``: a pickle that would run code is refused.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

import torch
from torch import Tensor

__all__ = ["atomic_write", "atomic_write_bytes", "read_state_dict", "sha256_file"]


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not supported on this platform / file system
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask


@contextmanager
def atomic_write(path: str | Path, mode: str = "wb") -> Iterator[IO]:
    """``with atomic_write(p) as f: f.write(...)``: ``p`` appears whole or not at all.

    On an exception inside the block the temporary file is removed and ``p`` keeps its
    previous content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600; give it the mode open() would
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_write(path) as f:
        f.write(data)


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Tensors from ``.safetensors``, or from ``.pth``/``.pt``/``.bin`` loaded with
    ``weights_only=True`` (no pickled code runs). A ``{"state_dict": ...}`` or
    ``{"model": ...}`` wrapper is unwrapped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as exc:  # SafetensorError: truncated or not a safetensors file
            raise ValueError(f"could not read {path} as safetensors: {exc}") from None
    if path.suffix not in (".pth", ".pt", ".bin"):
        raise ValueError(f"checkpoint must be .safetensors, .pth, .pt or .bin; got {path.name}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # an unpickling error names the forbidden global
        raise ValueError(f"could not load {path} as a weights-only state dict: {exc}") from None
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise ValueError(f"{path} does not hold a state dict (a mapping of names to tensors)")
    return obj
