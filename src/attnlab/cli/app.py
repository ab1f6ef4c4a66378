"""The parser and what runs every command: the options and free arguments mixed, the
check that the command line is UTF-8, the plugins imported, errors as one line with an
exit status, warnings as one line; :func:`console`, the ``attnlab`` program."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import traceback
import warnings
from typing import Sequence

from .. import __version__
from ..errors import InputError, LostProcessError, NonFiniteLossError, WriteError
from ..memory import keep_freed_memory
from ..plugins import import_plugins
from . import bench, catalog_cmds, chat, data, demo, explore, generate, lab, predict, train


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``attnlab translate: error: argument --beam-size: ...``."""
    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


# Each command's sub-parser (its module's ``add_NAME``), in the order `attnlab --help` lists them.
COMMANDS = (catalog_cmds.add_models, catalog_cmds.add_kinds, catalog_cmds.add_sources, demo.add_demo,
            catalog_cmds.add_recipes, train.add_train, train.add_eval, predict.add_predict, generate.add_generate, chat.add_chat,
            train.add_export, explore.add_visualize, explore.add_explore, lab.add_lab, predict.add_translate,
            train.add_report, data.add_data, bench.add_bench)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="attnlab", description="Attention mechanisms and the models built on them."
    )
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.commands = sub.choices  # type: ignore[attr-defined]  # name -> its parser, for _parse
    # Commands that read recipes or runs can name a module that registers tasks or models of one's own.
    plugins = argparse.ArgumentParser(add_help=False)
    plugins.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                         help="import MODULE first (a module or a .py file that registers a task or a model of "
                              "your own; repeatable)")

    for add in COMMANDS:
        add(sub, plugins)
    return parser


def subcommands() -> list[tuple[str, str]]:
    """Each subcommand of ``attnlab`` with its one-line help, in the order ``--help`` lists them.

    The user guide's list of subcommands is printed from this, so it cannot drift from the parser.
    """
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [(action.dest, action.help or "") for action in sub._choices_actions]


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse, letting options and free arguments mix after a command:
    ``attnlab train RECIPE --run-dir D train.lr=1e-3`` works as well as with the
    overrides first (plain argparse stops collecting ``nargs="*"`` at the first option)."""
    given = list(sys.argv[1:] if argv is None else argv)
    argv = _dashed(given)
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    command = getattr(args, "command", None)
    sub = getattr(parser, "commands", {}).get(command)
    _unknown_options(sub or parser, extra, dict(zip(argv, given)))
    if sub is None or command not in INTERMIXED:
        parser.parse_args(argv)  # reports the unrecognized arguments and exits 2
    rest = argv[argv.index(command) + 1 :]
    return sub.parse_intermixed_args(rest, namespace=argparse.Namespace(command=command))


EACH_INPUT_ON_ITS_OWN = {("predict", "inputs"), ("translate", "inputs")}


def _undecodable(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The refusal of the first argument that is not UTF-8, else ``""``. Python keeps the bytes
    of such an argument as lone surrogates (``b"caf\\xe9"`` is ``"caf\\udce9"``), which
    nothing downstream can write or encode: a YAML value, a path in config.json. Named as the
    user gave it: ``--run-dir``, ``override train.lr``, ``PROMPT``. The inputs of ``predict``
    and ``translate`` are left to the command, which reports a bad one and goes on with the
    others (exit 2 at the end)."""
    sub = getattr(parser, "commands", {}).get(args.command)
    for action in (sub or parser)._actions:  # noqa: SLF001  # argparse's own list
        if (args.command, action.dest) in EACH_INPUT_ON_ITS_OWN:
            continue
        value = getattr(args, action.dest, None)
        for text in value if isinstance(value, list) else [value]:
            if not isinstance(text, str):
                continue
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                if action.dest == "overrides":
                    name = f"override {text.partition('=')[0]!r}"
                elif action.option_strings:
                    name = max(action.option_strings, key=len)
                else:
                    name = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
                byte = ord(text[exc.start]) - 0xDC00 if 0xDC80 <= ord(text[exc.start]) <= 0xDCFF else None
                what = f"byte {byte:#04x}" if byte is not None else "a lone surrogate"
                return (f"{name} is not valid UTF-8 ({what} at character {exc.start}): attnlab reads its command "
                        f"line as UTF-8 text")
    return ""


INTERMIXED = ("train", "predict", "translate", "recipes")  # commands with a free list of arguments


