"""The options of text generation, checked in one place, and the choice of the next token.

Every way in (``attnlab generate`` and ``attnlab predict``, a recipe's ``generate``
section, ``run.generate(...)``, ``model.generate(...)``) checks its options with
:func:`check_generation`, which names each by the caller's own name for it (``--top-p``,
``generate.top_p``, ``top_p``)::

    check_generation(temperature=0.8, top_k=50, names=lambda key: f"generate.{key}")

The rules: ``max_new_tokens`` an integer >= 0; ``temperature`` a finite number >= 0 (0:
greedy); ``top_k`` an integer >= 0 (0 or ``None``: no limit); ``top_p`` in (0, 1];
``min_p`` in [0, 1] (0 or ``None``: no limit);
``repetition_penalty`` a finite number > 0 (1: none); ``seed`` an integer in
[0, 2**64); ``stop`` a non-empty text or a list of them. :func:`choose_next` applies them
to a step's logits.

A checkpoint may embed more ids than its tokenizer has (Qwen pads 151,669 tokens to 151,936
rows): the caller, who knows the tokenizer, gives ``decodable``, the number of ids it
decodes, and :func:`only_decodable` puts ``-inf`` on the rows past them before anything else,
so that neither a draw nor the arg-max ever picks one and probabilities are renormalised over
the tokens that can be decoded.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from ..errors import InputError
from .processors import Decodable, choose, penalize_repeats, processors_for

__all__ = ["GENERATION_OPTIONS", "check_generation", "check_decodable", "only_decodable", "choose_next",
           "penalize_repeats"]

GENERATION_OPTIONS = ("max_new_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed",
                      "stop")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _rule(key: str, value: Any) -> str | None:
    """What ``value`` of option ``key`` must be, when it is not (``None``: it fits)."""
    if key == "max_new_tokens":
        return None if _is_int(value) and value >= 0 else "an integer >= 0"
    if key == "temperature":
        return None if _is_real(value) and math.isfinite(value) and value >= 0 else "a finite number >= 0 (0: greedy)"
    if key == "top_k":
        return None if value is None or (_is_int(value) and value >= 0) else "an integer >= 0 (0: no limit)"
    if key == "top_p":
        return None if value is None or (_is_real(value) and 0 < value <= 1) else "a number in (0, 1]"
    if key == "min_p":
        return None if value is None or (_is_real(value) and 0 <= value <= 1) else "a number in [0, 1] (0: no limit)"
    if key == "repetition_penalty":
        ok = _is_real(value) and math.isfinite(value) and value > 0
        return None if ok else "a finite number > 0 (1: no penalty)"
    if key == "seed":
        return None if value is None or (_is_int(value) and 0 <= value < 2**64) else "an integer in [0, 2**64)"
    if key == "stop":
        stops = [value] if isinstance(value, str) else value
        ok = value is None or (isinstance(stops, (list, tuple)) and all(isinstance(t, str) and t for t in stops))
        return None if ok else "a non-empty text or a list of non-empty texts that end a continuation"
    raise InputError(f"generation option must be one of {', '.join(GENERATION_OPTIONS)}; got {key!r}")


def check_generation(*, names: Callable[[str], str] = str, **options: Any) -> dict[str, Any]:
    """``options`` (any of :data:`GENERATION_OPTIONS`), each checked against its rule;
    the first that breaks it raises :class:`~attnlab.errors.InputError` naming it as
    ``names(key)`` says (the command line's flag, the recipe's key). Returns the options,
    ``stop`` as a list."""
    for key, value in options.items():
        rule = _rule(key, value)
        if rule is not None:
            raise InputError(f"{names(key)} must be {rule}; got {value!r}")
    if isinstance(options.get("stop"), str):
        options["stop"] = [options["stop"]]
    return options


def check_decodable(decodable: Any, vocab_size: int, name: str = "decodable") -> int | None:
    """``decodable`` (the number of ids the tokenizer decodes, ``None``: all ``vocab_size``
    rows of the model), refused by ``name`` unless an integer in ``[1, vocab_size]``: a
    tokenizer with more ids than the model embeds gives ids that have no embedding."""
    if decodable is None:
        return None
    if not _is_int(decodable) or not 1 <= decodable <= vocab_size:
        raise InputError(f"{name} must be an integer in [1, {vocab_size}] (the tokenizer's ids, at most the "
                         f"{vocab_size} the model embeds); got {decodable!r}")
    return decodable


def only_decodable(logits: Tensor, decodable: int | None) -> Tensor:
    """``logits`` ``(..., V)`` with ``-inf`` at every id ``>= decodable`` (rows of the
    embedding that the tokenizer has no token for); ``None`` or ``V``: unchanged
    (:class:`~attnlab.generation.processors.Decodable`)."""
    return logits if decodable is None else Decodable(decodable)(logits, logits)


def choose_next(logits: Tensor, *, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                min_p: float | None = None, generator: torch.Generator | None = None, decodable: int | None = None,
                seen: Tensor | None = None, repetition_penalty: float = 1.0) -> Tensor:
    """The next token of each row of ``logits`` ``(B, V)`` (float32) under a generation's
    options, through the same processors as :func:`~attnlab.generation.search.stream`
    (:func:`~attnlab.generation.processors.processors_for`): the ids past ``decodable`` masked, the
    tokens of ``seen`` ``(B, V)`` penalized by ``repetition_penalty``, then the arg-max when
    ``temperature`` is 0, else a draw within ``top_k``, ``top_p`` and ``min_p``."""
    if seen is not None and repetition_penalty != 1:
        logits = penalize_repeats(only_decodable(logits, decodable), seen, repetition_penalty)
    chosen = processors_for(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, decodable=decodable)
    return choose(logits, logits, chosen, generator)
