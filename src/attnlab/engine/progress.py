"""Training progress: a live bar on a terminal, short periodic lines anywhere else.

On a terminal (``stream.isatty()``) a tqdm bar shows the step, loss, throughput and ETA.
When output goes to a file or a CI log, one plain line is printed every ``every``
seconds (and at the end), so logs stay short and readable.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

__all__ = ["Progress", "format_seconds"]


def format_seconds(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """``update(n_steps, n_samples, **metrics)`` after each step; ``close()`` at the end.

    ``total`` is the number of steps; throughput is samples (images, tokens) per second
    since the start, and the ETA follows from the step rate.
    """

    def __init__(self, total: int, *, desc: str = "train", unit: str = "samples", every: float = 30.0,
                 stream: IO[str] | None = None, tty: bool | None = None, start_step: int = 0) -> None:
        self.total, self.desc, self.unit, self.every = total, desc, unit, every
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.step = self.start_step = start_step
        self.samples = 0
        self.metrics: dict[str, Any] = {}
        self.start = self.last_print = time.perf_counter()
        self._bar = None
        self._printed_step: int | None = None  # the step of the last plain line
        if self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=start_step, desc=desc, file=self.stream, dynamic_ncols=True)

    @property
    def rate(self) -> float:
        """Samples per second since the start."""
        return self.samples / max(time.perf_counter() - self.start, 1e-9)

    def eta(self) -> float:
        done = self.step - self.start_step
        if done <= 0:
            return float("nan")
        return (self.total - self.step) * (time.perf_counter() - self.start) / done

    def _postfix(self) -> str:
        parts = [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in self.metrics.items()]
        return "  ".join(parts + [f"{self.rate:,.0f} {self.unit}/s"])

    def update(self, steps: int = 1, samples: int = 0, **metrics: Any) -> None:
        self.step += steps
        self.samples += samples
        self.metrics.update(metrics)
        if self._bar is not None:
            self._bar.update(steps)
            self._bar.set_postfix_str(self._postfix(), refresh=False)
        elif time.perf_counter() - self.last_print >= self.every:
            self._line()

    def _line(self) -> None:
        eta = self.eta()
        eta_text = "-" if eta != eta else format_seconds(eta)  # NaN before the first step
        print(f"{self.desc} step {self.step}/{self.total}  {self._postfix()}  eta {eta_text}",
              file=self.stream, flush=True)
        self.last_print = time.perf_counter()
        self._printed_step = self.step

    def write(self, message: str) -> None:
        """Print a line without breaking the bar."""
        if self._bar is not None:
            self._bar.write(message, file=self.stream)
        else:
            print(message, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._printed_step != self.step:  # the final line, unless just printed
            self._line()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
