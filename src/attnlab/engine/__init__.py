"""Training machinery that knows nothing of particular models."""

from .config import ConfigError, apply_overrides, from_dict
from .device import autocast, seed_everything, select_device
from .metrics import MetricsLog, TensorBoardLog, read_metrics
from .optim import build_optimizer, param_groups, warmup_cosine
from .progress import Progress
from .trainer import EpochSampler, TrainConfig, Trainer
from .checkpoint import (
    CheckpointError,
    capture_rng_state,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    resolve_checkpoint,
    restore_rng_state,
    save_checkpoint,
    save_named_checkpoint,
)

__all__ = [
    "Trainer",
    "TrainConfig",
    "EpochSampler",
    "ConfigError",
    "from_dict",
    "apply_overrides",
    "select_device",
    "autocast",
    "seed_everything",
    "MetricsLog",
    "TensorBoardLog",
    "read_metrics",
    "build_optimizer",
    "param_groups",
    "warmup_cosine",
    "Progress",
    "CheckpointError",
    "save_checkpoint",
    "save_named_checkpoint",
    "resolve_checkpoint",
    "load_checkpoint",
    "list_checkpoints",
    "latest_checkpoint",
    "capture_rng_state",
    "restore_rng_state",
]
