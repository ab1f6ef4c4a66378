"""``python -m attnlab.cli``: the ``attnlab`` command."""

from .app import console

console()
