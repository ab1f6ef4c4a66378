"""Chat templates: a conversation rendered into the prompt a chat model was trained on,
as ``transformers``' ``tokenizer.apply_chat_template(messages, tokenize=False)`` renders it::

    text = render_chat(template, [{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                       special_tokens={"bos_token": "<s>", "eos_token": "</s>"})

A pretrained model's folder keeps its template in ``chat_template.jinja`` (transformers 5)
or under ``chat_template`` in ``tokenizer_config.json`` (see
:class:`~attnlab.data.tokenizers.lm.HFTokenizer`). A template is Jinja code from someone
else's folder, so it runs as transformers runs it, in Jinja's immutable sandbox, with what
transformers gives it and nothing more:

* the environment: ``trim_blocks`` and ``lstrip_blocks`` (a block tag's own line and its
  indentation leave no text), the ``loopcontrols`` extension (``break``, ``continue``) and
  a ``{% generation %}`` block, rendered as its body (transformers marks the assistant's
  tokens with it);
* ``raise_exception(message)`` (a template that refuses a conversation: one line naming it),
  ``strftime_now(format)`` (today's date, which some templates print), ``tojson`` as
  ``json.dumps`` (no HTML escaping; ``indent``, ``separators``, ``sort_keys``), ``dict``
  and a ``namespace`` that refuses names starting with ``_``;
* the variables ``messages`` (each message's keys whose value is not ``None``),
  ``add_generation_prompt``, ``tools`` and ``documents`` (``None``) and the folder's named
  special tokens (``bos_token``, ``eos_token``, ``unk_token``, ``sep_token``,
  ``pad_token``, ``cls_token``, ``mask_token``) as text.

A template is someone else's code, so its rendering is bounded: at most
:data:`~attnlab.limits.CHAT_MAX_CHARS` characters out; no value past that size from the
operations that multiply one (``'x' * n``, a width in a filter, ``'%999999999s'|format``,
``tojson(indent=n)``, ``indent``, ``replace``, ``join``); at most
:data:`~attnlab.limits.CHAT_MAX_BYTES` more memory in the process for the values it makes in
between (a string doubled in a loop), watched as it runs; at most
:data:`~attnlab.limits.CHAT_MAX_SECONDS` seconds. The refusal names the limit.

Jinja itself is a dependency of torch; its versions before 3.1.6 had sandbox escapes, so
they are refused, as transformers refuses them.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache, wraps
from typing import Any

from ...errors import InputError
from ...limits import CHAT_MAX_BYTES, CHAT_MAX_CHARS, CHAT_MAX_SECONDS

__all__ = ["render_chat", "SPECIAL_TOKEN_NAMES"]

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""The special tokens a tokenizer names (``tokenizer_config.json``) that a template can read."""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())


@lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    """The template compiled in the sandbox that transformers renders chat templates in
    (``transformers.utils.chat_template_utils._compile_jinja_template``)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if _version(jinja2.__version__) < (3, 1, 6):
        raise InputError(f"a chat template needs jinja2 >= 3.1.6 (earlier versions have sandbox escapes, and a "
                         f"template is someone else's code); this Python has jinja2 {jinja2.__version__}: "
                         f"pip install -U jinja2")

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: the body, as it is."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """Jinja's namespace, refusing names that start with ``_`` (CPython's internals)."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's own signature trick: namespace(self=...) works
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a namespace cannot hold {name!r} (a name starting with _)")

    class Dict:
        """``dict(...)`` and ``dict.fromkeys(...)``, without the class itself (no attribute of it to reach)."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        """``json.dumps``, a chunk at a time, stopped past CHAT_MAX_CHARS: the indent repeats on
        every line, so a moderate one makes a huge text of a long conversation."""
        _check_counts("the filter tojson", (indent,), {})
        encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                                   sort_keys=sort_keys)
        pieces, size = [], 0
        for piece in encoder.iterencode(x):
            size += len(piece)
            if size > CHAT_MAX_CHARS:
                raise _TooLong(f"tojson made a value of more than {CHAT_MAX_CHARS:,} characters (attnlab.limits."
                               f"CHAT_MAX_CHARS)")
            pieces.append(piece)
        return "".join(pieces)

    class Bounded(ImmutableSandboxedEnvironment):
        """The sandbox, with the operators and calls that make one value of any size refused
        past CHAT_MAX_CHARS (``'x' * 10**9``, ``'x' | center(10**9)``, ``2 ** 10**8``):
        each is one C call, done before a time check could see it."""

        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _check_size(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            name = getattr(__obj, "__name__", "a call")
            _check_counts(name, args, kwargs)
            method = getattr(__obj, "__wrapped__", __obj)  # str.format comes wrapped in the sandbox's formatter
            owner = getattr(method, "__self__", None)
            if isinstance(owner, str) and name in _METHOD_SIZES:
                _check_total(name, _METHOD_SIZES[name](owner, *args, **kwargs))
            return super().call(__context, __obj, *args, **kwargs)

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    for name, f in list(env.filters.items()):
        env.filters[name] = _counted(name, f)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = Dict()
    env.globals["namespace"] = Namespace
    return env.from_string(template)


class _TooLong(Exception):
    """A chat template passed CHAT_MAX_SECONDS or CHAT_MAX_CHARS; its message is the refusal."""


def _length(value: Any) -> int:
    return len(value) if isinstance(value, (str, list, tuple)) else 1


def _check_size(operator: str, left: Any, right: Any) -> None:
    """Refuses ``left operator right`` when its result would pass CHAT_MAX_CHARS (or, for
    ``**``, an integer of more than CHAT_MAX_CHARS bits)."""
    if operator == "%" and isinstance(left, str):
        size = _widths(left)
    elif operator == "*" and isinstance(left, int) != isinstance(right, int):
        n = left if isinstance(left, int) else right
        size = _length(right if isinstance(left, int) else left) * max(int(n), 0)
    elif operator == "+" and isinstance(left, (str, list, tuple)):
        size = _length(left) + _length(right)
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
        size = abs(left).bit_length() * max(right, 0)
    else:
        return
    if size > CHAT_MAX_CHARS:
        raise _TooLong(f"a value of {size:,} characters, past the limit of {CHAT_MAX_CHARS:,} (attnlab.limits."
                       f"CHAT_MAX_CHARS)")


def _check_total(name: str, size: int) -> None:
    if size > CHAT_MAX_CHARS:
        raise _TooLong(f"{name} would make a value of {size:,} characters, past the limit of {CHAT_MAX_CHARS:,} "
                       f"(attnlab.limits.CHAT_MAX_CHARS)")


_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\d*)(?:\.(\d*))?")
_FIELD = re.compile(r"\{[^{}]*?:([^{}]*)\}")


def _widths(text: Any) -> int:
    """The widest width or precision a format string asks for (``%9s``, ``{:>9}``, ``{:.9f}``)."""
    if not isinstance(text, str):
        return 0
    numbers = [n for m in _PRINTF.finditer(text) for n in m.groups() if n]
    numbers += [n for spec in _FIELD.findall(text) for n in re.findall(r"\d+", spec)]
    return max((int(n) for n in numbers), default=0)


def _replaced(s: Any, old: Any = "", new: Any = "", count: Any = None, *_: Any) -> int:
    if not (isinstance(s, str) and isinstance(old, str) and isinstance(new, str)):
        return 0
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    return len(s) + n * max(len(new) - len(old), 0)


def _joined(separator: Any, items: Any) -> int:
    if not isinstance(items, (list, tuple)):
        return 0  # made on the way (a generator): its parts were bounded as they were made
    return sum(len(x) for x in items if isinstance(x, str)) + len(str(separator)) * max(len(items) - 1, 0)


def _indented(s: Any, width: Any = 4, *_: Any, **__: Any) -> int:
    text = str(s)
    return len(text) + (text.count("\n") + 1) * (len(width) if isinstance(width, str) else int(width or 0))


# What a filter or a method of a string would make, in characters, from what it is given: the
# operations whose result can be many times their inputs.
_FILTER_SIZES: dict[str, Any] = {
    "format": lambda value, *a, **k: _widths(value),
    "replace": _replaced,
    "join": lambda value, d="", attribute=None: _joined(d, value) if attribute is None else 0,
    "indent": _indented,
}
_METHOD_SIZES: dict[str, Any] = {
    "format": lambda s, *a, **k: _widths(s), "format_map": lambda s, *a, **k: _widths(s),
    "replace": _replaced, "join": _joined,
    "expandtabs": lambda s, tabsize=8: len(s) + s.count("\t") * (tabsize if isinstance(tabsize, int) else 0),
}


def _check_counts(name: str, args: Any, kwargs: Any) -> None:
    """Refuses a call or filter given a count past CHAT_MAX_CHARS (a width, a repeat)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and value > CHAT_MAX_CHARS:
            raise _TooLong(f"{name} was given {value:,}, past the limit of {CHAT_MAX_CHARS:,} characters (attnlab."
                           f"limits.CHAT_MAX_CHARS)")


def _counted(name: str, f: Any) -> Any:
    """Filter ``f`` refusing a count past CHAT_MAX_CHARS (``center(10**9)``); Jinja's marks of
    what the filter is passed (``jinja_pass_arg``) carry over."""
    skip = 2 if getattr(f, "jinja_pass_arg", None) else 1  # the value (after the context Jinja passes) is no count
    size_of = _FILTER_SIZES.get(name)

    @wraps(f)
    def filter_(*args: Any, **kwargs: Any) -> Any:
        _check_counts(f"the filter {name}", args[skip:], kwargs)
        if size_of is not None:
            _check_total(f"the filter {name}", size_of(*args[skip - 1:], **kwargs))
        return f(*args, **kwargs)

    return filter_


