"""What a task shows, as data: predictions on new inputs, predictions on its test set,
sample outputs, and the attention of its model on a few inputs.

Tasks compute these; :mod:`attnlab.viz` and :mod:`attnlab.report`, which sit above the
tasks, draw them by their type, so that neither names a task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from torch import Tensor

__all__ = ["token_labels", "LabelPrediction", "TextPrediction", "ClassifierPredictions", "SampleTable", "TextAttention",
           "AlignmentAttention", "ImageAttention", "PixelAttention", "GenerationAttention"]


# ----------------------------------------------------------------------------- new inputs


@dataclass
class LabelPrediction:
    """A classifier's answer for one input: ``labels`` ``[(class name, probability), ...]``, best first."""

    input: str
    labels: list[tuple[str, float]]

    @property
    def label(self) -> str:
        """The most probable class."""
        return self.labels[0][0]

    @property
    def prob(self) -> float:
        """Its probability."""
        return self.labels[0][1]


@dataclass
class TextPrediction:
    """A generated text for one input (a translation)."""

    input: str
    output: str


# ----------------------------------------------------------------------------- the test set


@dataclass
class ClassifierPredictions:
    """Labels of every test sample: ``true``, ``pred`` and the probability of ``pred``.

    ``examples`` holds a few test inputs as shown to a person (``uint8`` ``(C, H, W)``
    tensors for images, strings for texts), those at the indices ``shown``: evenly
    spaced, so that a test set sorted by class shows every class. ``weights`` says which
    checkpoint(s) predicted.
    """

    classes: list[str]
    true: list[int]
    pred: list[int]
    prob: list[float]
    weights: str
    examples: list[Any] = field(default_factory=list)
    shown: list[int] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return sum(t == p for t, p in zip(self.true, self.pred)) / max(len(self.true), 1)


@dataclass
class SampleTable:
    """A few sample outputs as a table: ``title``, a sentence about them, the column
    names and the rows (e.g. source, reference and translation)."""

    title: str
    text: str
    header: tuple[str, ...]
    rows: list[tuple[str, ...]]


# ----------------------------------------------------------------------------- attention


@dataclass
class TextAttention:
    """Self-attention over one token sequence: per layer ``(name, weights (heads, L, L))``."""

    title: str
    tokens: list[str]
    layers: list[tuple[str, Tensor]]


@dataclass
class AlignmentAttention:
    """Decoder cross-attention: per decoder layer ``weights (heads, Lt, Ls)``, target
    tokens (rows) against source tokens (columns)."""

    title: str
    source_tokens: list[str]
    target_tokens: list[str]
    layers: list[Tensor]
    source_layers: list[tuple[str, Tensor]] = field(default_factory=list)
    """The encoder's self-attention, per layer ``(name, weights (heads, Ls, Ls))`` (the explorer's)."""
    target_layers: list[tuple[str, Tensor]] = field(default_factory=list)
    """The decoder's self-attention, per layer ``(name, weights (heads, Lt, Lt))``."""
    layer_names: list[str] = field(default_factory=list)
    """The cross-attention modules' names, one per entry of ``layers``."""


@dataclass
class ImageAttention:
    """A ViT's attention on one image: per block ``weights (heads, N, N)`` over the
    ``prefix`` class/register tokens and the ``grid`` ``(h, w)`` of patches. ``pooling``:
    ``"token"`` (the head reads the class token) or ``"avg"`` (the mean of the patches)."""

    title: str
    image: Tensor
    layers: list[Tensor]
    grid: tuple[int, int]
    prefix: int
    pooling: str


@dataclass
class PixelAttention:
    """2-D self-attention on one image (BoTNet): per block ``(name, weights (heads, hw, hw),
    (h, w))``, and the ``queries`` ``(row, col)`` pixels of the image to draw."""

    title: str
    image: Tensor
    blocks: list[tuple[str, Tensor, tuple[int, int]]]
    queries: list[tuple[int, int]]


@dataclass
class GenerationAttention:
    """A decoder's attention over a prompt and its greedy continuation, per layer
    ``(name, weights (heads, L, L))``: the prompt's rows from one pass over it, each
    generated token's row from the decoding step that read it (with the model's cache where
    it keeps one: ``cached``). ``top[i]``: the model's most probable next tokens after
    position ``i``, ``[(token, probability), ...]``. ``opaque``: attention modules that form
    no weight matrix (drawn as a note). ``ids``: the token ids of ``tokens``."""

    title: str
    tokens: list[str]
    prompt_len: int
    layers: list[tuple[str, Tensor]]
    top: list[list[tuple[str, float]]]
    cached: bool
    opaque: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)


PARTIAL = "\ufffd"  # what a tokenizer decodes a piece of a character's bytes to


def token_labels(decode: Callable[[Sequence[int]], str], ids: Sequence[int],
                 piece: Callable[[int], str | None] | None = None) -> list[str]:
    """Each token of ``ids`` as the text it adds to those before it, so that a character whose
    bytes a byte-level vocabulary splits over several tokens (most Chinese characters) is shown
    on each of them, marked with its part ("注 1/2", "注 2/2"), never as "\ufffd". ``decode``:
    the tokenizer's, of a list of ids. A token that adds text other than as a suffix (a
    vocabulary that rewrites what came before) is shown as decoded alone; ids that end inside a
    character show their parts of "\ufffd". ``piece``: a token's own spelling, for the tokens that
    add no text (special tokens, which decoding leaves out: ``<bos>``)."""
    labels: list[str] = []
    pending: list[int] = []  # tokens that end inside a character whose bytes are not all out
    done = ""  # the text of the tokens so far, up to the last whole character
    for i in range(len(ids)):
        text = decode(ids[: i + 1])
        whole = text.rstrip(PARTIAL) if i + 1 < len(ids) else text  # the next tokens may complete it
        added = whole[len(done):] if whole.startswith(done) else decode(ids[i: i + 1])
        if whole != text:  # this token ends inside a character
            pending.append(i)
            labels.append(added)
        elif pending:  # ... which this one completes
            char, parts = added[:1], len(pending) + 1
            for n, k in enumerate(pending, 1):
                labels[k] += f"{char} {n}/{parts}"
            labels.append(f"{char} {parts}/{parts}" + added[1:])
            pending = []
        else:
            labels.append(added if added or piece is None else (piece(ids[i]) or ""))
        done = whole
    return labels
