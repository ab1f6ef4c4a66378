"""``attnlab predict`` and ``attnlab translate``: a run's predictions on inputs from the
command line or standard input, streamed in order, one output line per input."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from ..errors import InputError
from ..limits import MAX_LINE_CHARS
from .common import CHECKPOINT_HELP, UsageError, positive_int


def _run_for(args: argparse.Namespace, command: str):
    """The run of ``args.run_dir``, refused when its task makes no predictions of the kind
    ``command`` prints (labels for predict; generated text for translate)."""
    from ..tasks import load_run

    run = load_run(args.run_dir, args.checkpoint, device=args.device)
    task = run.task
    if task.inputs is None:
        raise UsageError(f"{args.run_dir} is a run of the {task.name} task, which makes no predictions on new "
                         f"inputs")
    if command == "translate" and task.outputs != "text":
        raise UsageError(f"{args.run_dir} is a run of the {task.name} task: its predictions are labels; "
                         f"'attnlab predict {args.run_dir} ...' gives them")
    return run


def cmd_predict(args: argparse.Namespace) -> int:
    """Labels (or generated texts) for image files or texts, given as arguments or one per
    line on standard input, printed as they are computed."""
    run = _run_for(args, "predict")
    options = {"top_k": args.top_k, "batch_size": args.batch_size} if run.task.outputs == "labels" else \
        {"batch_size": args.batch_size}
    what = "image FILEs" if run.task.inputs == "images" else "texts"
    return _stream(args, run, options, f"give {what} to {'classify' if run.task.outputs == 'labels' else 'predict'}, "
                                       f"as arguments or lines on standard input")


def cmd_translate(args: argparse.Namespace) -> int:
    """Texts from the command line, else standard input line by line: each translated
    batch is printed as soon as it is done, so a long file streams through."""
    run = _run_for(args, "translate")
    options = {"num_beams": args.beam_size, "max_length": args.max_length, "batch_size": args.batch_size}
    return _stream(args, run, options, "give texts to translate, or lines on standard input",
                   chunk=16 * args.batch_size)


def _predict_each(run, inputs: list[str], options: dict) -> list:
    """``run.predict`` over ``inputs``: a prediction, or the ``InputError`` of an input that
    cannot be read (an image file that is missing or damaged), one per input."""
    try:
        return run.predict(inputs, **options)
    except InputError:
        if len(inputs) == 1:
            raise
    out: list = []
    for item in inputs:  # find the bad ones; the others keep their predictions
        try:
            out += run.predict([item], **options)
        except InputError as exc:
            out.append(exc)
    return out


def _stream(args: argparse.Namespace, run, options: dict, empty: str, chunk: int = 256) -> int:
    """Inputs of ``args.inputs`` or of standard input through ``run.predict`` in chunks, in
    order, one output line per input. An input that is blank, not valid UTF-8 or cannot be
    read is reported on standard error (with ``--json``, as a line with an ``error``) and
    not predicted; where the outputs are texts an empty line keeps them aligned with the
    inputs. The exit status is 2 when an input was bad (a blank one is only reported)."""
    as_json = getattr(args, "json", False)
    gives_text = run.task.outputs == "text"
    limit = args.max_line_chars
    items = _checked_arguments(args.inputs, limit) if args.inputs else _stdin_lines(limit)
    seen = bad = 0

    def emit(where: str, text: str | None, problem: str | None, result) -> None:
        if isinstance(result, Exception) or result is None:
            error = problem if text is None else "blank input" if not text.strip() else str(result)
            if text is not None:  # (bad UTF-8 and over-long texts were reported as they were read)
                note = "blank: not predicted" if not text.strip() else f"error: {result}"
                print(f"attnlab: {where}: {note}", file=sys.stderr)
            if as_json:
                print(json.dumps({"input": text, "error": error}, ensure_ascii=False), flush=True)
            elif gives_text:
                print("", flush=True)
        elif as_json:
            record = {"input": result.input, "output": result.output} if gives_text else \
                {"input": result.input, "label": result.label, "prob": round(result.prob, 6),
                 "top_k": [{"label": label, "prob": round(q, 6)} for label, q in result.labels]}
            print(json.dumps(record, ensure_ascii=False), flush=True)
        elif gives_text:
            print(result.output, flush=True)
        else:
            print("\t".join(f"{label}\t{q:.3f}" for label, q in result.labels) + f"\t{result.input}", flush=True)

    for part in _chunks(items, chunk):
        seen += len(part)
        good = [text for _, text, _ in part if text is not None and text.strip()]
        results = iter(_predict_each(run, good, options) if good else [])
        for where, text, problem in part:
            result = next(results) if text is not None and text.strip() else None
            bad += text is None or isinstance(result, Exception)
            emit(where, text, problem, result)
    if not seen:
        raise UsageError(empty)
    return 2 if bad else 0


def _unread(where: str, problem: str) -> tuple[str, None, str]:
    """An input that is not predicted, reported on standard error as it is read."""
    print(f"attnlab: error: {where} {problem}; it was skipped", file=sys.stderr)
    return where, None, problem


def _not_utf8(where: str, position: int) -> tuple[str, None, str]:
    return _unread(where, f"is not valid UTF-8 (at position {position})")


def _too_long(where: str, length: str, limit: int) -> tuple[str, None, str]:
    return _unread(where, f"is too long ({length}; the limit is {limit:,} characters, which --max-line-chars raises)")


def _checked_arguments(texts: Sequence[str], limit: int):
    """``(where, text, None)`` of command-line texts, as they are taken; ``(where, None,
    problem)`` for one that is not valid UTF-8 (Python keeps such bytes as lone surrogates,
    which no tokenizer can encode) or is longer than ``limit`` characters. ``-`` stands for
    the lines of standard input (:func:`_stdin_lines`)."""
    for i, text in enumerate(texts, 1):
        where = f"argument {i}"
        if text == "-":
            yield from _stdin_lines(limit)
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            yield _not_utf8(where, exc.start)
            continue
        yield _too_long(where, f"{len(text):,} characters", limit) if len(text) > limit else (where, text, None)


def _stdin_lines(limit: int):
    """``(where, line, None)`` of standard input, the newline removed, decoded as UTF-8 one
    by one; ``(where, None, problem)`` (reported on standard error) for a line that is not
    valid UTF-8 or longer than ``limit`` characters. A line is read a bounded piece at a time (at most
    ``4 * limit + 4`` bytes of it are held), so a hostile one costs no more memory than
    one at the limit."""
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # a text stream put in place of stdin (tests, embedding programs)
        for n, line in enumerate(sys.stdin, 1):
            where, line = f"line {n} of standard input", line.rstrip("\n").rstrip("\r")
            yield _too_long(where, f"{len(line):,} characters", limit) if len(line) > limit else (where, line, None)
        return
    most = 4 * limit + 4  # a character is up to 4 bytes of UTF-8, the line ending 2
    number = 0
    while raw := stream.readline(most + 1):
        number += 1
        where = f"line {number} of standard input"
        if len(raw) > most:
            while not raw.endswith(b"\n") and (raw := stream.readline(1 << 20)):
                pass  # the rest of the line, a block at a time
            yield _too_long(where, f"more than {most:,} bytes", limit)
            continue
        try:
            text = raw.decode("utf-8").rstrip("\n").rstrip("\r")
        except UnicodeDecodeError as exc:
            yield _not_utf8(where, exc.start)
            continue
        yield _too_long(where, f"{len(text):,} characters", limit) if len(text) > limit else (where, text, None)


def _chunks(items, size: int):
    """Lists of up to ``size`` items from an iterable, as they arrive."""
    chunk: list = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def add_predict(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab predict``."""
    p = sub.add_parser("predict", parents=[plugins],
                       help="predict with a trained run: labels of images or texts, or generated texts")
    p.add_argument("run_dir", help="a run directory written by 'attnlab train'")
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="image files for an image run; texts for a text run (default, or -: lines of standard input)")
    p.add_argument("--checkpoint", default="auto", help=CHECKPOINT_HELP)
    p.add_argument("--top-k", type=positive_int, default=1, help="labels (with probabilities) per input (default 1)")
    p.add_argument("--json", action="store_true",
                   help="JSON Lines: one object per input (input, label, prob, top_k; or error)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="inputs per batch (default 64)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto (default cpu)")
    p.add_argument("--max-line-chars", type=positive_int, default=MAX_LINE_CHARS, metavar="N",
                   help=f"a longer text is reported and skipped, unread (default {MAX_LINE_CHARS:,})")
    p.set_defaults(func=cmd_predict)


def add_translate(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab translate``."""
    p = sub.add_parser("translate", parents=[plugins],
                       help="generate texts with a trained run that does (translation), with decoding options")
    p.add_argument("run_dir", help="a translation run directory written by 'attnlab train'")
    p.add_argument("inputs", nargs="*", metavar="TEXT", help="texts to translate (default, or -: lines of standard input)")
    p.add_argument("--beam-size", type=positive_int, default=None, help="beams (default: the run's recipe, 4)")
    p.add_argument("--max-length", type=positive_int, default=None,
                   help="most tokens per translation (default: source length + 50)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="sentences per batch (default 64)")
    p.add_argument("--checkpoint", default="auto",
                   help="averaged, best, last or a checkpoint folder (default: the first of those the run has)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps (default auto)")
    p.add_argument("--json", action="store_true", help="JSON Lines: one object per input (input, output; or error)")
    p.add_argument("--max-line-chars", type=positive_int, default=MAX_LINE_CHARS, metavar="N",
                   help=f"a longer text is reported and skipped, unread (default {MAX_LINE_CHARS:,})")
    p.set_defaults(func=cmd_translate)