def _render(compiled: Any, context: dict[str, Any]) -> str:
    """``compiled.render(**context)`` within CHAT_MAX_SECONDS and CHAT_MAX_CHARS: the output
    is taken piece by piece, and every line of the template's own code (Jinja compiles it to
    Python, named ``<template>``) looks at the clock, so a loop that prints nothing is
    stopped too. The trace covers the template's frames alone; it costs a fraction of a
    millisecond a prompt, nothing beside a model's forward pass."""
    start = time.monotonic()
    deadline = start + CHAT_MAX_SECONDS
    late = f"it ran past the limit of {CHAT_MAX_SECONDS:g} s (attnlab.limits.CHAT_MAX_SECONDS)"
    base = _resident()
    look = [start]  # when the memory is looked at next: a thousand times a second at most

    def line(frame: Any, event: str, arg: Any) -> Any:
        now = time.monotonic()
        if now > deadline:
            raise _TooLong(late)
        if base is not None and now >= look[0]:
            look[0] = now + 0.001
            grown = (_resident() or base) - base
            if grown > CHAT_MAX_BYTES:
                raise _TooLong(f"the values it made took {grown / 2**20:,.1f} MB, past the limit of "
                               f"{CHAT_MAX_BYTES / 2**20:,.0f} MB (attnlab.limits.CHAT_MAX_BYTES)")
        return line

    def call(frame: Any, event: str, arg: Any) -> Any:
        return line if frame.f_code.co_filename == "<template>" else None

    pieces, size, previous = [], 0, sys.gettrace()
    sys.settrace(call)
    try:
        for piece in compiled.generate(**context):
            size += len(piece)
            if size > CHAT_MAX_CHARS:
                raise _TooLong(f"its output passed the limit of {CHAT_MAX_CHARS:,} characters (attnlab.limits."
                               f"CHAT_MAX_CHARS)")
            pieces.append(piece)
    finally:
        sys.settrace(previous)
    return "".join(pieces)


def _resident() -> int | None:
    """The process's resident memory in bytes (Linux's /proc), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _plain(value: Any, where: str) -> Any:
    """``value`` rebuilt of plain JSON types (a str subclass as a str), or an error naming it:
    what a template sees has no methods but those of text, numbers, lists and mappings."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k, where): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise InputError(f"{where} must be text, a number, a list or a mapping; got {type(value).__name__}")


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                special_tokens: Mapping[str, str] | None = None, source: str = "the chat template") -> str:
    """The text of the conversation ``messages`` (``[{"role": "system" | "user" | "assistant",
    "content": text}, ...]``) as ``template`` renders it, with the header of the assistant's
    reply at the end when ``add_generation_prompt`` (the reply is what a model then
    generates). ``special_tokens``: the tokenizer's named special tokens, as text (see
    :data:`SPECIAL_TOKEN_NAMES`). ``source`` names the template in errors (the file it came
    from): a template that is not valid Jinja, that refuses the conversation
    (``raise_exception``) or fails on it is one :class:`~attnlab.errors.InputError`."""
    import jinja2

    if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence) or not messages:
        raise InputError(f"messages must be a non-empty list of {{'role': ..., 'content': ...}} mappings; got "
                         f"{messages!r}"[:300])
    chat = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str) or "content" not in message:
            raise InputError(f"messages[{i}] must be a mapping with a 'role' (text) and a 'content'; got "
                             f"{message!r}"[:300])
        chat.append(_plain({k: v for k, v in message.items() if v is not None}, f"messages[{i}]"))
    names = dict(special_tokens or {})
    unknown = sorted(set(names) - set(SPECIAL_TOKEN_NAMES))
    if unknown:
        raise InputError(f"special_tokens must name only {', '.join(SPECIAL_TOKEN_NAMES)}; got {', '.join(unknown)}")
    try:
        compiled = _compile(template)
    except jinja2.TemplateSyntaxError as exc:
        raise InputError(f"{source} is not a valid Jinja template (line {exc.lineno}: {exc.message})") from None
    try:
        return _render(compiled, {"messages": chat, "tools": None, "documents": None,
                                  "add_generation_prompt": add_generation_prompt, **{k: str(v) for k, v in names.items()}})
    except _TooLong as exc:
        raise InputError(f"{source} was stopped: {exc}") from None
    except jinja2.exceptions.SecurityError as exc:
        raise InputError(f"{source} did something the sandbox forbids: {exc}") from None
    except jinja2.TemplateError as exc:
        if type(exc) is jinja2.TemplateError:  # raise_exception: the template refuses the conversation
            raise InputError(f"{source} refused the conversation: {exc}") from None
        raise InputError(f"{source} failed on the conversation: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001  # a template is someone else's code: its failure is the input's
        raise InputError(f"{source} failed on the conversation: {type(exc).__name__}: {exc}") from None
