"""Files that survive crashes and loading that runs no code.

* :func:`atomic_write`: write to a temporary file in the same folder, flush and fsync
  it, then ``os.replace`` it over the target and fsync the folder. A reader sees the
  old file or the new one, never a half-written one, even after a power cut.
* :func:`read_state_dict`: tensors from ``.safetensors``, or from ``.pth``/``.pt``/
  ``.bin`` with ``torch.load(weights_only=True)``: a pickle that would run code is refused.
* :class:`WriteError`: a file that could not be written (full disk, read-only file
  system, no permission), named in its message.
* :func:`check_output`, :func:`staging_for`, :func:`put_in_place`: an export (a file or a
  folder) written aside and renamed into place, replacing only what attnlab wrote there as an
  export before (a folder holds :data:`EXPORT_MARKER`, which lists its files), never a
  folder of the user's.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

import torch
from torch import Tensor

from .errors import InputError, WriteError, yaml_problem
from .jsonfile import read_bytes, read_json
from .limits import JSON_MAX_BYTES

__all__ = ["WriteError", "atomic_write", "atomic_write_bytes", "read_state_dict", "sha256_file", "torch_load_safely",
           "read_json_mapping", "read_yaml_mapping", "EXPORT_MARKER", "check_output", "staging_for", "put_in_place",
           "write_error"]


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
        raise write_error(exc, path) from None
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600; give it the mode open() would
        with os.fdopen(fd, mode) as f:
            try:
                yield f
                f.flush()
                os.fsync(f.fileno())
            except OSError as exc:  # the disk filled up, or the file system went read-only
                raise write_error(exc, path) from None
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def write_error(exc: OSError, path: str | Path, size: int | None = None) -> WriteError:
    """``exc`` as a :class:`WriteError` naming ``path`` (one that already is one passes
    through), with the ``size`` it needed and the space left where it was written (also where
    the cause is not known: numpy's "2048 requested and 96 written" has no errno)."""
    unknown = exc.errno is None
    if not isinstance(exc, WriteError):
        exc = WriteError(exc.errno or errno.EIO, exc.strerror or str(exc), str(path))
    if size is not None and exc.size is None:
        exc.size = size
    if (exc.errno in (errno.ENOSPC, errno.EDQUOT) or unknown) and exc.free is None:
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
        raise write_error(exc, Path(path), len(data)) from None


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
        raise InputError(f"{path} is not valid YAML: {yaml_problem(exc)}") from None
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


# ----------------------------------------------------------------------------- exports put in place
EXPORT_MARKER = ".attnlab-export.json"
"""The file an export folder holds: the files attnlab wrote into it, so that ``--force``
(``overwrite=True``) replaces that folder, and nothing else."""


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def check_output(path: str | Path, *, folder: bool, overwrite: bool, name: str = "out") -> Path:
    """``path`` for an export (a ``folder``, or a file), checked before any work: no parent of it
    is a file; where it exists, it is replaced only with ``overwrite``, and then only when it is
    not a link and is what an export wrote (a folder: one whose :data:`EXPORT_MARKER` lists every
    file it holds; a file: not a folder). ``name`` is the argument the refusals name."""
    path = Path(path).expanduser()
    for parent in path.parents:
        if _exists(parent):
            if not parent.is_dir():
                raise InputError(f"{name}: {parent} is a file, so {path} cannot be written below it; choose another "
                                 f"{name}")
            break
    if not _exists(path):
        return path
    what = "an export folder" if folder else "an export file"
    if not overwrite:
        raise InputError(f"{name}: {path} exists already; pass --force (overwrite=True in Python) to replace it, or "
                         f"choose another {name}")
    if path.is_symlink():
        raise InputError(f"{name}: {path} is a symbolic link; --force replaces only {what} that attnlab wrote, not "
                         f"what a link leads to: remove the link, or choose another {name}")
    if not folder:
        if path.is_dir():
            raise InputError(f"{name}: {path} is a folder; this export is one file: choose a file's name")
        return path
    if not path.is_dir():
        raise InputError(f"{name}: {path} is a file, not {what}; choose another {name}")
    written = _written(path)
    if written is None:
        raise InputError(f"{name}: {path} is a folder that attnlab did not write as an export (it holds no "
                         f"{EXPORT_MARKER}); --force replaces only an export's folder: choose another {name}")
    others = sorted(p.name for p in path.iterdir() if p.name not in written and p.name != EXPORT_MARKER)
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise InputError(f"{name}: {path} holds what the export did not write ({shown}); --force replaces only the "
                         f"export's own files: move them, or choose another {name}")
    return path


def _written(folder: Path) -> set[str] | None:
    """The files an export folder's marker lists, or None (no marker, or not one of attnlab's)."""
    try:
        files = json.loads((folder / EXPORT_MARKER).read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    return set(files) if isinstance(files, list) and all(isinstance(f, str) for f in files) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def staging_for(path: Path, *, folder: bool) -> Path:
    """A new hidden sibling of ``path`` (a folder, or an empty file) to write the export into
    before :func:`put_in_place`. Leftovers of an export that was killed (their process gone)
    are removed first: they are named ``.NAME.staging-PID.*``."""
    prefix = f".{path.name}.staging-"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for old in path.parent.glob(glob.escape(prefix) + "*"):
            pid = old.name[len(prefix):].split(".")[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                shutil.rmtree(old, ignore_errors=True) if old.is_dir() and not old.is_symlink() else old.unlink()
        if folder:
            staging = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}.", dir=path.parent))
            staging.chmod(0o777 & ~_umask())  # as mkdir would make it, not mkdtemp's 0700
            return staging
        fd, name = tempfile.mkstemp(prefix=f"{prefix}{os.getpid()}.", suffix=path.suffix, dir=path.parent)
        os.close(fd)
        os.chmod(name, 0o666 & ~_umask())  # as open() would make it, not mkstemp's 0600
        return Path(name)
    except OSError as exc:
        raise write_error(exc, path) from None


def put_in_place(staging: Path, path: Path) -> None:
    """Rename the written ``staging`` (from :func:`staging_for`) to ``path``. A folder first gets
    its :data:`EXPORT_MARKER` (the files it holds); the folder it replaces (checked by
    :func:`check_output`) is moved aside, then removed."""
    try:
        if staging.is_dir():
            files = sorted(str(p.relative_to(staging)) for p in staging.iterdir())
            atomic_write_bytes(staging / EXPORT_MARKER, json.dumps({"files": files}, indent=1).encode())
            old = None
            if path.is_dir() and not path.is_symlink():
                old = path.with_name(f".{path.name}.replaced-{os.getpid()}")
                path.rename(old)
            staging.rename(path)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, path)
        _fsync_dir(path.parent)
    except WriteError:
        raise
    except OSError as exc:
        raise write_error(exc, path) from None
