"""The machine a figure was measured on: :mod:`attnlab.engine.machine`, where a run
records it too; re-exported for the benchmarks."""

from ..engine.machine import SPEED_FLAGS, machine_info, machine_label

__all__ = ["SPEED_FLAGS", "machine_info", "machine_label"]
