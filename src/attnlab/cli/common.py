"""What the commands share: the usage error, argparse types, the results table, the
checks of a text given on the command line. Imports nothing heavy: every module of the
command line imports it, `attnlab --version` included."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ..errors import InputError
from ..limits import MAX_LINE_CHARS


class UsageError(InputError):
    """Bad input from the command line: printed as one line, exit status 2."""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


CHECKPOINT_HELP = ("best, last, averaged or a checkpoint folder (default: the weights results.json was tested "
                   "with)")


def table(rows: list[tuple[str, str]], header: tuple[str, str] = ("result", "value")) -> None:
    print(f"| {header[0]} | {header[1]} |")
    print("| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")


def text_argument(text: str, name: str, limit: int = MAX_LINE_CHARS) -> str:
    """A text given on the command line (``name`` in its usage line), as the command reads it:
    ``-`` is the whole of standard input (one line ending removed); refused in one line when
    it is not valid UTF-8 (Python keeps such bytes as lone surrogates, which no tokenizer
    encodes) or is longer than ``limit`` characters."""
    if text == "-":
        stream = getattr(sys.stdin, "buffer", None)
        most = 4 * limit + 2  # a character is up to 4 bytes of UTF-8
        raw = stream.read(most + 1) if stream is not None else sys.stdin.read(limit + 1).encode("utf-8", "surrogateescape")
        if len(raw) > most:
            raise UsageError(f"{name} -: standard input holds more than {most:,} bytes; a text is at most {limit:,} "
                             f"characters")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"{name} -: standard input is not valid UTF-8 (at byte {exc.start})") from None
        text = text[:-1] if text.endswith("\n") else text
        text = text[:-1] if text.endswith("\r") else text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(f"{name} is not valid UTF-8 (at character {exc.start}): give text in UTF-8, or - to read "
                         f"it from standard input") from None
    if len(text) > limit:
        raise UsageError(f"{name} is {len(text):,} characters long; the limit is {limit:,}")
    return text


def text_arguments(texts: Sequence[str], name: str, limit: int = MAX_LINE_CHARS) -> list[str]:
    """Texts given on the command line, each checked as :func:`text_argument` checks one;
    ``-`` among them stands for the lines of standard input (blank ones left out; all of them
    within ``limit`` characters)."""
    out: list[str] = []
    for i, text in enumerate(texts, 1):
        where = f"{name} {i}" if len(texts) > 1 else name
        if text != "-":
            out.append(text_argument(text, where, limit))
            continue
        out += [line for line in text_argument("-", name, limit).splitlines() if line.strip()]
    return out


def load_run_or_model(path: str, checkpoint: str, device: str, int8: bool = False):  # type: ignore[no-untyped-def]
    """The run directory ``path`` (its ``checkpoint``), or the pretrained decoder there (a Hugging
    Face folder or a GGUF file) as a finished language-model run; ``int8``: its linear layers'
    weights kept in 8 bits (:func:`~attnlab.attention.int8.quantize_int8`)."""
    from ..formats.hf.load import is_pretrained
    from ..formats.packaged import resolve_packaged
    from ..tasks import load_run
    from ..tasks.lm_folders import load_folder

    path = resolve_packaged(path)  # smollm2-135m-instruct: the installed package's file
    if is_pretrained(path):
        if checkpoint != "auto":
            raise UsageError(f"--checkpoint chooses among a run's checkpoints; {path} is a pretrained model (a Hugging "
                             f"Face folder or a GGUF file), whose weights are its own")
        run = load_folder(path, device=device)
    else:
        run = load_run(path, checkpoint, device=device)
    if int8:  # 1.3x float32's tokens a second at batch 1 for SmolLM2-135M (the results page on decoding)
        from ..attention.int8 import quantize_int8

        quantize_int8(run.model)
    return run
