"""Transforms: :mod:`.images` (image transforms on tensors and the CIFAR-10 / digits / folder
presets) and :mod:`.mix` (mixup and cutmix with soft targets). ``attnlab.data.transforms``
was :mod:`.images`'s own path before this room: its names stay here."""

from .images import *  # noqa: F401,F403
from .images import __all__
