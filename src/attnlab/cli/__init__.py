"""The ``attnlab`` command, one module per group of commands.

:mod:`.app` holds the parser, :func:`main` and :func:`console` (the ``attnlab`` program); each
command module (:mod:`.catalog_cmds`, :mod:`.demo`, :mod:`.train`, :mod:`.predict`,
:mod:`.generate`, :mod:`.explore`, :mod:`.data`, :mod:`.bench`) registers its subcommands'
arguments with an ``add_NAME(sub, plugins)`` and holds their ``cmd_*`` functions; :mod:`.common`
what they share.

Only what every command needs is imported at the top of these modules; each command imports its
own modules, so that `attnlab --version`, `attnlab --help` and `attnlab recipes` start without torch
(the heaviest import, most of what `attnlab --version` took before; see the CHANGELOG).
"""

from .app import build_parser, console, main, subcommands
from .common import UsageError

__all__ = ["UsageError", "build_parser", "console", "main", "subcommands"]
