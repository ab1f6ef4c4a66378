"""``attnlab chat MODEL``: a conversation in the terminal with a GGUF file, a Hugging Face
decoder folder or a language-model run whose tokenizer has a chat template.

Each message is rendered with the whole conversation by the model's chat template and the
reply is printed as it comes. Ctrl-C ends a reply and not the session: the interrupted exchange
(the message and what was printed of the reply) is left out of the conversation, so the model
never reads a reply cut short. Keys typed while a reply is printed are not echoed into it; they
wait for the next prompt. Ctrl-D or ``/exit`` ends the session; ``/reset`` forgets the
conversation; ``/system TEXT`` sets the system message (``/system`` alone removes it). A
message the session cannot send (text that is not UTF-8, one the chat template refuses, one
longer than the model's context) is refused in one line, and the session goes on.
Before a reply, the rendered conversation and the reply's tokens are checked against the
model's context: the oldest exchanges are dropped to make room, saying how many and how many
tokens, and a message that does not fit on its own is refused with the room it has.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from typing import Any, Callable, Iterator, Sequence

from ..errors import InputError
from ..families import decoder_names
from .common import CHECKPOINT_HELP, UsageError, load_run_or_model

HELP = "/reset: forget the conversation; /system TEXT: set the system message; /exit (or Ctrl-D): leave"


class ChatSession:
    """A conversation with a loaded language-model run: :meth:`reply` streams the assistant's
    answer to a message and keeps both in :attr:`history` (user and assistant turns; the system
    message apart, in :attr:`system`). ``say`` receives the session's notes (what was dropped)."""

    def __init__(self, run: Any, options: dict[str, Any], system: str | None = None,
                 say: Callable[[str], None] = print) -> None:
        self.run, self.options, self.system, self.say = run, dict(options), system, say
        self.history: list[dict[str, str]] = []
        cfg = getattr(run.model, "config", None)
        self.context = int(getattr(cfg, "max_len", 0) or 0)

    def reset(self) -> None:
        self.history = []

    def _tokens(self, message: str, history: Sequence[dict[str, str]]) -> int:
        return len(self.run.task.chat_tokens(self.run, message, system=self.system, history=history))

    def fit(self, message: str) -> int:
        """Drop the oldest exchanges until the conversation, ``message`` and the reply fit in
        the context; returns the reply's length in tokens (shortened when even the message
        alone leaves less room), and says what was dropped."""
        wanted = self.options.get("max_new_tokens") or self.run.recipe.generate.max_new_tokens
        if not self.context:
            return wanted
        dropped, freed = 0, 0
        size = self._tokens(message, self.history)
        while size + wanted > self.context and self.history:
            before = size
            self.history = self.history[2:]  # one exchange: the user's message and the reply
            size = self._tokens(message, self.history)
            dropped, freed = dropped + 1, freed + before - size
        if dropped:
            self.say(f"[context: the model reads {self.context:,} tokens; dropped the oldest {dropped} "
                     f"exchange{'s' * (dropped != 1)} ({freed:,} tokens) to make room for this message and a reply "
                     f"of {wanted:,}]")
        room = self.context - size
        if room <= 0:
            raise UsageError(f"the message takes {size:,} tokens with the chat template, and the model reads "
                             f"{self.context:,}: shorten it (or /system, /reset)")
        if room < wanted:
            self.say(f"[context: {room:,} tokens are left for the reply, not {wanted:,}]")
        return min(room, wanted)

    def reply(self, message: str) -> Iterator[str]:
        """The reply to ``message``, as it comes; the exchange joins the history when the reply
        has ended. A reply that is interrupted (Ctrl-C, or the caller stops reading) leaves the
        history as it was: a model fed a reply cut short tends to repeat it."""
        length = self.fit(message)
        said: list[str] = []
        for piece in self.run.task.stream(self.run, message, chat=True, system=self.system,
                                          messages=self.history, **{**self.options, "max_new_tokens": length}):
            said.append(piece)
            yield piece
        self.history += [{"role": "user", "content": message}, {"role": "assistant", "content": "".join(said)}]


