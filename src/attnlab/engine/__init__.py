"""Training machinery that knows nothing of particular models."""

from .checkpoint import (
    CheckpointError,
    capture_rng_state,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)

__all__ = [
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "list_checkpoints",
    "latest_checkpoint",
    "capture_rng_state",
    "restore_rng_state",
]
