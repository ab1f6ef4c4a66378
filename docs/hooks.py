"""MkDocs hooks for the pages' executed code (markdown-exec runs it while the site builds).

* ``docs/`` goes on ``sys.path``, so that a page can ``from docs_figures import figure_html``.
* The running Python's ``bin/`` goes first on ``PATH``, so that a page's shell blocks
  (``attnlab train ...``) run the ``attnlab`` of the environment that builds the site.
* The pages' code runs in a fresh temporary folder (the working directory during the
  build), so that ``runs/...`` and other files a page writes land there and are removed
  afterwards; ``ATTNLAB_DATA_DIR`` is made absolute first.
* Matplotlib draws off-screen.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

_DOCS = str(Path(__file__).resolve().parent)
_state: dict[str, str] = {}


def on_startup(**kwargs) -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")
    if _DOCS not in sys.path:
        sys.path.insert(0, _DOCS)
    bin_dir = str(Path(sys.executable).parent)
    if not os.environ.get("PATH", "").startswith(bin_dir + os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    if os.environ.get("ATTNLAB_DATA_DIR"):
        os.environ["ATTNLAB_DATA_DIR"] = str(Path(os.environ["ATTNLAB_DATA_DIR"]).resolve())


def enter_workdir() -> str:
    """Make a fresh temporary folder the working directory; return it."""
    _state["home"] = os.getcwd()
    _state["work"] = tempfile.mkdtemp(prefix="attnlab-docs-")
    os.chdir(_state["work"])
    return _state["work"]


def leave_workdir() -> None:
    if "work" in _state:
        os.chdir(_state.pop("home"))
        shutil.rmtree(_state.pop("work"), ignore_errors=True)


def on_config(config, **kwargs):  # the configuration's paths are absolute by now
    enter_workdir()
    return config


def on_post_build(**kwargs) -> None:
    leave_workdir()


def on_build_error(**kwargs) -> None:
    leave_workdir()
