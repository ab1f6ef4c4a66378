"""``attnlab chat``: a conversation through a pseudo-terminal (Ctrl-C ends a reply and not the
session; /system, /reset, /exit), and the context kept within the model's window, saying what
was dropped."""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from gguf_files import byte_level_vocab, write_gguf

transformers = pytest.importorskip("transformers", reason="transformers builds the tiny model written as GGUF")

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _model(tmp: Path, context: int) -> Path:
    """A tiny random llama GGUF file with a ChatML template and no token that ends a reply (its
    replies run to their length, so that one can be interrupted)."""
    vocab = byte_level_vocab()
    vocab = {**vocab, "types": [1] * len(vocab["tokens"]), "eos": None}
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(vocab["tokens"]), hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=context)
    model = transformers.LlamaForCausalLM(cfg).eval()
    return write_gguf(tmp / f"chat{context}.gguf", "llama", model, vocab, extra={"tokenizer.chat_template": CHATML})


def test_the_context_drops_the_oldest_exchanges_and_says_so(tmp_path: Path) -> None:
    from attnlab.cli.chat import ChatSession
    from attnlab.tasks.language_modeling import load_folder

    run = load_folder(_model(tmp_path, 160))
    notes: list[str] = []
    session = ChatSession(run, {"max_new_tokens": 24, "temperature": 0.0}, say=notes.append)
    assert session.context == 160
    for i in range(6):
        message = f"message number {i} about the cat on the mat"
        length = session.fit(message)  # what reply does first
        assert len(run.task.chat_tokens(run, message, history=session.history)) + length <= 160
        assert isinstance("".join(session.reply(message)), str)
    assert any("dropped the oldest" in n and "tokens) to make room" in n for n in notes), notes
    assert session.history[-2]["content"].startswith("message number 5")
    too_long = " ".join(["cat"] * 400)
    from attnlab.cli.common import UsageError

    with pytest.raises(UsageError, match="the model reads 160"):
        "".join(session.reply(too_long))


def _read_until(fd: int, wanted: bytes, seconds: float = 60.0, more_than: int = -1, start: bytes = b"") -> bytes:
    """What the terminal shows until ``wanted`` has come (and more than ``more_than`` bytes), after
    ``start``, what an earlier read already took (``wanted`` may straddle two reads)."""
    out = start
    end = time.monotonic() + seconds
    while wanted not in out or len(out) <= more_than:
        if time.monotonic() > end:
            raise AssertionError(f"{wanted!r} did not come; got {out[-400:]!r}")
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                out += os.read(fd, 4096)
            except OSError:
                break
    return out


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX's")
def test_a_session_in_a_terminal_survives_ctrl_c_and_takes_its_commands(tmp_path: Path) -> None:
    import pty

    path = _model(tmp_path, 100_000)
    attnlab = Path(sys.executable).with_name("attnlab")
    pid, fd = pty.fork()
    if pid == 0:  # the child: attnlab, with the pseudo-terminal as its terminal
        # Ctrl-C as a terminal's program gets it: an ignored SIGINT (a test runner's worker may ignore
        # it) stays ignored across exec, as a blocked one stays blocked, and Ctrl-C would never arrive
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        os.execv(str(attnlab), [str(attnlab), "chat", str(path), "--max-new-tokens", "50000", "--temperature", "0"])
    try:
        _read_until(fd, b"> ")
        os.write(fd, b"hello there\n")
        echoed = _read_until(fd, b"hello there\r\n")
        # the reply is under way (50,000 tokens: minutes) once its first characters come: a Ctrl-C sent
        # earlier, on a loaded machine, could reach the prompt's line editing instead of the reply
        _read_until(fd, b"", seconds=60.0, more_than=len(echoed.split(b"hello there\r\n", 1)[1]))
        os.write(fd, b"\x03")  # Ctrl-C, as the terminal sends it
        out = _read_until(fd, b"[interrupted]")
        # the new prompt may have come in the same read, whole or its first character only (seen: ">"
        # there and " " in the next read, which a fresh search for "> " never matched)
        _read_until(fd, b"> ", start=out.split(b"[interrupted]", 1)[1])
        os.write(fd, b"/system You are terse.\n")
        _read_until(fd, b"[system message: 'You are terse.']")
        os.write(fd, b"/reset\n")
        _read_until(fd, b"[the conversation is forgotten]")
        os.write(fd, b"/exit\n")
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        os.close(fd)
