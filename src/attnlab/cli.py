"""The ``attnlab`` command."""

from __future__ import annotations

import argparse
import sys
import traceback
import warnings
from pathlib import Path
from typing import Sequence

from . import __version__
from .engine.trainer import NonFiniteLossError
from .errors import InputError
from .io import WriteError


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


def cmd_demo(args: argparse.Namespace) -> int:
    import torch

    from .tasks import reverse

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {args.device}: CUDA is not available on this machine")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"attnlab {__version__}: training transformer_tiny to reverse token strings "
          f"({args.steps} steps, device {args.device})")
    res = reverse.run(steps=args.steps, seed=args.seed, device=args.device)
    print()
    print("| metric | value |")
    print("| --- | --- |")
    print(f"| training steps | {res.steps} |")
    print(f"| training time | {res.train_seconds:.1f} s |")
    print(f"| final loss | {res.final_loss:.4f} |")
    print(f"| exact match, greedy | {100 * res.greedy_accuracy:.1f}% |")
    print(f"| exact match, beam 4 | {100 * res.beam_accuracy:.1f}% |")
    print()
    for src, out in res.examples:
        print(f"  {src} -> {out}")
    return 0


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
    from .data.download import download

    download(args.name, args.data_dir, base_url=args.base_url)
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    from .recipes import list_recipes

    rows = list_recipes()
    width = max(len(name) for name, _ in rows)
    for name, description in rows:
        print(f"{name.ljust(width)}  {description}")
    return 0


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
    import time

    from .engine import distributed

    recipe, name = _train_recipe(args)  # validated before any work starts
    distributed.init_distributed(recipe.train.device)  # under torchrun: join the group; else nothing
    # Under torchrun all ranks take rank 0's name (their clocks may straddle a second).
    run_dir = args.run_dir or distributed.broadcast_object(f"runs/{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if distributed.is_main():
        verb = "resuming" if args.resume else "train"
        print(f"attnlab {verb} {name}: {recipe.model.name} on {recipe.data.name}, run directory {run_dir}")
    from .tasks import image_classification, sentiment, translation

    task = {"image_classification": image_classification, "sentiment": sentiment, "translation": translation}
    results = task[recipe.task].run(recipe, run_dir, resume=args.resume, allow_changes=args.allow_changes)
    if not distributed.is_main():  # rank 0 alone prints the results
        return 0
    print()
    print("| result | value |")
    print("| --- | --- |")
    if recipe.task == "translation":
        print(f"| test BLEU (sacreBLEU, cased) | {results['bleu']:.2f} |")
        print(f"| test BLEU (lower-cased) | {results['bleu_lowercase']:.2f} |")
        print(f"| test token accuracy | {100 * results['test_accuracy']:.2f}% |")
    else:
        spread = f" ± {100 * results['test_accuracy_std']:.2f} (10 folds)" if "test_accuracy_std" in results else ""
        print(f"| test accuracy | {100 * results['test_accuracy']:.2f}%{spread} |")
    print(f"| parameters | {results['params']:,} |")
    print(f"| training time | {results['train_seconds']:.1f} s |")
    unit = {"image_classification": "images", "sentiment": "sentences", "translation": "sentence pairs"}[recipe.task]
    print(f"| throughput | {results['samples_per_s']:,.0f} {unit}/s |")
    print(f"\nrun directory: {run_dir}")
    return 0


def _train_recipe(args: argparse.Namespace):
    """``(recipe, name)``: the named recipe with its overrides; or, for ``--resume``
    without a recipe, the run's own (its config.yaml and recorded changes) with the
    overrides applied on top."""
    from .engine.config import apply_overrides, from_dict
    from .recipes import Recipe, load_recipe
    from .tasks.common import read_config, read_recipe

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
        read_recipe(args.run_dir)  # a damaged config.yaml is named before the overrides are applied
        recipe = from_dict(Recipe, apply_overrides(read_config(Path(args.run_dir)), args.overrides))
        return recipe, Path(args.run_dir).name
    recipe = load_recipe(args.recipe, args.overrides)
    name = args.recipe if not args.recipe.endswith((".yaml", ".yml")) else args.recipe.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return recipe, name


def cmd_eval(args: argparse.Namespace) -> int:
    from .tasks import image_classification, sentiment, translation
    from .tasks.common import read_recipe

    kind = read_recipe(args.run_dir).task
    task = {"sentiment": sentiment, "translation": translation}.get(kind, image_classification)
    res = task.evaluate_run(args.run_dir, args.checkpoint, device=args.device)
    print(f"checkpoint: {res['checkpoint']}")
    print("| metric | value |")
    print("| --- | --- |")
    if kind == "translation":
        print(f"| test BLEU (sacreBLEU, cased) | {res['bleu']:.2f} |")
        print(f"| test BLEU (lower-cased) | {res['bleu_lowercase']:.2f} |")
        print(f"| test sentences | {res['samples']:,} |")
        print(f"sacreBLEU signature: {res['bleu_signature']}")
        return 0
    print(f"| test accuracy | {100 * res['accuracy']:.2f}% |")
    print(f"| test loss | {res['loss']:.4f} |")
    print(f"| test samples | {res['samples']:,} |")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from .tasks import image_classification, sentiment
    from .tasks.common import read_recipe

    kind = read_recipe(args.run_dir).task
    if kind == "translation":
        raise UsageError(f"{args.run_dir} is a translation run: 'attnlab translate {args.run_dir} TEXT ...' "
                         f"translates with it; predict classifies images and texts")
    if kind == "sentiment":
        return _predict_texts(args, sentiment)
    if not args.inputs:
        raise UsageError("give one or more image FILEs to classify")
    rows = image_classification.predict_files(args.run_dir, args.inputs, args.checkpoint, top_k=args.top_k)
    width = max(len(f) for f, _ in rows)
    for file, preds in rows:
        print(f"{file.ljust(width)}  " + "  ".join(f"{label} {p:.3f}" for label, p in preds))
    return 0


def _predict_texts(args: argparse.Namespace, sentiment) -> int:
    """Texts from the command line, else one per line from standard input, in batches.
    A text that is not valid UTF-8 is reported on standard error and left out; the
    others are classified, and the exit status is then 2."""
    texts = _checked_arguments(args.inputs) if args.inputs else list(_stdin_lines())
    if not texts:
        raise UsageError("give texts to classify, or lines on standard input")
    good = [t for t in texts if t is not None]
    for text, (label, p) in zip(good, sentiment.predict_texts(args.run_dir, good, args.checkpoint) if good else []):
        print(f"{label}\t{p:.3f}\t{text}")
    return 2 if len(good) < len(texts) else 0


def _report_bad_text(where: str, position: int) -> None:
    print(f"attnlab: error: {where} is not valid UTF-8 (at position {position}); it was skipped", file=sys.stderr)


def _checked_arguments(texts: Sequence[str]) -> list[str | None]:
    """Command-line texts, ``None`` for one that is not valid UTF-8 (Python keeps such
    bytes as lone surrogates, which no tokenizer can encode)."""
    out: list[str | None] = []
    for i, text in enumerate(texts, 1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            _report_bad_text(f"argument {i}", exc.start)
            out.append(None)
            continue
        out.append(text)
    return out


def _stdin_lines():
    """Lines of standard input without their newline, decoded as UTF-8 one by one:
    ``None`` (reported on standard error) for a line that is not valid UTF-8."""
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # a text stream put in place of stdin (tests, embedding programs)
        yield from (line.rstrip("\n").rstrip("\r") for line in sys.stdin)
        return
    for number, raw in enumerate(stream, 1):
        try:
            yield raw.decode("utf-8").rstrip("\n").rstrip("\r")
        except UnicodeDecodeError as exc:
            _report_bad_text(f"line {number} of standard input", exc.start)
            yield None


def cmd_visualize(args: argparse.Namespace) -> int:
    from .viz.run import visualize_run

    queries = [_query(q) for q in args.query] if args.query else None
    paths = visualize_run(args.run_dir, args.inputs, args.out, max_inputs=args.max_inputs, checkpoint=args.checkpoint,
                          device=args.device, queries=queries)
    for path in paths:
        print(path)
    return 0


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


def cmd_translate(args: argparse.Namespace) -> int:
    """Texts from the command line, else standard input line by line: each translated
    batch is printed as soon as it is done, so a long file streams through. A line that
    is not valid UTF-8 is reported on standard error and gives an empty line, so output
    lines stay aligned with input lines; the exit status is then 2."""
    from .tasks import translation

    recipe, src_tok, tgt_tok, model, _ = translation.load_run(args.run_dir, args.checkpoint)
    texts = _checked_arguments(args.texts) if args.texts else _stdin_lines()
    seen = bad = 0
    for chunk in _chunks(texts, 16 * args.batch_size):
        seen += len(chunk)
        bad += sum(t is None for t in chunk)
        out = translation.translate_as_recipe(recipe, model, src_tok, tgt_tok, [t or "" for t in chunk],
                                              num_beams=args.beam_size, max_length=args.max_length,
                                              batch_size=args.batch_size, device=args.device)
        print("\n".join(out), flush=True)
    if not seen:
        raise UsageError("give texts to translate, or lines on standard input")
    return 2 if bad else 0


def cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .report import is_bench_dir, write_bench_report, write_run_report

    folder = Path(args.run_dir)
    if not (folder / "config.yaml").is_file() and not is_bench_dir(folder):
        raise UsageError(f"RUN_DIR must be a run directory written by 'attnlab train' (with config.yaml) or an "
                         f"'attnlab bench attention' output folder; {args.run_dir} is neither")
    write = write_bench_report if is_bench_dir(folder) else write_run_report
    print(f"wrote {write(folder, args.out)}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``attnlab translate: error: argument --beam-size: ...``."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def cmd_bench_attention(args: argparse.Namespace) -> int:
    from .bench.attention import DEFAULT_LENGTHS, PARTS, run_bench
    from .bench.scaling import VARIANTS

    parts = _choices("--parts", args.parts, PARTS) if args.parts else list(PARTS)
    variants = _choices("--variants", args.variants, VARIANTS) if args.variants else None
    lengths = _lengths(args.lengths) if args.lengths else list(DEFAULT_LENGTHS)
    data = run_bench(args.out, parts=parts, variants=variants, lengths=lengths, device=args.device,
                     quick=args.quick, fresh=args.fresh, json_path=args.json, log=lambda s: print(s, flush=True))
    from .bench.report import markdown

    print(markdown(data))
    print(f"wrote {args.out}/results.json, table.md, time.png, memory.png, report.html"
          + (f" and {args.json}" if args.json else ""))
    return 0


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

    p = sub.add_parser("models", help="list registered models with their parameter counts")
    p.add_argument("pattern", nargs="?", default="*", help="shell-style name filter, e.g. 'transformer_*'")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("demo", help="train a tiny Transformer to reverse strings, then decode (about a minute)")
    p.add_argument("--steps", type=_positive_int, default=600, help="training steps (default 600)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("recipes", help="list the shipped training recipes")
    p.set_defaults(func=cmd_recipes)

    p = sub.add_parser("train", help="train a recipe: attnlab train RECIPE [key.sub=value ...]")
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

    checkpoint_help = "best, last or a checkpoint folder (default: best when the run has one, else last)"
    p = sub.add_parser("eval", help="re-evaluate a run's checkpoint on its test set")
    p.add_argument("run_dir", help="a run directory written by 'attnlab train'")
    p.add_argument("--checkpoint", default="auto", help=checkpoint_help)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps (default auto)")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("predict", help="classify images or texts with a trained run: label and probability")
    p.add_argument("run_dir", help="a run directory written by 'attnlab train'")
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="image files for an image run; texts for a sentiment run (default: lines of standard input)")
    p.add_argument("--checkpoint", default="auto", help=checkpoint_help)
    p.add_argument("--top-k", type=_positive_int, default=1, help="labels to show per file (default 1)")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("visualize", help="draw what a trained run's attention looks at (PNGs)")
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

    p = sub.add_parser("translate", help="translate texts with a trained translation run")
    p.add_argument("run_dir", help="a translation run directory written by 'attnlab train'")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to translate (default: lines of standard input)")
    p.add_argument("--beam-size", type=_positive_int, default=None, help="beams (default: the run's recipe, 4)")
    p.add_argument("--max-length", type=_positive_int, default=None,
                   help="most tokens per translation (default: source length + 50)")
    p.add_argument("--batch-size", type=_positive_int, default=64, help="sentences per batch (default 64)")
    p.add_argument("--checkpoint", default="auto",
                   help="averaged, best, last or a checkpoint folder (default: the first of those the run has)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps (default auto)")
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser("report", help="write a self-contained report.html for a run (or a benchmark folder)")
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

    p = sub.add_parser("bench", help="measure: 'attnlab bench attention' compares the attention kinds")
    bench_sub = p.add_subparsers(dest="bench_command", metavar="WHAT", required=True)
    q = bench_sub.add_parser("attention", help="time, memory, quality of each attention kind, and the studies "
                                              "(resumable; about 1.5 hours on 2 CPU cores)")
    q.add_argument("--out", default="runs/bench-attention", help="output folder (default runs/bench-attention)")
    q.add_argument("--json", default=None, metavar="FILE", help="also write the scaling records, as a list, here")
    q.add_argument("--parts", default=None, help="comma-separated: scaling, quality, studies (default: all)")
    q.add_argument("--variants", default=None, help="comma-separated variants (default: all)")
    q.add_argument("--lengths", default=None, help="comma-separated lengths (default 256,...,16384)")
    q.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    q.add_argument("--quick", action="store_true", help="tiny sizes and budgets: checks that it runs, nothing more")
    q.add_argument("--fresh", action="store_true", help="start over instead of keeping the finished items in --out")
    q.set_defaults(func=cmd_bench_attention)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse, letting options and free arguments mix after a command:
    ``attnlab train RECIPE --run-dir D train.lr=1e-3`` works as well as with the
    overrides first (plain argparse stops collecting ``nargs="*"`` at the first option)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    command = getattr(args, "command", None)
    sub = getattr(parser, "commands", {}).get(command)
    if sub is None or command not in INTERMIXED:
        parser.parse_args(argv)  # reports the unrecognized arguments and exits 2
    rest = argv[argv.index(command) + 1 :]
    return sub.parse_intermixed_args(rest, namespace=argparse.Namespace(command=command))


INTERMIXED = ("train", "predict", "translate")  # commands with a free list of arguments


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
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warnings(prefix)
        try:
            return args.func(args)
        except (InputError, FileNotFoundError) as exc:  # the user's input: one line
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


if __name__ == "__main__":
    sys.exit(main())
