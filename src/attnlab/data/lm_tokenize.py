"""Tokenizers for language models, behind one small interface (:class:`LMTokenizer`)::

    tok = CharTokenizer.train(splits.train)          # or ByteTokenizer(), BPETokenizer.train(...)
    ids = tok.encode("Good morrow")                  # list[int]; tok.decode(ids) == "Good morrow"
    tok.vocab_size, tok.eos_id                        # eos_id: the end-of-document token, or None
    tok.save(run_dir)                                 # run_dir/tokenizer.json, written atomically
    tok = load_tokenizer(run_dir)                     # whichever kind it is

A language model must see its text exactly, so none of these normalizes anything (no
NFKC, no lower-casing, no stripping): ``decode(encode(text)) == text`` for every text a
tokenizer can encode. The end-of-document token is never produced by :meth:`encode`,
only put between documents by :class:`~attnlab.data.lm_dataset.LMDataset`; :meth:`decode`
drops it.

Kinds:

* :class:`CharTokenizer` (``"char"``): one id per character (a Unicode code point; an
  emoji with a skin tone is two), the vocabulary the sorted distinct characters of the
  training text, so ids ``0..n-1`` are nanoGPT's ``shakespeare_char`` ids; then ``<eos>``
  (id ``n``, unless ``eos=False``) and ``<unk>`` (only with ``unk=True``). A character
  outside the vocabulary is an error naming it, or, with ``unk=True``, ``<unk>``, which
  decodes to U+FFFD.
* :class:`ByteTokenizer` (``"byte"``): the 256 UTF-8 byte values as ids ``0..255``, then
  ``<eos>`` (256, unless ``eos=False``): any text, nothing to train. A Python string with
  a lone surrogate encodes too (``surrogatepass``); ids that are not UTF-8 decode with U+FFFD.
* :class:`BPETokenizer` (``"bpe"``): a Hugging Face ``tokenizers.Tokenizer``. Trained here,
  it is GPT-2's byte-level BPE without normalization: GPT-2's split into words, all 256
  bytes in the vocabulary (any text encodes, never to an unknown token), ``<|endoftext|>``
  (id 0) ending a document (a text must be valid Unicode: a lone surrogate, which no UTF-8
  file holds, is refused by ``tokenizers``). :meth:`BPETokenizer.load` (or :func:`load_tokenizer`) also
  reads any ``tokenizer.json`` of one's own (GPT-2's, say), whatever its model; its
  end-of-document token is the first of ``<|endoftext|>``, ``<|end_of_text|>``, ``</s>``,
  ``<eos>``, ``[EOS]`` that it has, else ``None``. Special tokens written in a text are
  encoded as the text they are, never as the special token.

``vocab_size`` of :meth:`BPETokenizer.train` is an upper bound: a text too small to give
that many merges gives a smaller vocabulary (with one warning saying so), and the
tokenizer's :attr:`~LMTokenizer.vocab_size` is what it has.

Bits per character: the number of characters that a set of tokens came from is the data
set's (:attr:`~attnlab.data.lm_dataset.LMDataset.num_chars`), not the tokenizer's.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import Tensor

from ..errors import InputError
from ..io import atomic_write_bytes
from .tokenize import check_texts, check_vocab_size, parse_tokenizer, tokenizer_file

__all__ = ["LM_TOKENIZER_KINDS", "LMTokenizer", "CharTokenizer", "ByteTokenizer", "BPETokenizer", "load_tokenizer",
           "train_tokenizer", "RUN_ADVICE"]

LM_TOKENIZER_KINDS = ("char", "byte", "bpe")
_MARK = "attnlab_tokenizer"  # the key that tells a char or byte tokenizer's file from a Hugging Face tokenizer.json
_EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[EOS]")
_PIECE = 1 << 16  # characters: a longer text is encoded in pieces of about this size (see _pieces)
_BATCH_CHARS = 1 << 20  # characters encoded in one call of the Rust tokenizer (its memory: ~100 bytes each)


def _check_ids(ids: Sequence[int] | Tensor, vocab_size: int) -> list[int]:
    if isinstance(ids, Tensor):
        if ids.dim() != 1:
            raise InputError(f"ids must be one sequence (L,); got shape {tuple(ids.shape)}")
        ids = ids.tolist()
    ids = [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise InputError(f"ids must lie in [0, {vocab_size}) (the vocabulary size); got {bad[:5]}")
    return ids


class LMTokenizer:
    """What every language-model tokenizer has (see the module docstring).

    Attributes: ``kind`` (``"char"``, ``"byte"``, ``"bpe"``), ``eos_id`` (the
    end-of-document token, or ``None``), ``unk_id`` (the token of what the vocabulary
    lacks, or ``None`` when it lacks nothing or refuses it)."""

    kind: ClassVar[str] = ""
    eos_id: int | None = None
    unk_id: int | None = None

    @property
    def vocab_size(self) -> int:
        """Ids are ``0 .. vocab_size - 1``."""
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``, without special tokens."""
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """:meth:`encode` of each text."""
        return [self.encode(t) for t in check_texts(texts)]

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """The text of ids ``(L,)``; the end-of-document token is dropped."""
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json`` atomically: to ``path`` when it ends in ``.json``, else
        into the folder ``path`` (created). Returns the file written; :func:`load_tokenizer`
        reads it back."""
        file = tokenizer_file(path)
        atomic_write_bytes(file, json.dumps(self.to_json(), indent=1).encode("utf-8"))
        return file

    @classmethod
    def load(cls, path: str | Path) -> "LMTokenizer":
        """:func:`load_tokenizer`, refusing a file of another kind than ``cls``'s."""
        tok = load_tokenizer(path)
        if not isinstance(tok, cls):
            raise InputError(f"path must hold a {cls.kind} tokenizer for {cls.__name__}.load; "
                             f"{tokenizer_file(path)} holds a {tok.kind} one (load_tokenizer reads any kind)")
        return tok

    def __len__(self) -> int:
        return self.vocab_size


