"""Training progress: a live bar on a terminal, short periodic lines anywhere else.

On a terminal (``stream.isatty()``) a tqdm bar shows the step, loss, throughput and ETA.
When output goes to a file or a CI log, one plain line is printed every ``every``
seconds (and at the end), so logs stay short and readable. The ETA is the sooner of the
last step at the rate so far and the end of a time budget (``train.max_minutes``); a slow
rate keeps its significant digits, and a step of a second or more is said in seconds.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

__all__ = ["Progress", "format_seconds", "format_rate"]


def format_seconds(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_rate(rate: float) -> str:
    """A rate with its significant digits: ``12,345``, ``12.3``, ``0.13``."""
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.1f}" if rate >= 1 else f"{rate:.2g}"


class Progress:
    """``update(n_steps, n_samples, **metrics)`` after each step; ``close()`` at the end.

    ``total`` is the number of steps; throughput is samples (images, tokens) per second
    since the start, and the ETA follows from the step rate.
    """

    def __init__(self, total: int, *, desc: str = "train", unit: str = "samples", every: float = 30.0,
                 stream: IO[str] | None = None, tty: bool | None = None, start_step: int = 0,
                 budget: float | None = None) -> None:
        self.total, self.desc, self.unit, self.every = total, desc, unit, every
        self.budget = budget  # seconds this session may train (train.max_minutes less what earlier ones used)
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

            # tqdm's own estimate knows no time budget: the bar shows ours, in the postfix
            self._bar = tqdm(total=total, initial=start_step, desc=desc, file=self.stream, dynamic_ncols=True,
                             bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")

    @property
    def rate(self) -> float:
        """Samples per second since the start."""
        return self.samples / max(time.perf_counter() - self.start, 1e-9)

    def eta(self) -> float:
        """Seconds to the end: to the last step at the rate so far, or to the end of the budget."""
        done = self.step - self.start_step
        if done <= 0:
            return float("nan")
        elapsed = time.perf_counter() - self.start
        left = (self.total - self.step) * elapsed / done
        return left if self.budget is None else max(min(left, self.budget - elapsed), 0.0)

    def _speed(self) -> str:
        text = format_rate(self.rate)
        done = self.step - self.start_step
        per_step = (time.perf_counter() - self.start) / done if done > 0 else 0.0
        return f"{text} {self.unit}/s" + (f" ({per_step:.1f} s/step)" if per_step >= 1 else "")

    def _postfix(self) -> str:
        parts = [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in self.metrics.items()]
        parts.append(self._speed())
        if self._bar is not None:
            eta = self.eta()
            parts.append(f"eta {'-' if eta != eta else format_seconds(eta)}")
        return "  ".join(parts)

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