@contextlib.contextmanager
def _keys_held() -> Iterator[None]:
    """While a reply is printed: the terminal does not echo what is typed (it would land in the
    reply's text) and keeps it for the next prompt, Ctrl-C included (``NOFLSH``: the interrupt
    does not flush it). Nothing changes where standard input is not a terminal."""
    try:
        import termios
    except ImportError:  # no POSIX terminal (Windows)
        yield
        return
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    saved = termios.tcgetattr(fd) if fd is not None else None
    if saved is not None:
        quiet = list(saved)
        quiet[3] = (quiet[3] & ~termios.ECHO) | termios.NOFLSH  # the local modes
        termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSANOW, saved)


def _lines(read: Callable[[str], str], prompt: str) -> Iterator[str | None]:
    """The user's lines; ``None`` for a Ctrl-C at the prompt (a new prompt, not the end)."""
    while True:
        try:
            yield read(prompt)
        except KeyboardInterrupt:
            print()
            yield None
        except EOFError:
            print()
            return


def cmd_chat(args: argparse.Namespace) -> int:
    from ..generation.sampling import GENERATION_OPTIONS, check_generation
    from ..run.task import check_text

    given = {k: getattr(args, k) for k in GENERATION_OPTIONS if getattr(args, k) is not None}
    options = check_generation(names=lambda key: "--" + key.replace("_", "-"), **given)  # before the model loads
    run = load_run_or_model(args.model, args.checkpoint, args.device, args.int8)
    if run.task.outputs != "text":
        raise UsageError(f"{args.model} is a run of the {run.task.name} task: it does not write text")
    tokenizer = run.task.tokenizer_of(run)
    if getattr(tokenizer, "chat_template", None) is None:
        tokenizer.chat_prompt([{"role": "user", "content": ""}])  # its own one-line reason
    session = ChatSession(run, options, args.system)
    if isinstance(sys.stdin, io.TextIOWrapper):  # bytes that are not UTF-8 reach the check of the text, not a crash
        sys.stdin.reconfigure(errors="surrogateescape")
    print(f"chatting with {args.model} (context {session.context:,} tokens). {HELP}", flush=True)
    try:
        import readline  # noqa: F401  # line editing and history for input(), where the platform has it
    except ImportError:
        pass
    for line in _lines(input, "> "):
        if line is None:
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            session.reset()
            print("[the conversation is forgotten]")
            continue
        if text == "/system" or text.startswith("/system "):
            system = text[len("/system"):].strip() or None
            try:
                check_text(system or "", "the system message")
            except InputError as exc:
                print(f"[{exc}]")
                continue
            session.system = system
            print(f"[system message: {session.system!r}]" if session.system else "[no system message]")
            continue
        if text.startswith("/"):
            print(f"[{text.split()[0]} is not a command. {HELP}]")
            continue
        try:
            with _keys_held():
                for piece in session.reply(line):
                    sys.stdout.write(piece)
                    sys.stdout.flush()
            print()
        except KeyboardInterrupt:
            print(" [interrupted: left out of the conversation]")
        except InputError as exc:  # this message cannot be sent; the conversation goes on without it
            print(f"[{exc}]")
    return 0


def add_chat(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab chat``."""
    p = sub.add_parser("chat", parents=[plugins], help="a conversation in the terminal with a language model",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("model", help=f"a GGUF file, a Hugging Face decoder folder ({decoder_names()}) or a run directory "
                                 f"of the language_modeling task, with a chat template")
    p.add_argument("--checkpoint", default="auto", help=CHECKPOINT_HELP)
    p.add_argument("--system", default=None, metavar="TEXT", help="the system message (/system changes it)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="the longest reply (default: the model's)")
    p.add_argument("--temperature", type=float, default=None, help="0: greedy (default: the model's)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the K most probable tokens (0: all)")
    p.add_argument("--top-p", type=float, default=None, help="sample within the smallest set of probability P")
    p.add_argument("--min-p", type=float, default=None,
                   help="sample among the tokens at least P times as probable as the likeliest")
    p.add_argument("--repetition-penalty", type=float, default=None, help="above 1: repeated tokens are less likely")
    p.add_argument("--seed", type=int, default=None, help="of the sampling")
    p.add_argument("--stop", action="append", default=None, metavar="TEXT", help="a text that ends a reply")
    p.add_argument("--int8", action="store_true",
                   help="keep the linear layers' weights in 8 bits (faster decoding on the CPU, slightly other text)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto (default cpu)")
    p.set_defaults(func=cmd_chat)
