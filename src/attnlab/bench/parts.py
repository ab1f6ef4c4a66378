"""The parts of each benchmark, by name: what ``attnlab bench WHAT --parts`` takes. Here, apart
from the benchmarks themselves, so that the command line names them without importing torch."""

from __future__ import annotations

__all__ = ["ATTENTION_PARTS", "VISION_PARTS", "LM_PARTS"]

ATTENTION_PARTS = ("scaling", "quality", "fidelity", "studies", "allocator")
VISION_PARTS = ("norm", "text_norm", "positions", "regularization", "pooling", "heads", "patch", "tutorials", "botnet")
LM_PARTS = ("generation", "cache", "extrapolation", "kinds", "streaming", "kinds_long")
