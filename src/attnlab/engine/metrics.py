"""``metrics.jsonl``: one JSON object per logged step or evaluation, appended as it happens.

Each record is written with one ``write`` and flushed, so a crash loses at most the
line being written; :func:`read_metrics` skips such a torn last line. On resume,
:meth:`MetricsLog.open` drops the records past the checkpoint's step, so the resumed run
does not log those steps twice; and a record of the checkpoint's own step that the file
already holds (the final evaluation of a run killed after its last checkpoint) is not
written again when the resumed run repeats that work.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..jsonfile import parse_json
from ..io import atomic_write

__all__ = ["MetricsLog", "TensorBoardLog", "read_metrics"]


def _clean(value: Any) -> Any:
    if hasattr(value, "item"):  # tensors and numpy scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them visible
    return value


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete records of a ``metrics.jsonl``; a torn last line is ignored. Any
    other line that is not a JSON object (bytes that are not UTF-8, a line of other
    text) is an :class:`~attnlab.errors.InputError` naming the file and the line."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    lines = path.read_bytes().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = parse_json(line, f"{path}: line {i + 1}")
            if not isinstance(record, dict):
                raise ValueError
        except ValueError:  # JSONDecodeError and UnicodeDecodeError both are
            if i == len(lines) - 1:
                break  # written while the process died
            raise InputError(f"{path}: line {i + 1} is not a JSON record (the file is damaged: "
                             f"{line[:40]!r}); move it aside (the run's checkpoints do not need it), and a resumed "
                             f"run starts a new one") from None
        records.append(record)
    return records


class MetricsLog:
    """Append-only metrics file. ``log(step, kind="train", loss=..., lr=...)``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")
        self._done: set[tuple[int, str]] = set()  # (step, kind) already in the file at the resume step

    @classmethod
    def open(cls, path: str | Path, resume_step: int | None = None) -> "MetricsLog":
        """Open for appending; with ``resume_step``, first keep only records up to it."""
        path = Path(path)
        if resume_step is not None and path.exists():
            kept = [r for r in read_metrics(path) if r.get("step", 0) <= resume_step]
            with atomic_write(path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in kept)
            log = cls(path)
            log._done = {(resume_step, r.get("kind", "train")) for r in kept if r.get("step", 0) == resume_step}
            return log
        return cls(path)

    def log(self, step: int, kind: str = "train", **values: Any) -> dict[str, Any]:
        record = {"step": step, "kind": kind, "time": round(time.time(), 3)}
        record.update({k: _clean(v) for k, v in values.items()})
        if (step, kind) in self._done:  # logged before the resume (see open): once is enough
            return record
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        return record

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TensorBoardLog:
    """Scalars as TensorBoard event files: ``log(step, "train", {"loss": ...})`` writes
    ``train/loss``. ``resume_step`` drops events after it that an interrupted run wrote,
    so a resumed run's curves have no doubled stretch."""

    def __init__(self, folder: str | Path, resume_step: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.folder = Path(folder)
        self._writer = SummaryWriter(str(self.folder), purge_step=resume_step + 1 if resume_step else None)

    def log(self, step: int, prefix: str, values: dict[str, Any]) -> None:
        for name, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(f"{prefix}/{name}", value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

