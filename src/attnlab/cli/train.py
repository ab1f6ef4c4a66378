"""``attnlab train``, ``eval``, ``export`` and ``report``: a run made, measured, exported, reported."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from .common import CHECKPOINT_HELP, UsageError, load_run_or_model, positive_int, table


def cmd_train(args: argparse.Namespace) -> int:
    from ..engine import distributed
    from ..errors import LostProcessError

    if args.allow_changes and not args.resume:
        raise UsageError("--allow-changes applies to --resume: it lets a resumed run continue with changed settings")
    if distributed.launched():  # torchrun's SIGTERM, after another process ended, is said as that
        distributed.stop_on_sigterm()
    try:
        code = _train(args)
    except BaseException as exc:
        lost = distributed.lost_process(exc)
        world = distributed.world_size()
        distributed.cleanup(wait=False)  # a failing rank must not wait for peers that may be gone
        if lost is not None:
            raise LostProcessError(
                f"{lost}, and this process stops too; every checkpoint saved before is intact: resume with "
                f"torchrun --nproc_per_node={world} -m attnlab train --run-dir {args.run_dir} --resume") from None
        raise
    distributed.cleanup()  # under torchrun: all ranks meet, then the process group goes
    return code


def _train(args: argparse.Namespace) -> int:
    from ..engine import distributed
    from ..engine.progress import format_rate
    from ..report import write_run_report_safely
    from ..tasks import get_task, model_label, train

    recipe, name = _train_recipe(args)  # validated before any work starts
    task = get_task(recipe.task)
    distributed.init_distributed(recipe.train.device)  # under torchrun: join the group; else nothing
    # Under torchrun all ranks take rank 0's name (their clocks may straddle a second).
    run_dir = args.run_dir = args.run_dir or distributed.broadcast_object(
        f"runs/{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if distributed.is_main():
        verb = "resuming" if args.resume else "train"
        print(f"attnlab {verb} {name}: {model_label(recipe.model)} on {recipe.data.name} ({task.name}), "
              f"run directory {run_dir}")
    # the report is written while the run directory is still locked: a --resume meanwhile is refused
    results = train(recipe, run_dir, resume=args.resume, allow_changes=args.allow_changes,
                    finish=lambda _: write_run_report_safely(run_dir, print))
    if not distributed.is_main():  # rank 0 alone writes the report and prints the results
        return 0
    print()
    stopped = [("training steps", f"{results['steps']:,} of {recipe.train.steps:,} ({results['stopped']})")] \
        if results.get("stopped") else []
    table([*task.metric_rows(results), ("parameters", f"{results['params']:,}"), *stopped,
            ("training time", f"{results['train_seconds']:.1f} s"),
            ("throughput", f"{format_rate(results['samples_per_s'])} {task.sample_unit}/s")])
    print(f"\nrun directory: {run_dir}")
    return 0


def _train_recipe(args: argparse.Namespace):
    """``(recipe, name)``: the named recipe with its overrides; or, for ``--resume``
    without a recipe, the run's own (its config.yaml and recorded changes) with the
    overrides applied on top."""
    from ..engine.config import apply_overrides
    from ..recipes import load_recipe
    from ..tasks import read_recipe, recipe_dict, recipe_from_dict

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
    on a labelled folder or file of one's own. A pretrained decoder (a Hugging Face folder
    or a GGUF file): its zero-shot loss on Tiny Shakespeare's test part, or on --data."""
    run = load_run_or_model(args.run_dir, args.checkpoint, args.device)  # a decoder: its zero-shot figures
    metrics = run.evaluate(device=args.device, **({"data": args.data} if args.data else {}))
    print(f"checkpoint: {run.checkpoint}")
    if args.data:
        print(f"data: {args.data}")
    table([*run.task.metric_rows(metrics), ("test samples", f"{metrics['test_samples']:,}")], ("metric", "value"))
    if "bleu_signature" in metrics:
        print(f"sacreBLEU signature: {metrics['bleu_signature']}")
    broken = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
    if broken:  # finite weights whose outputs overflow: a diverged run's, never a result to pass on
        print(f"attnlab eval: error: {', '.join(broken)} not finite: {run.checkpoint} makes NaN or infinite outputs "
              f"on these inputs (the weights of a diverging run?); evaluate an earlier checkpoint", file=sys.stderr)
        return 1
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """A run's classifier as one ONNX (or TorchScript) file with its preprocessing beside
    it, checked against PyTorch on inputs of other shapes than it was captured with."""
    from ..tasks import load_run
    from ..export.classifier import FORMATS, export_run, model_file, verify_export
    from ..export.language_model import MODEL_FORMATS

    if args.format not in FORMATS and args.format not in MODEL_FORMATS:
        raise UsageError(f"--format takes {', '.join([*sorted(FORMATS), *MODEL_FORMATS])}; got {args.format!r}")
    if args.format in MODEL_FORMATS or args.gguf_type is not None:
        return _export_model(args)
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


