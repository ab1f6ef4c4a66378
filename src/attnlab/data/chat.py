"""Chat templates: a conversation rendered into the prompt a chat model was trained on,
as ``transformers``' ``tokenizer.apply_chat_template(messages, tokenize=False)`` renders it::

    text = render_chat(template, [{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                       special_tokens={"bos_token": "<s>", "eos_token": "</s>"})

A pretrained model's folder keeps its template in ``chat_template.jinja`` (transformers 5)
or under ``chat_template`` in ``tokenizer_config.json`` (see
:class:`~attnlab.data.lm_tokenize.HFTokenizer`). A template is Jinja code from someone
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

Jinja itself is a dependency of torch; its versions before 3.1.6 had sandbox escapes, so
they are refused, as transformers refuses them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from ..errors import InputError

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
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = Dict()
    env.globals["namespace"] = Namespace
    return env.from_string(template)


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
        return compiled.render(messages=chat, tools=None, documents=None, add_generation_prompt=add_generation_prompt,
                               **{k: str(v) for k, v in names.items()})
    except jinja2.exceptions.SecurityError as exc:
        raise InputError(f"{source} did something the sandbox forbids: {exc}") from None
    except jinja2.TemplateError as exc:
        if type(exc) is jinja2.TemplateError:  # raise_exception: the template refuses the conversation
            raise InputError(f"{source} refused the conversation: {exc}") from None
        raise InputError(f"{source} failed on the conversation: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001  # a template is someone else's code: its failure is the input's
        raise InputError(f"{source} failed on the conversation: {type(exc).__name__}: {exc}") from None
