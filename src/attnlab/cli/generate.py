"""``attnlab generate``: a prompt continued (or a chat message answered) as the text comes."""

from __future__ import annotations

import argparse
import sys

from ..families import decoder_names
from .common import CHECKPOINT_HELP, UsageError, load_run_or_model, text_argument


def cmd_generate(args: argparse.Namespace) -> int:
    """The continuation of a prompt by a language-model run, or by a Hugging Face decoder
    folder (its tokenizer, special tokens and generation_config.json's defaults), printed as
    it is generated; with --chat, the reply to a message rendered by the chat template."""
    from ..generation.sampling import GENERATION_OPTIONS, check_generation

    given = {k: getattr(args, k) for k in GENERATION_OPTIONS if getattr(args, k) is not None}
    options = check_generation(names=lambda key: "--" + key.replace("_", "-"), **given)  # before the run loads
    if args.system is not None and not args.chat:
        raise UsageError("--system is the system message of a chat: give it with --chat")
    run = load_run_or_model(args.run_dir, args.checkpoint, args.device, args.int8)
    if run.task.outputs != "text":
        raise UsageError(f"{args.run_dir} is a run of the {run.task.name} task: its predictions are labels; "
                         f"'attnlab predict {args.run_dir} ...' gives them")
    chat = {"chat": True, "system": args.system} if args.chat else {}
    prompt = text_argument(args.prompt, "PROMPT")
    pieces = run.task.stream(run, prompt, **options, **chat)
    first = next(pieces, "")  # the generation's own checks (its cache's memory) come before anything is printed
    sys.stdout.write(("" if args.chat else prompt) + first)
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def add_generate(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab generate``."""
    p = sub.add_parser("generate", parents=[plugins],
                       help="continue a prompt with a language-model run, printing the text as it comes")
    p.add_argument("run_dir", help="a run directory of the language_modeling task, or a Hugging Face decoder "
                                   f"folder ({decoder_names()}: config.json, its weights, tokenizer.json), or a GGUF "
                                   f"file (llama.cpp's)")
    p.add_argument("prompt", help="the text to continue (with --chat: the user's message); -: all of standard input")
    p.add_argument("--checkpoint", default="auto", help=CHECKPOINT_HELP)
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
    p.add_argument("--int8", action="store_true",
                   help="keep the linear layers' weights in 8 bits (faster decoding on the CPU, slightly other text)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto (default cpu)")
    p.set_defaults(func=cmd_generate)