def _export_model(args: argparse.Namespace) -> int:
    """A language model as a Hugging Face folder or a GGUF file."""
    from ..io import check_output
    from ..tasks import load_run
    from ..export.language_model import check_model_format, default_model_out, export_language_model

    check_model_format(args.format, args.gguf_type)
    if args.opset is not None:
        raise UsageError(f"--opset applies to --format onnx; got --format {args.format}")
    out = Path(args.out) if args.out else default_model_out(args.run_dir, args.format, args.gguf_type or "f16")
    if args.format == "gguf" and out.suffix != ".gguf":
        raise UsageError(f"--out must be a .gguf file with --format gguf; got {out}")
    check_output(out, folder=args.format == "hf", overwrite=args.force, name="--out")  # before the run loads
    run = load_run(args.run_dir, args.checkpoint)
    result = export_language_model(run, out, args.format, weight_type=args.gguf_type, overwrite=args.force)
    print(f"{'folder' if result.format == 'hf' else 'file'}: {result.path}")
    if result.lora_merged:
        print(f"LoRA: {result.lora_merged} adapted layers merged into their weights")
    if result.weight_type:
        print(f"weights: {result.weight_type}")
    print(f"largest |logit difference| of the written model read back: {result.difference:.2e}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from ..bench.report import is_bench_dir, write_bench_report
    from ..bench.vision import is_vision_dir, write_vision_report
    from ..report import write_run_report

    folder = Path(args.run_dir)
    if not (folder / "config.yaml").is_file() and not is_bench_dir(folder) and not is_vision_dir(folder):
        raise UsageError(f"RUN_DIR must be a run directory written by 'attnlab train' (with config.yaml) or an "
                         f"'attnlab bench attention' or 'attnlab bench vision' output folder; {args.run_dir} is "
                         f"none of them")
    write = (write_vision_report if is_vision_dir(folder) else write_bench_report if is_bench_dir(folder)
             else write_run_report)
    print(f"wrote {write(folder, args.out)}")
    return 0


def add_train(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab train``."""
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


def add_eval(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab eval``."""
    p = sub.add_parser("eval", parents=[plugins], help="re-evaluate a run's checkpoint on its test set")
    p.add_argument("run_dir", help="a run directory written by 'attnlab train'")
    p.add_argument("--checkpoint", default="auto", help=CHECKPOINT_HELP)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps (default auto)")
    p.add_argument("--data", default=None, metavar="PATH",
                   help="evaluate on data of one's own instead of the run's test set: a labelled folder "
                        "(PATH/<class>/<image>) or file for a classifier, sentence pairs for a translator, text (a "
                        ".txt file, a folder of them, a JSONL/CSV/TSV text column) for a language model")
    p.set_defaults(func=cmd_eval)


def add_export(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab export``."""
    p = sub.add_parser("export", parents=[plugins],
                       help="write a run's classifier as an ONNX (or TorchScript) file, or its language model as a "
                            "Hugging Face folder or a GGUF file")
    p.add_argument("run_dir", help="a run directory of an image or text classifier, or of a language model "
                                   "fine-tuned from a pretrained one")
    p.add_argument("--format", default="onnx",
                   help="onnx (default) or torchscript for a classifier; hf (a Hugging Face folder) or gguf "
                        "(llama.cpp's file) for a language model")
    p.add_argument("--gguf-type", default=None, metavar="TYPE",
                   help="the GGUF file's weights: f32, f16 (default) or q8_0")
    p.add_argument("--out", default=None, metavar="PATH",
                   help="a .onnx/.pt/.gguf file, or a folder (default RUN_DIR/export, RUN_DIR/export/hf, "
                        "RUN_DIR/export/model-TYPE.gguf)")
    p.add_argument("--checkpoint", default="auto", help=CHECKPOINT_HELP)
    p.add_argument("--opset", type=positive_int, default=None, help="ONNX opset (default: the exporter's)")
    p.add_argument("--force", action="store_true",
                   help="replace an earlier export at --out (a folder only when an export wrote it: never one of your own)")
    p.set_defaults(func=cmd_export)


def add_report(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab report``."""
    p = sub.add_parser("report", parents=[plugins],
                       help="write a self-contained report.html for a run (or a benchmark folder)")
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help="a run directory written by 'attnlab train', or an 'attnlab bench attention' --out folder")
    p.add_argument("--out", default=None, metavar="FILE", help="where to write the page (default RUN_DIR/report.html)")
    p.set_defaults(func=cmd_report)
