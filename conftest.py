"""The README's Python blocks run as tests (Sybil), top to bottom in one namespace, in a
fresh temporary folder, so that a renamed argument breaks the build instead of the reader.
A block that is not meant to run (it needs a GPU or files the reader has) is preceded by
``<!-- skip: next -->`` in the Markdown, and the text around it says why."""

import os
import shutil
import tempfile

from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser


def _setup(namespace):
    namespace["_home"], namespace["_work"] = os.getcwd(), tempfile.mkdtemp(prefix="attnlab-readme-")
    os.chdir(namespace["_work"])


def _teardown(namespace):
    os.chdir(namespace.pop("_home"))
    shutil.rmtree(namespace.pop("_work"), ignore_errors=True)


pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(), SkipParser()],
    patterns=["README.md"],
    setup=_setup,
    teardown=_teardown,
).pytest()
