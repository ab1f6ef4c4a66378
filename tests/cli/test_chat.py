"""``attnlab chat``: a conversation through a pseudo-terminal (Ctrl-C ends a reply and not the
session; /system, /reset, /exit), and the context kept within the model's window, saying what
was dropped."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from pathlib import Path
from typing import Iterator

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
    from attnlab.tasks.lm_folders import load_folder

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


@contextlib.contextmanager
def _chat(path: Path, *args: str) -> Iterator[tuple[int, int]]:
    """``attnlab chat PATH ARGS`` in a pseudo-terminal: (pid, the terminal's fd), killed and closed after."""
    import pty

    attnlab = Path(sys.executable).with_name("attnlab")
    pid, fd = pty.fork()
    if pid == 0:  # the child: attnlab, with the pseudo-terminal as its terminal
        # Ctrl-C as a terminal's program gets it: an ignored SIGINT (a test runner's worker may ignore
        # it) stays ignored across exec, as a blocked one stays blocked, and Ctrl-C would never arrive
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        os.execv(str(attnlab), [str(attnlab), "chat", str(path), *args])
    try:
        yield pid, fd
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        os.close(fd)


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX's")
def test_a_session_in_a_terminal_survives_ctrl_c_and_takes_its_commands(tmp_path: Path) -> None:
    with _chat(_model(tmp_path, 100_000), "--max-new-tokens", "50000", "--temperature", "0") as (pid, fd):
        _read_until(fd, b"> ")
        os.write(fd, b"hello there\n")
        echoed = _read_until(fd, b"hello there\r\n")
        # the reply is under way (50,000 tokens: minutes) once its first characters come: a Ctrl-C sent
        # earlier, on a loaded machine, could reach the prompt's line editing instead of the reply
        _read_until(fd, b"", seconds=60.0, more_than=len(echoed.split(b"hello there\r\n", 1)[1]))
        os.write(fd, b"\x03")  # Ctrl-C, as the terminal sends it
        out = _read_until(fd, b"conversation]")  # [interrupted: left out of the conversation]
        # the new prompt may have come in the same read, whole or its first character only (seen: ">"
        # there and " " in the next read, which a fresh search for "> " never matched)
        _read_until(fd, b"> ", start=out.split(b"conversation]", 1)[1])
        os.write(fd, b"/system You are terse.\n")
        _read_until(fd, b"[system message: 'You are terse.']")
        os.write(fd, b"/reset\n")
        _read_until(fd, b"[the conversation is forgotten]")
        os.write(fd, b"/exit\n")
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_an_interrupted_reply_is_left_out_and_the_next_reply_is_that_of_a_chat_without_it(tmp_path: Path) -> None:
    from attnlab.cli.chat import ChatSession
    from attnlab.tasks.lm_folders import load_folder

    run = load_folder(_model(tmp_path, 4096))
    options = {"max_new_tokens": 12, "temperature": 0.0}
    session = ChatSession(run, options)
    pieces = session.reply("tell me about the cat")
    assert next(pieces)  # the reply has begun ...
    pieces.close()  # ... and is cut short, as Ctrl-C cuts it
    assert session.history == []
    after = "".join(session.reply("and the dog?"))
    assert after == "".join(ChatSession(run, options).reply("and the dog?"))
    assert [m["role"] for m in session.history] == ["user", "assistant"]


REFUSES_SYSTEM = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
                  "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX's")
def test_keys_typed_during_a_reply_wait_for_the_prompt_and_bad_messages_are_refused_one_by_one(
        tmp_path: Path) -> None:
    vocab = byte_level_vocab()
    vocab = {**vocab, "types": [1] * len(vocab["tokens"]), "eos": None}
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(vocab["tokens"]), hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=100_000)
    path = write_gguf(tmp_path / "strict.gguf", "llama", transformers.LlamaForCausalLM(cfg).eval(), vocab,
                      extra={"tokenizer.chat_template": REFUSES_SYSTEM})
    with _chat(path, "--max-new-tokens", "50000", "--temperature", "0") as (pid, fd):
        _read_until(fd, b"> ")
        os.write(fd, b"hello there\n")
        echoed = _read_until(fd, b"hello there\r\n")
        _read_until(fd, b"", more_than=len(echoed.split(b"hello there\r\n", 1)[1]))  # the reply has begun
        os.write(fd, b"/reset")  # typed during the reply, without Enter
        time.sleep(1.0)
        os.write(fd, b"\x03")
        shown = _read_until(fd, b"[interrupted: left out of the conversation]")
        reply = shown.split(b"hello there\r\n", 1)[-1].split(b"[interrupted")[0]
        assert b"/reset" not in reply and b"reset" not in reply  # not echoed into the reply's text
        after = _read_until(fd, b"/reset", start=shown.split(b"[interrupted", 1)[1])  # the next prompt holds it
        os.write(fd, b"\n")
        _read_until(fd, b"[the conversation is forgotten]", start=after)
        os.write(fd, b"caf\xe9 \xff\xfe au lait\n")  # Latin-1, not UTF-8
        _read_until(fd, b"is not UTF-8 text")
        os.write(fd, b"/system be brief\n")
        _read_until(fd, b"[system message: 'be brief']")
        os.write(fd, b"hi\n")
        _read_until(fd, b"refused the conversation: System role not supported")
        os.write(fd, b"/exit\n")
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0  # the session went on to /exit


def test_text_that_is_not_utf8_piped_in_is_refused_and_the_session_goes_on(tmp_path: Path) -> None:
    import subprocess

    attnlab = Path(sys.executable).with_name("attnlab")
    text = b"\xff\xfe" * 1500 + b"\n" + b"hello\n"  # 3,000 bytes that are not UTF-8, then a good message
    done = subprocess.run([str(attnlab), "chat", str(_model(tmp_path, 4096)), "--max-new-tokens", "3"], input=text,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    out = done.stdout.decode()
    assert out.count("is not UTF-8 text") == 1 and "Traceback" not in done.stderr.decode()
    assert out.rstrip().endswith(">")  # the good message was answered, and the session ended at the end of its input
