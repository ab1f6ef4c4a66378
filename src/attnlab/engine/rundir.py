"""A run directory that no other run can overwrite.

* :class:`RunLock`: one training at a time per run directory. ``run_dir/.lock`` holds
  the holder's process id, host, start time and command, and is locked with ``flock``,
  which the kernel releases when the process ends in any way (SIGKILL included): a lock
  file left by a dead process is stale and is taken over, a live holder is named in the
  refusal.
* :func:`make_run_dir`: create the folder, with one clear error for a path that is a
  file, lies under a file or cannot be written.
* :func:`inspect_run_dir`: what a folder holds of a run (its files, valid, damaged and
  interrupted checkpoints), so that a new run or a resume can be refused before
  anything in it is touched.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from ..jsonfile import parse_json
from .checkpoint import MANIFEST, CheckpointError, _verify, list_checkpoints

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: an exclusive create stands in (stale locks by hand)
    fcntl = None  # type: ignore[assignment]

__all__ = ["RunDirError", "RunLock", "RunDirState", "make_run_dir", "inspect_run_dir", "RUN_FILES"]

LOCK = ".lock"
# What a run writes at the top of its folder; any of them means the folder holds a run.
RUN_FILES = ("config.yaml", "config.changes.yaml", "results.json", "metrics.jsonl", "checkpoints", "tensorboard",
             "report.html", "tokenizer.json", "tokenizer.src.json", "tokenizer.tgt.json", "translations.test.txt",
             "classes.json", "resolved.json", "tokenizer_config.json", "generation_config.json")


class RunDirError(InputError):
    """A run directory that cannot be used as asked; the message says what was found and what to do."""


def make_run_dir(run_dir: str | Path) -> Path:
    """Create ``run_dir`` (and its parents); :class:`RunDirError` naming the problem when
    it is a file, lies under a file, or cannot be created."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"--run-dir {run_dir} is a file; expected a folder (new or holding a run)")
    for parent in run_dir.parents:
        if parent.exists():
            if not parent.is_dir():
                raise RunDirError(f"--run-dir {run_dir} lies under {parent}, which is a file, not a folder")
            break
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"--run-dir {run_dir} cannot be created: {exc.strerror or exc}") from None
    return run_dir


class RunLock:
    """``with RunLock(run_dir): ...``: hold ``run_dir/.lock`` for the block.

    Raises :class:`RunDirError` naming the holder when another live process holds it,
    or the reason when the folder cannot be written (read-only file system, no
    permission). ``took_over`` tells whether a stale lock file was found and replaced."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK
        self._fd: int | None = None
        self.took_over: str | None = None  # the stale holder's description, if any

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this RunLock")
        while True:
            fd = self._open()
            if fcntl is None:  # pragma: no cover
                break
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read(fd)
                os.close(fd)
                if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise RunDirError(f"--run-dir {self.path.parent} is in use by another training ({holder}); "
                                      f"wait for it to end, or choose another --run-dir") from None
                raise RunDirError(f"--run-dir {self.path.parent} cannot be locked: {exc.strerror or exc}") from None
            # The file may have been removed by its previous holder between our open and our
            # flock: then we hold a lock on a file nobody else can see; open again.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        stale = _read(fd)
        self.took_over = stale or None
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "command": " ".join(sys.argv)}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            raise RunDirError(f"--run-dir {self.path.parent} is not writable: {exc.strerror or exc}") from None
        self._fd = fd

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | (os.O_EXCL if fcntl is None else 0)
        try:
            return os.open(self.path, flags, 0o644)
        except FileExistsError:  # pragma: no cover - not POSIX, and the lock file is there
            raise RunDirError(f"--run-dir {self.path.parent} is in use by another training "
                              f"({_read_path(self.path)}); if that process has ended, delete {self.path}") from None
        except OSError as exc:
            raise RunDirError(f"--run-dir {self.path.parent} is not writable: {exc.strerror or exc}") from None

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still holding it: no one can take a lock we then remove
        except OSError:
            pass  # a read-only file system now: the lock still ends with the descriptor
        os.close(self._fd)
        self._fd = None


def _read(fd: int) -> str:
    try:
        data = os.pread(fd, 4096, 0)
    except OSError:
        return ""
    return _describe(data)


def _read_path(path: Path) -> str:  # pragma: no cover - used by the non-POSIX fallback
    try:
        return _describe(path.read_bytes())
    except OSError:
        return "holder unknown"


def _describe(data: bytes) -> str:
    """``pid 123 on host h since 2026-11-30 08:00:00: attnlab train ...`` from a lock record."""
    if not data.strip():
        return ""
    try:
        r = parse_json(data, "the lock record")
        return f"pid {r['pid']} on {r['host']} since {r['started']}: {r['command']}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"


@dataclass
class RunDirState:
    """What a folder holds of a run. ``files``: the names of :data:`RUN_FILES` (and
    ``checkpoints/best``) present; ``valid``: the newest checkpoint that verifies;
    ``damaged``: ``(folder, reason)`` of checkpoints whose manifest is there but that do
    not verify; ``interrupted``: folders of saves cut off before their manifest."""

    files: list[str] = field(default_factory=list)
    valid: Path | None = None
    damaged: list[tuple[Path, str]] = field(default_factory=list)
    interrupted: list[Path] = field(default_factory=list)

    @property
    def holds_run(self) -> bool:
        return bool(self.files)

    def summary(self) -> str:
        """One phrase listing what was found, for error messages."""
        parts = [", ".join(self.files)] if self.files else []
        if self.valid is not None:
            parts.append(f"last valid checkpoint {self.valid.name}")
        if self.damaged:
            parts.append("damaged checkpoints " + "; ".join(f"{p.name} ({why})" for p, why in self.damaged[:3])
                         + (f" and {len(self.damaged) - 3} more" if len(self.damaged) > 3 else ""))
        if self.interrupted:
            parts.append("interrupted saves " + ", ".join(p.name for p in self.interrupted[:3]))
        return "; ".join(parts) or "nothing"


def inspect_run_dir(run_dir: str | Path) -> RunDirState:
    """What ``run_dir`` holds of a run (nothing is changed)."""
    run_dir = Path(run_dir)
    state = RunDirState()
    if not run_dir.is_dir():
        return state
    state.files = [name for name in RUN_FILES if (run_dir / name).exists()]
    state.files += sorted(p.name for p in run_dir.glob("fold_*") if p.is_dir())  # cross-validation folds
    root = run_dir / "checkpoints"
    if (root / "best").is_dir():
        state.files.append("checkpoints/best")
    for folder in reversed(list_checkpoints(root, valid_only=False)):
        if not (folder / MANIFEST).is_file():
            state.interrupted.append(folder)
            continue
        if state.valid is not None:
            continue  # older than the newest valid one: not needed to decide anything
        try:
            _verify(folder)
        except CheckpointError as exc:
            state.damaged.append((folder, str(exc).replace(str(folder) + "/", "")))
            continue
        state.valid = folder
    return state
