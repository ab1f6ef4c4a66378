"""Tasks and models of one's own: the modules that register them, imported by name.

The command line imports each ``--import MODULE`` (a module importable from the current
folder, or a ``.py`` file) before it reads a recipe or a run, then every entry point of
the group ``attnlab.plugins`` that an installed package declares in its metadata::

    # pyproject.toml of a package that adds tasks or models to attnlab
    [project.entry-points."attnlab.plugins"]
    my_tasks = "my_package.tasks"

Importing the module runs its ``@register_task`` and ``@register_model`` decorators.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from typing import Sequence

from .errors import InputError

__all__ = ["import_plugins"]


def import_plugins(modules: Sequence[str] = ()) -> list[str]:
    """Import the modules that register tasks and models of one's own: each of ``modules``
    (``--import``: a module name, importable from the current folder too, or a ``.py``
    file), then every entry point of the group ``attnlab.plugins`` that an installed
    package declares. Returns their names."""
    loaded = []
    for spec in modules:
        if spec.endswith(".py"):
            path = Path(spec)
            if not path.is_file():
                raise InputError(f"--import {spec}: no such file")
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[path.stem] = module
            module_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))  # as `python -m` would: the current folder's modules
            try:
                importlib.import_module(spec)
            except ModuleNotFoundError as exc:
                if exc.name and spec.split(".")[0] == exc.name.split(".")[0]:
                    raise InputError(f"--import {spec}: no module named {exc.name!r} (give a module importable "
                                     f"from the current folder, or a .py file)") from None
                raise
        loaded.append(spec)
    for entry in importlib.metadata.entry_points(group="attnlab.plugins"):
        entry.load()
        loaded.append(entry.value)
    return loaded