RUN_ADVICE = ("the run's character vocabulary was learned from its training text: use text that holds only those "
              "characters, or train with text.tokenizer=byte or text.tokenizer=bpe, which read any text")
"""What :meth:`CharTokenizer.encode` advises about a character outside the vocabulary of a
run's tokenizer (one that :func:`train_tokenizer` learned or :func:`load_tokenizer` read),
whose ``unk`` no caller can change."""


class CharTokenizer(LMTokenizer):
    """One id per character: ``chars`` (distinct single characters, kept sorted) are ids
    ``0..n-1``, then ``<eos>`` when ``eos``, then ``<unk>`` when ``unk``. ``advice``: what the
    error for a character outside the vocabulary tells the user to do (``None``: train on
    text that holds it, or pass ``unk=True``; a run's tokenizer has :data:`RUN_ADVICE`)."""

    kind = "char"

    def __init__(self, chars: Sequence[str] | str, *, eos: bool = True, unk: bool = False,
                 advice: str | None = None) -> None:
        chars = list(chars)
        bad = [c for c in chars if not (isinstance(c, str) and len(c) == 1)]
        if bad or not chars:
            raise InputError(f"chars must be one or more single characters; got {bad[0]!r}" if bad else
                             "chars must be one or more single characters; got none")
        if len(set(chars)) != len(chars):
            raise InputError(f"chars must be distinct; got {len(chars) - len(set(chars))} repeated")
        self.chars = sorted(chars)
        self.eos_id = len(self.chars) if eos else None
        self.unk_id = len(self.chars) + int(eos) if unk else None
        self._codes = np.array([ord(c) for c in self.chars], dtype=np.int64)
        self._table = self.chars + [""] * int(eos) + ["\ufffd"] * int(unk)
        self.advice = advice

    @classmethod
    def train(cls, texts: str | Sequence[str], *, eos: bool = True, unk: bool = False,
              advice: str | None = None) -> "CharTokenizer":
        """The tokenizer of the distinct characters of ``texts`` (a training split only)."""
        chars = set().union(*map(set, check_texts(texts)))
        if not chars:
            raise InputError("texts must hold at least one character to learn a vocabulary from; got none")
        return cls(sorted(chars), eos=eos, unk=unk, advice=advice)

    @property
    def vocab_size(self) -> int:
        return len(self._table)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str; got {type(text).__name__}")
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4").astype(np.int64)
        ids = np.minimum(np.searchsorted(self._codes, codes), len(self._codes) - 1)
        unknown = self._codes[ids] != codes
        if unknown.any():
            if self.unk_id is None:
                kinds = sorted(set(codes[unknown].tolist()))
                shown = ", ".join(f"{chr(c)!r} (U+{c:04X})" for c in kinds[:5]) + (" ..." if len(kinds) > 5 else "")
                first = int(np.argmax(unknown))
                count = int(unknown.sum())
                many = count > 1
                advice = self.advice or (f"train it on text that holds {'them' if many else 'it'}, or with unk=True "
                                         f"to read such characters as <unk>")
                raise InputError(f"text holds {count:,} character{'s' * many} outside this char tokenizer's "
                                 f"{len(self.chars)} (the first at index {first:,}): {shown}; {advice}")
            ids[unknown] = self.unk_id
        return ids.tolist()

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        table = self._table
        return "".join(table[i] for i in _check_ids(ids, self.vocab_size))

    def to_json(self) -> dict[str, Any]:
        return {_MARK: "char", "version": 1, "chars": self.chars, "eos": self.eos_id is not None,
                "unk": self.unk_id is not None}

    def __repr__(self) -> str:
        return f"CharTokenizer(chars={len(self.chars)}, vocab_size={self.vocab_size}, eos_id={self.eos_id}, " \
               f"unk_id={self.unk_id})"


