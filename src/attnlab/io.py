"""Files that survive crashes and loading that runs no code.

* :func:`atomic_write`: write to a temporary file in the same folder, flush and fsync
  it, then ``os.replace`` it over the target and fsync the folder. A reader sees the
  old file or the new one, never a half-written one, even after a power cut.
* :func:`read_state_dict`: tensors from ``.safetensors``, or from ``.pth``/``.pt``/
  ``.bin`` with ``torch.load(weights_only=True)``: a pickle that would run code is refused.
* :class:`WriteError`: a file that could not be written (full disk, read-only file
  system, no permission), named in its message.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

import torch
from torch import Tensor

from .errors import InputError, WriteError
from .jsonfile import read_bytes, read_json
from .limits import JSON_MAX_BYTES

__all__ = ["WriteError", "atomic_write", "atomic_write_bytes", "read_state_dict", "sha256_file", "torch_load_safely",
           "read_json_mapping", "read_yaml_mapping"]


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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _write_error(exc, path) from None
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600; give it the mode open() would
        with os.fdopen(fd, mode) as f:
            try:
                yield f
                f.flush()
                os.fsync(f.fileno())
            except OSError as exc:  # the disk filled up, or the file system went read-only
                raise _write_error(exc, path) from None
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _write_error(exc: OSError, path: Path, size: int | None = None) -> OSError:
    """``exc`` as a :class:`WriteError` naming ``path`` (one that already is one passes
    through), with the ``size`` it needed and the space left where it was written."""
    if not isinstance(exc, WriteError):
        exc = WriteError(exc.errno, exc.strerror or str(exc), str(path))
    if size is not None and exc.size is None:
        exc.size = size
    if exc.errno in (errno.ENOSPC, errno.EDQUOT) and exc.free is None:
        try:
            exc.free = shutil.disk_usage(Path(path).parent).free
        except OSError:
            pass
    return exc


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """``data`` into ``path`` atomically; a :class:`WriteError` that says how much was needed."""
    try:
        with atomic_write(path) as f:
            f.write(data)
    except OSError as exc:
        raise _write_error(exc, Path(path), len(data)) from None


def _read_text(path: Path) -> str:
    """A UTF-8 text file, with one ``ValueError`` naming it for what can go wrong."""
    data = read_bytes(path, JSON_MAX_BYTES)  # a settings file: bounded as JSON is
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})") from None
    if not text.strip():
        raise InputError(f"{path} is empty")
    return text


def read_json_mapping(path: str | Path) -> dict:
    """A JSON file that must hold an object: ``ValueError`` naming the file when it is
    missing, unreadable, larger or deeper than :mod:`attnlab.jsonfile` reads, not JSON or
    not an object."""
    path = Path(path)
    data = read_json(path)  # its size and depth bounded (attnlab.jsonfile)
    if not isinstance(data, dict):
        raise InputError(f"{path} must hold a JSON object; got {type(data).__name__}")
    return data


def read_yaml_mapping(path: str | Path) -> dict:
    """A YAML file that must hold a mapping: ``ValueError`` naming the file when it is
    missing, unreadable, empty, not YAML or not a mapping (an empty file is an error, not
    an empty mapping)."""
    import yaml

    path = Path(path)
    text = _read_text(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} must hold a YAML mapping of settings; got {type(data).__name__}")
    return data


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
            raise InputError(f"could not read {path} as safetensors: {exc}") from None
    if path.suffix not in (".pth", ".pt", ".bin"):
        raise InputError(f"checkpoint must be .safetensors, .pth, .pt or .bin; got {path.name}")
    obj = torch_load_safely(path, "cpu")
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise InputError(f"{path} does not hold a state dict (a mapping of names to tensors)")
    return obj


def torch_load_safely(path: str | Path, map_location: str | torch.device = "cpu") -> object:
    """``torch.load(path, weights_only=True)``, with its failures as one ``ValueError``
    that names the file and never suggests loading it unsafely: a pickle naming another
    object than tensors, numbers, strings and containers is refused, since unpickling
    it could run code."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # UnpicklingError, RuntimeError (not a zip, truncated), EOFError, ...
        if isinstance(exc, OSError) and not isinstance(exc, EOFError):
            raise InputError(f"could not read {path}: {exc.strerror or exc}") from None
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        if found or "Weights only load failed" in str(exc):
            what = f"an object of {found.group(1)}" if found else "objects other than tensors and plain values"
            raise InputError(f"{path} was refused: it holds {what}, and unpickling it could run code; "
                             f"attnlab loads only tensors, numbers, strings and containers") from None
        raise InputError(f"{path} is not a readable PyTorch file (truncated or corrupted?): "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
