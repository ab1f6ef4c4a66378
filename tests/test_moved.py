"""Modules that moved (attnlab.moved): the former paths still import, as the new modules
themselves, with a notice that names the new path and the version that removes the old one."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings

import pytest

import attnlab
from attnlab.moved import MOVED, MOVED_NAMES
from attnlab.suggest import FORMER_NAMES_GO_IN


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3])


def test_moved_paths_are_kept_only_until_their_removal_version():
    """Fails once attnlab's version reaches FORMER_NAMES_GO_IN: then MOVED and attnlab.models.from_hf's
    former home are to be removed."""
    assert _version(attnlab.__version__) < _version(FORMER_NAMES_GO_IN), (
        f"attnlab {attnlab.__version__} still serves {len(MOVED)} former module paths that were to go in "
        f"{FORMER_NAMES_GO_IN}: remove attnlab.moved.MOVED's entries")


@pytest.mark.parametrize("former", sorted(MOVED))
def test_a_former_path_is_the_new_module_with_a_notice(former):
    homes = (MOVED[former],) if isinstance(MOVED[former], str) else MOVED[former]
    parts = [importlib.import_module(home) for home in homes]
    sys.modules.pop(former, None)  # imported once already, a path warns no more: as a fresh program would
    said = f"{former} is now {' and '.join(homes)}; the old path works until attnlab {FORMER_NAMES_GO_IN}"
    with pytest.warns(FutureWarning, match=re.escape(said)):
        old = importlib.import_module(former)
    if len(parts) == 1:
        assert old is parts[0]
    else:  # a module split in several gives each part's public names
        assert all(getattr(old, name) is getattr(part, name) for part in parts for name in part.__all__)


def test_the_new_paths_import_without_a_notice_and_the_models_never_name_a_former_one():
    # In a fresh interpreter: every module of the package imported by its new name, warnings as errors.
    code = ("import warnings, pkgutil, importlib; warnings.simplefilter('error', FutureWarning)\n"
            "import attnlab\n"
            "for m in pkgutil.walk_packages(attnlab.__path__, 'attnlab.'):\n"
            "    if not m.name.startswith(('attnlab.lab', 'attnlab.cli', 'attnlab.__main__')):\n"
            "        importlib.import_module(m.name)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_from_hf_former_home_warns_and_gives_the_same_function():
    import attnlab.formats
    import attnlab.models

    with pytest.warns(FutureWarning, match=r"attnlab\.models\.from_hf is now attnlab\.formats\.from_hf"):
        assert attnlab.models.from_hf is attnlab.formats.from_hf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert attnlab.from_hf is attnlab.formats.from_hf


@pytest.mark.parametrize("former", sorted(MOVED_NAMES))
def test_a_name_that_left_its_module_is_served_there_with_a_notice(former):
    module, name = former.rsplit(".", 1)
    home, _, called = MOVED_NAMES[former].partition(":")
    new = getattr(importlib.import_module(home), called or name)
    said = f"{former} is now {home}.{called or name}; the old path works until attnlab {FORMER_NAMES_GO_IN}"
    with pytest.warns(FutureWarning, match=re.escape(said)):
        assert getattr(importlib.import_module(module), name) is new
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        getattr(importlib.import_module(module), "no_such_name")
