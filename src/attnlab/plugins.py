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
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from .errors import InputError

__all__ = ["import_plugins", "PluginError"]


class PluginError(InputError):
    """A module named by ``--import`` (or an ``attnlab.plugins`` entry point) failed while
    it was imported: its own error, not attnlab's. ``traceback`` holds the module's
    traceback (attnlab's frames left out), for the command line to show above the message."""

    def __init__(self, message: str, traceback: str = "") -> None:
        super().__init__(message)
        self.traceback = traceback


def _own_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` from the first frame outside attnlab and importlib on."""
    frames = traceback.extract_tb(exc.__traceback__)
    here = str(Path(__file__).parent)
    kept = [f for f in frames if not f.filename.startswith(here) and "importlib" not in f.filename
            and not f.filename.startswith("<frozen")]
    head = ["Traceback (most recent call last):\n", *traceback.format_list(kept)] if kept else []
    return "".join(head + traceback.format_exception_only(type(exc), exc))


@contextmanager
def _importing(what: str) -> Iterator[None]:
    """Turn whatever importing ``what`` raises, ``sys.exit`` included, into a :class:`PluginError`."""
    try:
        yield
    except InputError:
        raise
    except SystemExit as exc:
        raise PluginError(f"{what}: the module called sys.exit({exc.code!r}) while it was imported; a module that "
                          f"registers tasks or models must not exit") from None
    except ModuleNotFoundError as exc:
        raise PluginError(f"{what}: the module imports {exc.name!r}, which is not installed here "
                          f"(pip install it into this environment)", _own_traceback(exc)) from None
    except Exception as exc:  # noqa: BLE001  # the module's own error, whatever it is
        raise PluginError(f"{what}: the module raised {type(exc).__name__} while it was imported: "
                          f"{' '.join(str(exc).split()) or '(no message)'} (its traceback is above)",
                          _own_traceback(exc)) from None


def import_plugins(modules: Sequence[str] = ()) -> list[str]:
    """Import the modules that register tasks and models of one's own: each of ``modules``
    (``--import``: a module name, importable from the current folder too, or a ``.py``
    file), then every entry point of the group ``attnlab.plugins`` that an installed
    package declares. Returns their names. A module that raises (a syntax error, a
    missing dependency, ``sys.exit``) gives a :class:`PluginError` that says so."""
    loaded = []
    for spec in modules:
        with _importing(f"--import {spec}"):
            if spec.endswith(".py"):
                path = Path(spec)
                if not path.is_file():
                    raise InputError(f"--import {spec}: no such file")
                module_spec = importlib.util.spec_from_file_location(path.stem, path)
                module = importlib.util.module_from_spec(module_spec)
                sys.modules[path.stem] = module
                try:
                    module_spec.loader.exec_module(module)
                except BaseException:
                    sys.modules.pop(path.stem, None)  # a half-run module is not importable
                    raise
            else:
                if "" not in sys.path and str(Path.cwd()) not in sys.path:
                    sys.path.insert(0, str(Path.cwd()))  # as `python -m` would: the current folder's modules
                try:
                    importlib.import_module(spec)
                except ModuleNotFoundError as exc:
                    if exc.name and spec.split(".")[0] == exc.name.split(".")[0]:
                        raise InputError(f"--import {spec}: no module named {exc.name!r} (give a module "
                                         f"importable from the current folder, or a .py file)") from None
                    raise
        loaded.append(spec)
    for entry in importlib.metadata.entry_points(group="attnlab.plugins"):
        with _importing(f"the attnlab.plugins entry point {entry.name!r} ({entry.value})"):
            entry.load()
        loaded.append(entry.value)
    return loaded
