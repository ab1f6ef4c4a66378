"""attnlab: attention mechanisms and the models built on them, in PyTorch."""

from __future__ import annotations

import importlib
from typing import Any

from .moved import install as _install_moved

__version__ = "0.2.0"

__all__ = ["attention", "data", "layers", "models", "formats", "generation", "create_model", "list_models", "from_hf",
           "train", "load_run", "finish_run", "__version__"]

# Read when first asked for (PEP 562), not on `import attnlab`: the command line imports this package
# before it knows its command, and `attnlab --version` or `attnlab recipes` need no torch (about 2 s of
# the command's start on 2 cores).
_SUBMODULES = ("attention", "data", "layers", "models", "formats", "generation", "run", "tasks", "export")
_NAMES = {"create_model": "models", "list_models": "models", "from_hf": "formats", "train": "tasks",
          "load_run": "tasks", "finish_run": "tasks"}
_install_moved()  # the former paths of moved modules (attnlab.moved)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _NAMES:
        return getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
    raise AttributeError(f"module 'attnlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