def _dashed(argv: list[str]) -> list[str]:
    """``argv`` with underscores in long option names written as dashes: ``--max_new_tokens 20``
    (the spelling of transformers' keyword) is ``--max-new-tokens 20``. No attnlab option has an
    underscore; arguments after ``--`` are left alone."""
    out = []
    for i, token in enumerate(argv):
        if token == "--":
            return out + argv[i:]
        name, eq, value = token.partition("=")
        out.append(name.replace("_", "-") + eq + value if token.startswith("--") and "_" in name else token)
    return out


# What other tools call an option that attnlab names otherwise (a command's output folder is its
# --run-dir for train, --out for the commands that write one file or folder).
_MEANT = {"--out": ("--run-dir",), "--output": ("--out", "--run-dir"), "--output-dir": ("--out", "--run-dir"),
          "--out-dir": ("--out", "--run-dir"), "--outdir": ("--out", "--run-dir"), "--dir": ("--run-dir",)}


def _unknown_options(parser: argparse.ArgumentParser, extra: Sequence[str], typed: dict[str, str]) -> None:
    """Exit 2 naming the first option of ``extra`` that ``parser`` does not know (as the user
    typed it: ``typed`` maps the dashed spelling back), with the options it knows that are close
    to it (argparse of Python 3.11 names it alone)."""
    known = [o for o in parser._option_string_actions if o.startswith("--")]  # noqa: SLF001  # argparse's own table
    for token in extra:
        name = token.partition("=")[0]
        if name.startswith("--") and not any(o.startswith(name) for o in known):
            meant = [o for o in _MEANT.get(name, ()) if o in known]  # another tool's word for one of ours
            close = meant or difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(close)}?" if close else f"; see {parser.prog} --help"
            parser.exit(2, f"{parser.prog}: error: unrecognized option {typed.get(token, token).partition('=')[0]}"
                           f"{hint}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = _parse(parser, argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed): a status, not an exception
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help()
        return 0
    prefix = f"attnlab {args.command}"
    undecodable = _undecodable(parser, args)
    if undecodable:
        print(f"{prefix}: error: {undecodable}", file=sys.stderr)
        return 2
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warnings(prefix)
        try:
            import_plugins(getattr(args, "imports", []))
            return args.func(args)
        except (InputError, FileNotFoundError) as exc:  # the user's input: one line
            if getattr(exc, "traceback", ""):  # a module of the user's that failed: its own traceback first
                print(exc.traceback, end="", file=sys.stderr)
            print(f"{prefix}: error: {exc}", file=sys.stderr)
            return 2
        except WriteError as exc:  # a full disk or a file system gone read-only, mid-run
            hint = ("; every checkpoint written before is intact: free space, then continue with --resume"
                    if args.command == "train" else "")
            print(f"{prefix}: error: {exc}{hint}", file=sys.stderr)
            return 1
        except OSError as exc:  # a file given by the user that cannot be read: no permission, a folder, ...
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"{prefix}: error: {where}{exc.strerror or exc}", file=sys.stderr)
            return 2
        except (NonFiniteLossError, LostProcessError) as exc:
            print(f"{prefix}: error: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except Exception:  # noqa: BLE001  # anything else is attnlab's fault, not the user's
            traceback.print_exc()
            print(f"{prefix}: internal error: this is a bug in attnlab {__version__}, not a mistake in your input; "
                  f"please report it with the command line and the traceback above", file=sys.stderr)
            return 1


def _one_line_warnings(prefix: str):
    """``warnings.showwarning`` for the command line: ``attnlab train: warning: ...``, one
    line, without the Python source line that the default format adds, and each text once (a
    recipe is read on more than one path; warnings' own "once" forgets what it showed whenever a
    library imported on the way adds a filter)."""
    shown: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
        text = " ".join(str(message).split())
        if text in shown:
            return
        shown.add(text)
        print(f"{prefix}: warning: {text}", file=file or sys.stderr)

    return show


def console() -> None:
    """The ``attnlab`` command: :func:`main` in a process that keeps freed memory
    (:func:`attnlab.memory.keep_freed_memory`: no fresh pages for the large tensors of every
    step) unless ``ATTNLAB_KEEP_FREED_MEMORY=0``."""
    keep = os.environ.get("ATTNLAB_KEEP_FREED_MEMORY", "1")
    if keep not in ("0", "1"):
        print(f"attnlab: error: ATTNLAB_KEEP_FREED_MEMORY must be 0 or 1; got {keep!r}", file=sys.stderr)
        sys.exit(2)
    if keep == "1":
        keep_freed_memory()
    sys.exit(main())