class ByteTokenizer(LMTokenizer):
    """The UTF-8 bytes of a text as ids ``0..255``, then ``<eos>`` (256) when ``eos``."""

    kind = "byte"

    def __init__(self, *, eos: bool = True) -> None:
        self.eos_id = 256 if eos else None

    @property
    def vocab_size(self) -> int:
        return 256 + (self.eos_id is not None)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str; got {type(text).__name__}")
        return list(text.encode("utf-8", "surrogatepass"))

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        data = bytes(i for i in _check_ids(ids, self.vocab_size) if i < 256)
        try:
            return data.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:  # generated ids need not be UTF-8
            return data.decode("utf-8", "replace")

    def to_json(self) -> dict[str, Any]:
        return {_MARK: "byte", "version": 1, "eos": self.eos_id is not None}

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def _gpt2_split(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` splits text into words as GPT-2 does, with no normalizer (what
    :meth:`BPETokenizer.train` makes): then :func:`_pieces` may cut a long text."""
    spec = json.loads(tokenizer.to_str())
    pre = spec.get("pre_tokenizer") or {}
    return (spec.get("normalizer") is None and pre.get("type") == "ByteLevel"
            and pre.get("add_prefix_space") is False and pre.get("use_regex", True) is True)


def _pieces(text: str, size: int | None = None) -> Iterator[str]:
    """``text`` cut into pieces of about ``size`` (default :data:`_PIECE`) characters or more, each cut just after a
    ``\\n`` that stands between two characters that are not white space. GPT-2's split into
    words makes such a newline a word of its own, so no word spans a cut, and the pieces
    encode (and train) exactly as the whole text would, with a fraction of its memory."""
    size = _PIECE if size is None else size
    start = 0
    while len(text) - start > size:
        cut = text.find("\n", start + size)
        while cut != -1 and (cut + 1 >= len(text) or text[cut - 1].isspace() or text[cut + 1].isspace()):
            cut = text.find("\n", cut + 1)
        if cut == -1:
            break
        yield text[start:cut + 1]
        start = cut + 1
    yield text[start:]


class BPETokenizer(LMTokenizer):
    """A Hugging Face ``tokenizers.Tokenizer``: byte-level BPE from :meth:`train`, or any
    ``tokenizer.json`` from :meth:`load` (see the module docstring). Attribute
    ``tokenizer``: the wrapped one (its truncation and padding switched off)."""

    kind = "bpe"
    EOS = "<|endoftext|>"

    def __init__(self, tokenizer: Tokenizer) -> None:
        tokenizer.no_truncation()
        tokenizer.no_padding()
        tokenizer.encode_special_tokens = True  # "<|endoftext|>" in a text is that text, not the token
        self.tokenizer = tokenizer
        self.eos_id = next((i for name in _EOS_NAMES if (i := tokenizer.token_to_id(name)) is not None), None)
        self.unk_id = _unk_id(tokenizer)
        self._cuttable = _gpt2_split(tokenizer)

    @classmethod
    def train(cls, texts: str | Sequence[str], vocab_size: int = 8192, *, min_frequency: int = 2) -> "BPETokenizer":
        """Byte-level BPE of at most ``vocab_size`` tokens (256 bytes, ``<|endoftext|>``, then
        merges) learnt from ``texts`` (a training split only); a merge must occur at least
        ``min_frequency`` times. Fewer merges than asked for: one warning, and a smaller vocabulary."""
        texts = check_texts(texts)
        if not any(texts):
            raise InputError(f"texts must hold at least one character to learn a vocabulary from; got {len(texts)} "
                             f"empty")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 257:
            raise InputError(f"vocab_size must be an integer >= 257 for byte-level BPE (256 bytes and "
                             f"<|endoftext|>); got {vocab_size!r}")
        check_vocab_size(vocab_size, "vocab_size")
        if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 0:
            raise InputError(f"min_frequency must be a non-negative integer; got {min_frequency!r}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[cls.EOS],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator((piece for text in texts for piece in _pieces(text)), trainer=trainer)
        if tok.get_vocab_size() < vocab_size:
            warnings.warn(f"vocab_size={vocab_size}: the training text gives {tok.get_vocab_size()} tokens (256 bytes, "
                          f"{cls.EOS} and {tok.get_vocab_size() - 257} merges of pairs seen at least "
                          f"{min_frequency} times); the tokenizer has {tok.get_vocab_size()}", stacklevel=2)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        texts = check_texts(texts)
        pieces = [(i, p) for i, t in enumerate(texts) for p in (_pieces(t) if self._cuttable else (t,))]
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)  # fast: no offsets
        out: list[list[int]] = [[] for _ in texts]
        start = 0
        while start < len(pieces):
            end, chars = start, 0
            while end < len(pieces) and (end == start or chars + len(pieces[end][1]) <= _BATCH_CHARS):
                chars += len(pieces[end][1])
                end += 1
            batch = pieces[start:end]
            for (i, _), e in zip(batch, encode([p for _, p in batch], add_special_tokens=False)):
                out[i] += e.ids
            start = end
        return out

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        return self.tokenizer.decode(_check_ids(ids, self.vocab_size), skip_special_tokens=True)

    def save(self, path: str | Path) -> Path:
        """Write the Hugging Face ``tokenizer.json`` atomically (to ``path`` when it ends in
        ``.json``, else into the folder ``path``). Returns the file written."""
        file = tokenizer_file(path)
        atomic_write_bytes(file, self.tokenizer.to_str(pretty=True).encode("utf-8"))
        return file

    def __repr__(self) -> str:
        model = type(self.tokenizer.model).__name__
        return f"BPETokenizer(model={model}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def _unk_id(tokenizer: Tokenizer) -> int | None:
    """The id of the token a Hugging Face tokenizer's model gives what its vocabulary lacks
    (BPE, WordPiece and WordLevel name it; Unigram numbers it), or ``None``."""
    name = getattr(tokenizer.model, "unk_token", None)
    if name:
        return tokenizer.token_to_id(name)
    if isinstance(tokenizer.model, models.Unigram):
        unk = json.loads(tokenizer.to_str()).get("model", {}).get("unk_id")
        return unk if isinstance(unk, int) else None
    return None


def _from_spec(spec: dict[str, Any], file: Path) -> LMTokenizer:
    kind = spec[_MARK]
    flags = {key: spec.get(key, True if key == "eos" else False) for key in ("eos", "unk")}
    bad = [key for key, value in flags.items() if not isinstance(value, bool)]
    if bad:
        raise InputError(f"could not read {file} as an attnlab tokenizer: {bad[0]!r} must be true or false; got "
                         f"{spec[bad[0]]!r}")
    if kind == "byte":
        return ByteTokenizer(eos=flags["eos"])
    if kind == "char":
        chars = spec.get("chars")
        if not isinstance(chars, list):
            raise InputError(f"could not read {file} as an attnlab char tokenizer: \"chars\" must be a list of "
                             f"characters; got {type(chars).__name__}")
        check_vocab_size(len(chars), f"the vocabulary of {file}")
        try:
            return CharTokenizer(chars, **flags, advice=RUN_ADVICE)
        except InputError as exc:
            raise InputError(f"could not read {file} as an attnlab char tokenizer: {exc}") from None
    raise InputError(f"could not read {file}: {_MARK} must be 'char' or 'byte'; got {kind!r}")


def load_tokenizer(path: str | Path) -> LMTokenizer:
    """The tokenizer that :meth:`LMTokenizer.save` wrote at ``path`` (a ``tokenizer.json``
    file, or a folder holding one), or any Hugging Face ``tokenizer.json``
    (a :class:`BPETokenizer`)."""
    file = tokenizer_file(path)
    if file.is_dir():
        raise InputError(f"path must be a tokenizer.json file or a folder holding one; {file} is a folder")
    if not file.exists():
        raise FileNotFoundError(f"path must be a tokenizer.json file or a folder holding one; {file} does not exist")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise InputError(f"could not read {file}: {exc.strerror or exc}") from None
    try:
        spec = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        spec = None  # parse_tokenizer says what is wrong
    if isinstance(spec, dict) and _MARK in spec:
        return _from_spec(spec, file)
    return BPETokenizer(parse_tokenizer(data, file))


def train_tokenizer(kind: str, texts: str | Sequence[str], *, vocab_size: int = 8192, min_frequency: int = 2,
                    eos: bool = True) -> LMTokenizer:
    """A tokenizer of ``kind`` for the training text ``texts``: ``"char"`` (its
    characters; ``eos``), ``"byte"`` (nothing learnt; ``eos``) or ``"bpe"`` (``vocab_size``,
    ``min_frequency``; always with ``<|endoftext|>``)."""
    if kind == "char":
        return CharTokenizer.train(texts, eos=eos, advice=RUN_ADVICE)
    if kind == "byte":
        return ByteTokenizer(eos=eos)
    if kind == "bpe":
        return BPETokenizer.train(texts, vocab_size, min_frequency=min_frequency)
    raise InputError(f"kind must be one of {', '.join(map(repr, LM_TOKENIZER_KINDS))}; got {kind!r}")
