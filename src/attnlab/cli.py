"""The ``attnlab`` command."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Sequence

# Only what every command needs is imported here; each command imports its own modules, so that
# `attnlab --version`, `attnlab --help` and `attnlab recipes` start without torch (the heaviest import:
# about 2 s of the 2.7 s `attnlab --version` took on 2 cores before; see the CHANGELOG).
from . import __version__
from .bench.parts import LM_PARTS, VISION_PARTS
from .errors import InputError, NonFiniteLossError, WriteError
from .families import decoder_names, encoder_names
from .limits import MAX_LINE_CHARS
from .memory import keep_freed_memory
from .plugins import import_plugins


class UsageError(InputError):
    """Bad input from the command line: printed as one line, exit status 2."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def cmd_models(args: argparse.Namespace) -> int:
    import torch

    from .models import count_parameters, create_model, list_models, model_entry

    names = list_models(args.pattern)
    if not names:
        raise UsageError(f"no model matches {args.pattern!r}; run 'attnlab models' for the list")
    rows = []
    for name in names:
        with torch.device("meta"):  # shapes only: counts parameters without allocating them
            n = count_parameters(create_model(name))
        entry = model_entry(name)
        rows.append((name, entry.family, f"{n / 1e6:.1f} M", f"{n:,}", entry.description))
    header = ("model", "family", "params", "exact", "description")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    line = lambda r: "  ".join(c.ljust(w) if i != 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r[:4], widths))) + "  " + r[4]
    print(line(header))
    for r in rows:
        print(line(r))
    return 0


def cmd_kinds(args: argparse.Namespace) -> int:
    """The attention kinds with what each can do; with a name, that kind's options (types,
    defaults, ranges), as its registration declares them."""
    from .attention import registry

    if args.kind is None:
        flags = ("causal", "padding", "weights", "cache", "streaming", "decode_step")
        rows = [("kind", "family", *(f.replace("_", " ") for f in flags), "summary")]
        for name in registry.list_attention():
            caps = registry.attention_capabilities(name)
            marks = ["-" if getattr(caps, f) is None else ("only" if f == "causal" and caps.causal_only else
                                                           "yes" if getattr(caps, f) else "no") for f in flags]
            rows.append((name, registry.attention_family(name), *marks, registry.attention_summary(name)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
        print("\nattnlab kinds KIND lists a kind's options; a model takes them as attention_options.")
        return 0
    caps = registry.attention_capabilities(args.kind)  # an unknown name: one line with the close ones
    can = [f.replace("_", " ") for f in ("causal", "padding", "weights", "cache", "streaming", "decode_step",
                                         "positions", "causal_only") if getattr(caps, f)]
    print(f"{args.kind} ({registry.attention_family(args.kind)}): {registry.attention_summary(args.kind)}")
    print(f"declares: {', '.join(can) or 'none of the flags'}"
          + (f"; LoRA roles: {', '.join(caps.lora_roles)}" if caps.lora_roles else ""))
    options = list(registry.attention_options(args.kind))
    if not options:
        print("options: none")
        return 0
    rows = [("option", "takes", "default", "what it does")]
    rows += [(o.name, o.expected(), "required" if o.required else repr(o.default), o.help) for o in options]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[3])
    return 0


def cmd_sources(args: argparse.Namespace) -> int:
    """The registered data sources, by kind of data, each with the data keys it takes."""
    from .data.source import list_sources

    for source in sorted(list_sources(), key=lambda s: s.kind):
        keys = [f.name for f in dataclasses.fields(source.config_class) if f.name not in ("name", "data_dir")]
        print(f"{source.kind:<15} {source.name:<16} {source.summary}\n{'':<32} data keys: {', '.join(keys) or '-'}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """``attnlab train demo-reverse`` into a temporary folder, with its examples."""
    import torch

    from .recipes import load_recipe
    from .tasks import get_task, load_run, train

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {args.device}: CUDA is not available on this machine")
    recipe = load_recipe("demo-reverse", [f"train.steps={args.steps}", f"train.seed={args.seed}",
                                          f"data.seed={args.seed}", f"train.device={args.device}",
                                          "train.tensorboard=false", "train.progress=false"])
    print(f"attnlab {__version__}: training {recipe.model.name} to reverse token strings "
          f"({args.steps} steps, device {args.device})")
    with tempfile.TemporaryDirectory(prefix="attnlab-demo-") as folder:
        task = get_task(recipe.task)
        results = train(recipe, folder)
        run = load_run(folder)
        examples = run.predict(["5 9 3 7", "12 4 4 18 6", "3 14 8 19 11 10 5"])
    print()
    _table([("training steps", f"{results['steps']}"), ("training time", f"{results['train_seconds']:.1f} s"),
            *task.metric_rows(results)], ("metric", "value"))
    print()
    for p in examples:
        print(f"  {p.input} -> {p.output}")
    return 0


def _table(rows: list[tuple[str, str]], header: tuple[str, str] = ("result", "value")) -> None:
    print(f"| {header[0]} | {header[1]} |")
    print("| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")


def cmd_data_list(args: argparse.Namespace) -> int:
    from .data.download import list_datasets
    from .data.paths import data_dir

    root = data_dir(args.data_dir)
    rows = list_datasets(root)
    width = max(len(name) for name, _, _ in rows)
    print(f"data directory: {root}")
    for name, description, present in rows:
        print(f"{name.ljust(width)}  {'present' if present else 'missing'}  {description}")
    return 0


def cmd_data_download(args: argparse.Namespace) -> int:
    from .data.download import check_base_url, download

    check_base_url(args.base_url, "--base-url")
    download(args.name, args.data_dir, base_url=args.base_url)
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    """The shipped recipes; with NAME (or a YAML file) its resolved settings, with --keys
    every key with its type, default and help."""
    from .recipes import list_recipes

    if args.name is None:
        if args.keys:
            raise UsageError("--keys lists the keys of one recipe: attnlab recipes NAME --keys")
        rows = list_recipes()
        width = max(len(name) for name, _, _ in rows)
        task_width = max(len(task) for _, task, _ in rows)
        for name, task, description in rows:
            print(f"{name.ljust(width)}  {task.ljust(task_width)}  {description}")
        return 0
    import yaml  # (below: one recipe, read with its task's classes, which import torch)

    from .data.tokenize import shorten
    from .recipes import load_recipe, recipe_keys
    from .tasks import recipe_dict

    recipe = load_recipe(args.name, args.overrides)
    if not args.keys:
        print(yaml.safe_dump(recipe_dict(recipe), sort_keys=False, allow_unicode=True), end="")
        return 0
    rows = [(key, shorten(tp, 28), shorten(_shown(default), 32), shorten(_shown(value), 32), help_)
            for key, tp, default, value, help_ in recipe_keys(recipe)]
    header = ("key", "type", "default", "value", "help")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    for row in [header] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + ("  " + row[4] if row[4] else ""))
    return 0


def _shown(value: object) -> str:
    """A value as an override would spell it: ``null``, ``true``, ``[1, 2]``."""
    if value is None or isinstance(value, (bool, dict, list, tuple)):
        return json.dumps(value)
    return str(value)


def cmd_train(args: argparse.Namespace) -> int:
    from .engine import distributed

    if args.allow_changes and not args.resume:
        raise UsageError("--allow-changes applies to --resume: it lets a resumed run continue with changed settings")
    try:
        code = _train(args)
    except BaseException:
        distributed.cleanup(wait=False)  # a failing rank must not wait for peers that may be gone
        raise
    distributed.cleanup()  # under torchrun: all ranks meet, then the process group goes
    return code


def _train(args: argparse.Namespace) -> int:
    from .engine import distributed
    from .report import write_run_report_safely
    from .tasks import get_task, model_label, train

    recipe, name = _train_recipe(args)  # validated before any work starts
    task = get_task(recipe.task)
    distributed.init_distributed(recipe.train.device)  # under torchrun: join the group; else nothing
    # Under torchrun all ranks take rank 0's name (their clocks may straddle a second).
    run_dir = args.run_dir or distributed.broadcast_object(f"runs/{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if distributed.is_main():
        verb = "resuming" if args.resume else "train"
        print(f"attnlab {verb} {name}: {model_label(recipe.model)} on {recipe.data.name} ({task.name}), "
              f"run directory {run_dir}")
    results = train(recipe, run_dir, resume=args.resume, allow_changes=args.allow_changes)
    if not distributed.is_main():  # rank 0 alone writes the report and prints the results
        return 0
    write_run_report_safely(run_dir, print)
    print()
    stopped = [("training steps", f"{results['steps']:,} of {recipe.train.steps:,} ({results['stopped']})")] \
        if results.get("stopped") else []
    _table([*task.metric_rows(results), ("parameters", f"{results['params']:,}"), *stopped,
            ("training time", f"{results['train_seconds']:.1f} s"),
            ("throughput", f"{results['samples_per_s']:,.0f} {task.sample_unit}/s")])
    print(f"\nrun directory: {run_dir}")
    return 0


def _train_recipe(args: argparse.Namespace):
    """``(recipe, name)``: the named recipe with its overrides; or, for ``--resume``
    without a recipe, the run's own (its config.yaml and recorded changes) with the
    overrides applied on top."""
    from .engine.config import apply_overrides
    from .recipes import load_recipe
    from .tasks import read_recipe, recipe_dict, recipe_from_dict

    if args.recipe is not None and "=" in args.recipe and not Path(args.recipe).is_file():
        args.overrides.insert(0, args.recipe)  # `attnlab train --resume --run-dir D train.steps=2000`
        args.recipe = None
    if args.recipe is None:
        if not (args.resume and args.run_dir):
            raise UsageError("give a RECIPE (see 'attnlab recipes'), or --run-dir DIR --resume to continue a run "
                             "with its own recipe")
        if not (Path(args.run_dir) / "config.yaml").exists():
            raise UsageError(f"--run-dir {args.run_dir} holds no run to resume (no config.yaml); give a RECIPE "
                             f"to start one there")
        own = recipe_dict(read_recipe(args.run_dir))  # a damaged config.yaml is named before the overrides apply
        return recipe_from_dict(apply_overrides(own, args.overrides)), Path(args.run_dir).name
    recipe = load_recipe(args.recipe, args.overrides)
    name = args.recipe if not args.recipe.endswith((".yaml", ".yml")) else args.recipe.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return recipe, name


def cmd_eval(args: argparse.Namespace) -> int:
    """The test metrics of a run's checkpoint, recomputed; with no --checkpoint, those of
    the weights results.json was tested with, to the last digit. --data: the same metrics
    on a labelled folder or file of one's own."""
    from .tasks import load_run

    run = load_run(args.run_dir, args.checkpoint, device=args.device)
    metrics = run.evaluate(device=args.device, **({"data": args.data} if args.data else {}))
    print(f"checkpoint: {run.checkpoint}")
    if args.data:
        print(f"data: {args.data}")
    _table([*run.task.metric_rows(metrics), ("test samples", f"{metrics['test_samples']:,}")], ("metric", "value"))
    if "bleu_signature" in metrics:
        print(f"sacreBLEU signature: {metrics['bleu_signature']}")
    broken = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
    if broken:  # finite weights whose outputs overflow: a diverged run's, never a result to pass on
        print(f"attnlab eval: error: {', '.join(broken)} not finite: {run.checkpoint} makes NaN or infinite outputs "
              f"on these inputs (the weights of a diverging run?); evaluate an earlier checkpoint", file=sys.stderr)
        return 1
    return 0


def _run_for(args: argparse.Namespace, command: str):
    """The run of ``args.run_dir``, refused when its task makes no predictions of the kind
    ``command`` prints (labels for predict; generated text for translate)."""
    from .tasks import load_run

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


def cmd_generate(args: argparse.Namespace) -> int:
    """The continuation of a prompt by a language-model run, or by a Hugging Face decoder
    folder (its tokenizer, special tokens and generation_config.json's defaults), printed as
    it is generated; with --chat, the reply to a message rendered by the chat template."""
    from .models.hf import is_hf_folder
    from .models.sampling import GENERATION_OPTIONS, check_generation
    from .tasks import load_run
    from .tasks.language_modeling import load_folder

    given = {k: getattr(args, k) for k in GENERATION_OPTIONS if getattr(args, k) is not None}
    options = check_generation(names=lambda key: "--" + key.replace("_", "-"), **given)  # before the run loads
    if args.system is not None and not args.chat:
        raise UsageError("--system is the system message of a chat: give it with --chat")
    if is_hf_folder(args.run_dir):
        if args.checkpoint != "auto":
            raise UsageError(f"--checkpoint chooses among a run's checkpoints; {args.run_dir} is a Hugging Face "
                             f"folder, whose weights are its own")
        run = load_folder(args.run_dir, device=args.device)
    else:
        run = load_run(args.run_dir, args.checkpoint, device=args.device)
    if run.task.outputs != "text":
        raise UsageError(f"{args.run_dir} is a run of the {run.task.name} task: its predictions are labels; "
                         f"'attnlab predict {args.run_dir} ...' gives them")
    chat = {"chat": True, "system": args.system} if args.chat else {}
    prompt = _text_argument(args.prompt, "PROMPT")
    pieces = run.task.stream(run, prompt, **options, **chat)
    first = next(pieces, "")  # the generation's own checks (its cache's memory) come before anything is printed
    sys.stdout.write(("" if args.chat else prompt) + first)
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


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


def cmd_export(args: argparse.Namespace) -> int:
    """A run's classifier as one ONNX (or TorchScript) file with its preprocessing beside
    it, checked against PyTorch on inputs of other shapes than it was captured with."""
    from .tasks import load_run
    from .tasks.export import FORMATS, export_run, model_file, verify_export

    if args.format not in FORMATS:
        raise UsageError(f"--format takes {' or '.join(sorted(FORMATS))}; got {args.format!r}")
    out = Path(args.out) if args.out else Path(args.run_dir) / "export"
    model_file(out, args.format, name="--out")  # before any work: a path that cannot be written is refused now
    run = load_run(args.run_dir, args.checkpoint)
    result = export_run(run, out, args.format, opset=args.opset, overwrite=args.force)
    difference = verify_export(result, run)
    print(f"model: {result.path}")
    print(f"preprocessing: {result.preprocessing}")
    if result.tokenizer is not None:
        print(f"tokenizer: {result.tokenizer}")
    print(f"inputs: {', '.join(result.input_names)}; outputs: {', '.join(result.output_names)}")
    print(f"largest |logit difference| against PyTorch on new random inputs: {difference:.2e}")
    return 0


def cmd_visualize(args: argparse.Namespace) -> int:
    from .viz.run import visualize_run

    queries = [_query(q) for q in args.query] if args.query else None
    paths = visualize_run(args.run_dir, args.inputs, args.out, max_inputs=args.max_inputs, checkpoint=args.checkpoint,
                          device=args.device, queries=queries)
    for path in paths:
        print(path)
    return 0


def cmd_explore(args: argparse.Namespace) -> int:
    from .viz.explorer import check_output, default_output, explore

    out = Path(args.out).expanduser() if args.out else default_output(args.target)
    if not Path(args.target).expanduser().exists():
        raise UsageError(f"TARGET {args.target} does not exist; give a run directory (attnlab train's) or a Hugging "
                         f"Face folder (config.json and its weights)")
    check_output(out, args.force)  # before any work: a page is never written over unasked
    inputs = _text_arguments(args.inputs, "INPUT") if args.inputs else None
    page = explore(args.target, inputs, max_inputs=args.max_inputs, new_tokens=args.new_tokens,
                   checkpoint=args.checkpoint, device=args.device, title=args.title)
    path = page.save(out, force=True)
    docs = page.data["documents"]
    layers = sum(len(g["layers"]) for g in docs[0]["groups"]) if docs else 0
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB: {len(docs)} input{'s' if len(docs) != 1 else ''}, "
          f"{layers} attention layer{'s' if layers != 1 else ''} each); open it in a browser")
    return 0


def _text_argument(text: str, name: str, limit: int = MAX_LINE_CHARS) -> str:
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


def _text_arguments(texts: Sequence[str], name: str, limit: int = MAX_LINE_CHARS) -> list[str]:
    """Texts given on the command line, each checked as :func:`_text_argument` checks one;
    ``-`` among them stands for the lines of standard input (blank ones left out; all of them
    within ``limit`` characters)."""
    out: list[str] = []
    for i, text in enumerate(texts, 1):
        where = f"{name} {i}" if len(texts) > 1 else name
        if text != "-":
            out.append(_text_argument(text, where, limit))
            continue
        out += [line for line in _text_argument("-", name, limit).splitlines() if line.strip()]
    return out


def _query(text: str) -> tuple[int, int]:
    """``--query ROW,COL`` -> ``(row, col)``."""
    parts = text.split(",")
    try:
        row, col = (int(p) for p in parts)
    except ValueError:
        raise UsageError(f"--query takes ROW,COL (two integers, a pixel of the input image); got {text!r}") from None
    return row, col


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


def cmd_report(args: argparse.Namespace) -> int:
    from .bench.report import is_bench_dir, write_bench_report
    from .bench.vision import is_vision_dir, write_vision_report
    from .report import write_run_report

    folder = Path(args.run_dir)
    if not (folder / "config.yaml").is_file() and not is_bench_dir(folder) and not is_vision_dir(folder):
        raise UsageError(f"RUN_DIR must be a run directory written by 'attnlab train' (with config.yaml) or an "
                         f"'attnlab bench attention' or 'attnlab bench vision' output folder; {args.run_dir} is "
                         f"none of them")
    write = (write_vision_report if is_vision_dir(folder) else write_bench_report if is_bench_dir(folder)
             else write_run_report)
    print(f"wrote {write(folder, args.out)}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``attnlab translate: error: argument --beam-size: ...``."""
    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def cmd_bench_attention(args: argparse.Namespace) -> int:
    from .bench.attention import DEFAULT_LENGTHS, PARTS, run_bench
    from .bench.report import markdown
    from .bench.scaling import VARIANTS

    parts = _choices("--parts", args.parts, PARTS) if args.parts else list(PARTS)
    variants = _choices("--variants", args.variants, VARIANTS) if args.variants else None
    lengths = _lengths(args.lengths) if args.lengths else list(DEFAULT_LENGTHS)
    data = run_bench(args.out, parts=parts, variants=variants, lengths=lengths, device=args.device,
                     quick=args.quick, fresh=args.fresh, json_path=args.json, log=lambda s: print(s, flush=True))

    print(markdown(data))
    print(f"wrote {args.out}/results.json, table.md, time.png, memory.png, report.html"
          + (f" and {args.json}" if args.json else ""))
    return 0


def cmd_bench_vision(args: argparse.Namespace) -> int:
    from .bench.vision import run_vision, vision_markdown

    parts = _choices("--parts", args.parts, VISION_PARTS) if args.parts else list(VISION_PARTS)
    seeds = _seeds(args.seeds) if args.seeds else None
    data = run_vision(args.out, parts=parts, seeds=seeds, variants=args.variant, quick=args.quick, fresh=args.fresh,
                      device=args.device, data_dir=args.data_dir, log=lambda s: print(s, flush=True))
    print(vision_markdown(data))
    print(f"wrote {args.out}/results.json, table.md, accuracy.png, time.png, report.html")
    return 0


def cmd_bench_lm(args: argparse.Namespace) -> int:
    from .bench.lm import run_lm, lm_markdown

    parts = _choices("--parts", args.parts, LM_PARTS) if args.parts else list(LM_PARTS)
    data = run_lm(args.out, parts=parts, quick=args.quick, fresh=args.fresh, data_dir=args.data_dir,
                  log=lambda s: print(s, flush=True))
    print(lm_markdown(data))
    print(f"wrote {args.out}/results.json and table.md")
    return 0


def _seeds(text: str) -> dict[str, int]:
    """``norm=3,positions=2`` -> seeds per part."""
    seeds = {}
    for item in text.split(","):
        part, _, count = item.partition("=")
        if part.strip() not in VISION_PARTS or not count.strip().isdigit() or int(count) < 1:
            raise UsageError(f"--seeds takes PART=N,... with PART among {', '.join(VISION_PARTS)} and N >= 1; "
                             f"got {text!r}")
        seeds[part.strip()] = int(count)
    return seeds


def _lengths(text: str) -> list[int]:
    try:
        values = [int(t) for t in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 2:
        raise UsageError(f"--lengths takes comma-separated integers of at least 2; got {text!r}")
    return values


def _choices(option: str, text: str, allowed) -> list[str]:
    values = [t.strip() for t in text.split(",") if t.strip()]
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise UsageError(f"{option} takes a comma-separated list of {', '.join(allowed)}; got {text!r}")
    return values


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

    p = sub.add_parser("models", help="list registered models with their parameter counts")
    p.add_argument("pattern", nargs="?", default="*", help="shell-style name filter, e.g. 'transformer_*'")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("kinds", parents=[plugins],
                       help="list the attention kinds and what each can do; 'attnlab kinds KIND': its options")
    p.add_argument("kind", nargs="?", default=None, help="a kind's name (e.g. exact, local, gated_delta)")
    p.set_defaults(func=cmd_kinds)

    p = sub.add_parser("sources", parents=[plugins], help="list the data sources a recipe's data.name can name")
    p.set_defaults(func=cmd_sources)

    p = sub.add_parser("demo", help="train a tiny Transformer to reverse strings, then decode (about a minute)")
    p.add_argument("--steps", type=_positive_int, default=600, help="training steps (default 600)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("recipes", parents=[plugins],
                       help="list the shipped recipes; with NAME its resolved settings, with --keys every key")
    p.add_argument("name", nargs="?", default=None, metavar="NAME", help="a shipped recipe or a YAML file")
    p.add_argument("overrides", nargs="*", help="dotted overrides to apply before printing")
    p.add_argument("--keys", action="store_true", help="every key of the recipe: type, default, value and help")
    p.set_defaults(func=cmd_recipes)

    p = sub.add_parser("train", parents=[plugins], help="train a recipe: attnlab train RECIPE [key.sub=value ...]")
    p.add_argument("recipe", nargs="?", default=None,
                   help="a shipped recipe name (see 'attnlab recipes') or a YAML file; with --resume it may be "
                        "left out: the run's own recipe")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=3e-4 model.options.depth=2")
    p.add_argument("--run-dir", default=None, help="default: runs/<recipe>-<time>")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its last checkpoint")
    p.add_argument("--allow-changes", action="store_true",
                   help="with --resume: continue with settings that differ from the run's (more steps, another "
                        "learning rate); the change is recorded in config.changes.yaml")
    p.set_defaults(func=cmd_train)

    checkpoint_help = ("best, last, averaged or a checkpoint folder (default: the weights results.json was tested "
                       "with)")
    p = sub.add_parser("eval", parents=[plugins], help="re-evaluate a run's checkpoint on its test set")
    p.add_argument("run_dir", help="a run directory written by 'attnlab train'")
    p.add_argument("--checkpoint", default="auto", help=checkpoint_help)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps (default auto)")
    p.add_argument("--data", default=None, metavar="PATH",
                   help="evaluate on data of one's own instead of the run's test set: a labelled folder "
                        "(PATH/<class>/<image>) or file for a classifier, sentence pairs for a translator, text (a "
                        ".txt file, a folder of them, a JSONL/CSV/TSV text column) for a language model")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("predict", parents=[plugins],
                       help="predict with a trained run: labels of images or texts, or generated texts")
    p.add_argument("run_dir", help="a run directory written by 'attnlab train'")
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="image files for an image run; texts for a text run (default, or -: lines of standard input)")
    p.add_argument("--checkpoint", default="auto", help=checkpoint_help)
    p.add_argument("--top-k", type=_positive_int, default=1, help="labels (with probabilities) per input (default 1)")
    p.add_argument("--json", action="store_true",
                   help="JSON Lines: one object per input (input, label, prob, top_k; or error)")
    p.add_argument("--batch-size", type=_positive_int, default=64, help="inputs per batch (default 64)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto (default cpu)")
    p.add_argument("--max-line-chars", type=_positive_int, default=MAX_LINE_CHARS, metavar="N",
                   help=f"a longer text is reported and skipped, unread (default {MAX_LINE_CHARS:,})")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("generate", parents=[plugins],
                       help="continue a prompt with a language-model run, printing the text as it comes")
    p.add_argument("run_dir", help="a run directory of the language_modeling task, or a Hugging Face decoder "
                                   f"folder ({decoder_names()}: config.json, its weights, tokenizer.json)")
    p.add_argument("prompt", help="the text to continue (with --chat: the user's message); -: all of standard input")
    p.add_argument("--checkpoint", default="auto", help=checkpoint_help)
    # The ranges are check_generation's (one place for the command line, recipes and Python), said by flag.
    # Their defaults: the run's recipe (its generate section), or a folder's generation_config.json.
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens to add (default: the recipe's)")
    p.add_argument("--temperature", type=float, default=None,
                   help="0: greedy; default: the recipe's (a folder's: 0 unless its do_sample is true)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the K most probable tokens (0: all)")
    p.add_argument("--top-p", type=float, default=None, help="sample within the smallest set of probability P")
    p.add_argument("--min-p", type=float, default=None,
                   help="sample among the tokens at least P times as probable as the likeliest")
    p.add_argument("--repetition-penalty", type=float, default=None,
                   help="above 1: tokens the text already holds are less likely (default: the recipe's, 1: none)")
    p.add_argument("--seed", type=int, default=None, help="of the sampling (default: the recipe's)")
    p.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="a text that ends the continuation, left out of it (repeatable; default: the recipe's)")
    p.add_argument("--chat", action="store_true",
                   help="render PROMPT as a user's message with the chat template of the folder (or of the run's "
                        "tokenizer_config.json) and print the reply")
    p.add_argument("--system", default=None, metavar="TEXT", help="with --chat: a system message before PROMPT")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto (default cpu)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("export", parents=[plugins],
                       help="write a run's classifier as an ONNX (or TorchScript) file, with its preprocessing")
    p.add_argument("run_dir", help="a run directory of an image or text classifier")
    p.add_argument("--format", default="onnx", help="onnx (default) or torchscript")
    p.add_argument("--out", default=None, metavar="PATH",
                   help="a .onnx/.pt file, or a folder for model.onnx/model.pt (default RUN_DIR/export)")
    p.add_argument("--checkpoint", default="auto", help=checkpoint_help)
    p.add_argument("--opset", type=_positive_int, default=None, help="ONNX opset (default: the exporter's)")
    p.add_argument("--force", action="store_true", help="replace the files of an earlier export at --out")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("visualize", parents=[plugins], help="draw what a trained run's attention looks at (PNGs)")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by 'attnlab train'")
    p.add_argument("--input", dest="inputs", action="extend", nargs="+", default=None, metavar="X",
                   help="texts (text runs) or image files (image runs), after RUN_DIR; "
                        "default: the first test examples")
    p.add_argument("--max-inputs", type=_positive_int, default=2, help="test examples without --input (default 2)")
    p.add_argument("--out", default=None, metavar="DIR", help="output folder (default RUN_DIR/visualize)")
    p.add_argument("--checkpoint", default="auto", help="auto, best, last, averaged or a checkpoint folder")
    p.add_argument("--device", default="cpu", help="cpu, cuda, mps or auto (default cpu)")
    p.add_argument("--query", action="append", default=None, metavar="ROW,COL",
                   help="BoTNet: a query pixel of the input image (repeatable; default: centre and diagonal)")
    p.set_defaults(func=cmd_visualize)

    p = sub.add_parser("explore", parents=[plugins],
                       help="write an interactive page of every head of every layer (one HTML file, offline)")
    p.add_argument("target", metavar="TARGET", help="a run directory written by 'attnlab train', or a Hugging Face "
                                                    f"folder (a decoder: {decoder_names()}; an encoder: {encoder_names()}; ViT)")
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="texts (text and language-model runs, text folders), a source sentence (translation) or "
                        "image files (image models); -: lines of standard input; default: the run's first test examples or its "
                        "prompts")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="the page (default RUN_DIR/explore.html; beside a folder: FOLDER.explore.html)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--max-inputs", type=_positive_int, default=2, help="test examples without INPUT (default 2)")
    p.add_argument("--new-tokens", type=_nonnegative_int, default=20,
                   help="tokens a language model adds to each prompt, greedily (default 20)")
    p.add_argument("--checkpoint", default="auto", help="auto, best, last, averaged or a checkpoint folder")
    p.add_argument("--device", default="cpu", help="cpu, cuda, mps or auto (default cpu)")
    p.add_argument("--title", default=None, help="the page's title (default: the target's name)")
    p.set_defaults(func=cmd_explore)

    p = sub.add_parser("translate", parents=[plugins],
                       help="generate texts with a trained run that does (translation), with decoding options")
    p.add_argument("run_dir", help="a translation run directory written by 'attnlab train'")
    p.add_argument("inputs", nargs="*", metavar="TEXT", help="texts to translate (default, or -: lines of standard input)")
    p.add_argument("--beam-size", type=_positive_int, default=None, help="beams (default: the run's recipe, 4)")
    p.add_argument("--max-length", type=_positive_int, default=None,
                   help="most tokens per translation (default: source length + 50)")
    p.add_argument("--batch-size", type=_positive_int, default=64, help="sentences per batch (default 64)")
    p.add_argument("--checkpoint", default="auto",
                   help="averaged, best, last or a checkpoint folder (default: the first of those the run has)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps (default auto)")
    p.add_argument("--json", action="store_true", help="JSON Lines: one object per input (input, output; or error)")
    p.add_argument("--max-line-chars", type=_positive_int, default=MAX_LINE_CHARS, metavar="N",
                   help=f"a longer text is reported and skipped, unread (default {MAX_LINE_CHARS:,})")
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser("report", parents=[plugins],
                       help="write a self-contained report.html for a run (or a benchmark folder)")
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help="a run directory written by 'attnlab train', or an 'attnlab bench attention' --out folder")
    p.add_argument("--out", default=None, metavar="FILE", help="where to write the page (default RUN_DIR/report.html)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("data", help="list the public data sets and download them")
    data_sub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    q = data_sub.add_parser("list", help="data sets, and whether each is in the data directory")
    q.add_argument("--data-dir", default=None, help="default: $ATTNLAB_DATA_DIR, else ~/.cache/attnlab")
    q.set_defaults(func=cmd_data_list)
    q = data_sub.add_parser("download", help="fetch a data set (resumable, checksummed)")
    q.add_argument("name", help="cifar10, mr or multi30k (see 'attnlab data list')")
    q.add_argument("--data-dir", default=None, help="default: $ATTNLAB_DATA_DIR, else ~/.cache/attnlab")
    q.add_argument("--base-url", default=None, help=argparse.SUPPRESS)  # a mirror, or a test server
    q.set_defaults(func=cmd_data_download)

    p = sub.add_parser("bench", help="measure: 'attnlab bench attention' compares the attention kinds, "
                                     "'attnlab bench vision' the vision claims, 'attnlab bench lm' language models")
    bench_sub = p.add_subparsers(dest="bench_command", metavar="WHAT", required=True)
    q = bench_sub.add_parser("attention", help="time, memory, quality of each attention kind, and the studies "
                                              "(resumable; about 1.5 hours on 2 CPU cores)")
    q.add_argument("--out", default="runs/bench-attention", help="output folder (default runs/bench-attention)")
    q.add_argument("--json", default=None, metavar="FILE", help="also write the scaling records, as a list, here")
    q.add_argument("--parts", default=None, help="comma-separated: scaling, quality, fidelity, studies, allocator "
                                                 "(default: all)")
    q.add_argument("--variants", default=None, help="comma-separated variants (default: all)")
    q.add_argument("--lengths", default=None, help="comma-separated lengths (default 256,...,16384)")
    q.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    q.add_argument("--quick", action="store_true", help="tiny sizes and budgets: checks that it runs, nothing more")
    q.add_argument("--fresh", action="store_true", help="start over instead of keeping the finished items in --out")
    q.set_defaults(func=cmd_bench_attention)
    q = bench_sub.add_parser("vision", help="the tutorials' vision claims on CIFAR-10 (and norms on MR): every "
                                           "variant trained alike (resumable; hours on 2 CPU cores)")
    q.add_argument("--out", default="runs/bench-vision", help="output folder (default runs/bench-vision)")
    q.add_argument("--parts", default=None, help=f"comma-separated: {', '.join(VISION_PARTS)} (default: all)")
    q.add_argument("--seeds", default=None, metavar="PART=N,...",
                   help="seeds per part (default norm=3,text_norm=3,positions=2, the others 1)")
    q.add_argument("--variant", action="append", default=None, metavar="PART/NAME",
                   help="only this row, for example 'heads/8 heads of 16' (repeatable; default: every row of --parts)")
    q.add_argument("--data-dir", default=None, help="default: $ATTNLAB_DATA_DIR, else ~/.cache/attnlab")
    q.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    q.add_argument("--quick", action="store_true", help="two steps on a few images for the first two rows of each part, each tested on the whole "
                        "test set: checks that everything runs (about 25 minutes on 2 CPU cores)")
    q.add_argument("--fresh", action="store_true", help="start over instead of keeping the finished runs in --out")
    q.set_defaults(func=cmd_bench_vision)
    q = bench_sub.add_parser("lm", help="language models: generation with and without the cache, cache memory of "
                                       "grouped-query and sliding-window attention, length extrapolation of the "
                                       "position kinds (about 25 minutes on 2 CPU cores), and the attention kinds "
                                       "side by side, each trained for the shipped lm-shakespeare-char's time "
                                       "(kinds: about 10 x that time); resumable")
    q.add_argument("--out", default="runs/bench-lm", help="output folder (default runs/bench-lm)")
    q.add_argument("--parts", default=None, help=f"comma-separated: {', '.join(LM_PARTS)} (default: all)")
    q.add_argument("--data-dir", default=None, help="default: $ATTNLAB_DATA_DIR, else ~/.cache/attnlab")
    q.add_argument("--quick", action="store_true", help="tiny sizes and budgets: checks that it runs, nothing more")
    q.add_argument("--fresh", action="store_true", help="start over instead of keeping the finished items in --out")
    q.set_defaults(func=cmd_bench_lm)
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


def _unknown_options(parser: argparse.ArgumentParser, extra: Sequence[str], typed: dict[str, str]) -> None:
    """Exit 2 naming the first option of ``extra`` that ``parser`` does not know (as the user
    typed it: ``typed`` maps the dashed spelling back), with the options it knows that are close
    to it (argparse of Python 3.11 names it alone)."""
    known = [o for o in parser._option_string_actions if o.startswith("--")]  # noqa: SLF001  # argparse's own table
    for token in extra:
        name = token.partition("=")[0]
        if name.startswith("--") and not any(o.startswith(name) for o in known):
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
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
        except NonFiniteLossError as exc:
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
    line, without the Python source line that the default format adds."""
    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
        text = " ".join(str(message).split())
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


if __name__ == "__main__":
    console()
