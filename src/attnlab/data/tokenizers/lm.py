"""Tokenizers for language models, behind one small interface (:class:`LMTokenizer`)::

    tok = CharTokenizer.train(splits.train)          # or ByteTokenizer(), BPETokenizer.train(...)
    ids = tok.encode("Good morrow")                  # list[int]; tok.decode(ids) == "Good morrow"
    tok.vocab_size, tok.eos_id                        # eos_id: the end-of-document token, or None
    tok.save(run_dir)                                 # run_dir/tokenizer.json, written atomically
    tok = load_tokenizer(run_dir)                     # whichever kind it is

A language model must see its text exactly, so none of these normalizes anything (no
NFKC, no lower-casing, no stripping): ``decode(encode(text)) == text`` for every text a
tokenizer can encode. The end-of-document token is never produced by :meth:`encode`,
only put between documents by :class:`~attnlab.data.batches.lm.LMDataset`; :meth:`decode`
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

:class:`HFTokenizer` is a pretrained model's tokenizer, read from its Hugging Face folder with
what generation needs of it: prompts encoded as ``transformers``' tokenizer encodes them
(:meth:`~LMTokenizer.encode_prompt`: the post-processor's ``<s>``, special tokens written in the
prompt read as those tokens), the tokens that end a generation (:attr:`~LMTokenizer.stop_ids`,
from ``generation_config.json``) and the chat template (:meth:`~LMTokenizer.chat_prompt`).
:func:`load_run_tokenizer` reads whichever kind a run wrote.

``vocab_size`` of :meth:`BPETokenizer.train` is an upper bound: a text too small to give
that many merges gives a smaller vocabulary (with one warning saying so), and the
tokenizer's :attr:`~LMTokenizer.vocab_size` is what it has.

Bits per character: the number of characters that a set of tokens came from is the data
set's (:attr:`~attnlab.data.batches.lm.LMDataset.num_chars`), not the tokenizer's.
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

from ...errors import InputError
from ...io import atomic_write_bytes, read_json_mapping
from ...jsonfile import parse_json
from ...limits import CHAT_TEMPLATE_MAX_BYTES
from .chat import SPECIAL_TOKEN_NAMES, render_chat
from .text import check_texts, check_vocab_size, parse_tokenizer, tokenizer_file

__all__ = ["LM_TOKENIZER_KINDS", "LMTokenizer", "CharTokenizer", "ByteTokenizer", "BPETokenizer", "HFTokenizer",
           "load_tokenizer", "load_run_tokenizer", "train_tokenizer", "RUN_ADVICE"]

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

    def spelling(self, token_id: int) -> str | None:
        """Token ``token_id`` as its vocabulary spells it (``<bos>``, ``<|im_start|>``), or
        ``None`` where the vocabulary keeps no spelling: what shows a special token, which
        :meth:`decode` leaves out."""
        return None

    # What generation asks of a tokenizer: a pretrained model's (HFTokenizer) answers as its folder says.
    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The tokens that end a generation: the end-of-document token, when there is one."""
        return () if self.eos_id is None else (self.eos_id,)

    @property
    def chat_template(self) -> str | None:
        """The Jinja template that renders a conversation as a prompt (:meth:`chat_prompt`), or ``None``."""
        return None

    def encode_prompt(self, text: str, *, special_tokens: bool = True) -> list[int]:
        """The ids a model is prompted with: :meth:`encode`'s (a pretrained model's tokenizer
        also reads the special tokens written in ``text`` and adds its own, as its folder says)."""
        return self.encode(text)

    def decode_after(self, prefix: Sequence[int], ids: Sequence[int]) -> str:
        """The text that ``ids`` add after the ids ``prefix`` (a prompt): :meth:`decode` of ``ids``."""
        return self.decode(ids)

    def chat_prompt(self, messages: Sequence[dict[str, Any]]) -> str:
        """The conversation ``messages`` as the prompt of the assistant's reply (:mod:`attnlab.data.tokenizers.chat`)."""
        raise InputError(f"a {self.kind} tokenizer has no chat template: a conversation is rendered by the template "
                         f"of a pretrained model's tokenizer (HFTokenizer)")

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

    def spelling(self, token_id: int) -> str | None:
        return self.tokenizer.id_to_token(token_id)

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


TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
CHAT_TEMPLATE = "chat_template.jinja"


def _special_token(value: Any, file: Path, key: str) -> str | None:
    """A named special token of ``tokenizer_config.json``: text, or an ``AddedToken`` object's ``content``."""
    if value is None:
        return None
    token = value.get("content") if isinstance(value, dict) else value
    if not isinstance(token, str) or not token:
        raise InputError(f"{file}: {key} must be a token (its text, or an AddedToken object with a \"content\"); "
                         f"got {value!r}"[:300])
    return token


def _token_ids(data: dict[str, Any], key: str, file: Path, vocab_size: int) -> list[int] | None:
    """``data[key]``, a token id or a list of them (``generation_config.json``'s ``eos_token_id``),
    as a list of ids of the vocabulary; ``None`` when it is absent or null."""
    value = data.get(key)
    if value is None:
        return None
    ids = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise InputError(f"{file}: {key} must be a token id or a list of token ids; got {value!r}"[:300])
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise InputError(f"{file}: {key} {bad[0]} is not a token of the tokenizer (ids 0 to {vocab_size - 1})")
    return ids


def _read_optional(file: Path) -> dict[str, Any]:
    return read_json_mapping(file) if file.is_file() else {}


class HFTokenizer(BPETokenizer):
    """A pretrained model's tokenizer, read from its Hugging Face folder as ``transformers``
    reads it (``AutoTokenizer.from_pretrained(folder)``, a fast tokenizer), with what
    generation needs of the folder:

    * ``tokenizer.json``. A prompt (:meth:`encode_prompt`) gets the special tokens of its
      post-processor (a Llama tokenizer's ``<s>`` or ``<|begin_of_text|>`` first). As in
      transformers 5, ``add_bos_token`` and ``add_eos_token`` of ``tokenizer_config.json``
      do not change a tokenizer read from ``tokenizer.json`` (``from_pretrained`` drops them:
      they build the post-processor of a tokenizer made without one). Special tokens written
      in a prompt are those tokens, as transformers reads them; in training text
      (:meth:`encode`) they stay the text they are.
    * The named special tokens of ``tokenizer_config.json`` (or of the older
      ``special_tokens_map.json``), which a chat template reads as text. ``eos_token`` ends
      the documents a run trains on (:attr:`eos_id`; without it, the first
      ``eos_token_id`` of ``generation_config.json`` or ``config.json``, else one of the
      usual names).
    * :attr:`stop_ids`, the tokens a generation stops at, as ``model.generate`` stops:
      ``eos_token_id`` of ``generation_config.json`` (a token or a list of them), else of
      ``config.json``, else :attr:`eos_id`.
    * The chat template (:meth:`chat_prompt`): ``chat_template.jinja`` (transformers 5), else
      ``chat_template`` of ``tokenizer_config.json`` (its ``default``, when it holds several
      by name).

    :meth:`save` writes ``tokenizer.json`` and, beside it,
    a ``tokenizer_config.json`` and a ``generation_config.json`` that give the same special
    tokens, stop ids and chat template back: a run directory holds all of it, without the
    folder. Attribute ``folder``: where it was read from."""

    def __init__(self, tokenizer: Tokenizer, *, special: dict[str, str] | None = None, eos_id: int | None = None,
                 stop_ids: Sequence[int] = (), chat_template: str | dict[str, str] | None = None,
                 chat_source: str = "the chat template", folder: str | Path = ".") -> None:
        super().__init__(tokenizer)
        self.special = dict(special or {})
        self.eos_id = eos_id
        self._stop_ids = tuple(stop_ids)
        self._chat = chat_template
        self.chat_source = chat_source
        self.folder = Path(folder)
        self._prompts = Tokenizer.from_str(tokenizer.to_str())  # a copy that reads special tokens in a text
        self._prompts.no_truncation()
        self._prompts.no_padding()
        self._prompts.encode_special_tokens = False

    @classmethod
    def load(cls, path: str | Path) -> "HFTokenizer":
        """The tokenizer of the Hugging Face folder ``path`` (or of the folder of the
        ``tokenizer.json`` it names): see the class docstring for the files it reads. A file
        that is missing (``tokenizer.json``) or holds a value that cannot be read is an
        :class:`~attnlab.errors.InputError` naming the file and its key."""
        folder = Path(path).expanduser()
        if folder.suffix == ".json":
            folder = folder.parent
        file = folder / "tokenizer.json"
        if not file.is_file():
            raise InputError(f"{file} is missing: a pretrained model reads text with its own tokenizer; save the "
                             f"folder with it (tokenizer.save_pretrained(folder))")
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise InputError(f"could not read {file}: {exc.strerror or exc}") from None
        tokenizer = parse_tokenizer(data, file)
        config_file, legacy_file = folder / TOKENIZER_CONFIG, folder / "special_tokens_map.json"
        config, legacy = _read_optional(config_file), _read_optional(legacy_file)
        special = {}
        for name in SPECIAL_TOKEN_NAMES:
            where, value = (config_file, config[name]) if config.get(name) is not None else (legacy_file,
                                                                                            legacy.get(name))
            token = _special_token(value, where, name)
            if token is not None:
                special[name] = token
        ids = {}
        for name in ("bos_token", "eos_token"):
            if name in special:
                ids[name] = tokenizer.token_to_id(special[name])
                if ids[name] is None:
                    raise InputError(f"{config_file}: {name} {special[name]!r} is not a token of {file}")
        vocab = tokenizer.get_vocab_size(with_added_tokens=True)
        stops = None
        for source in (folder / GENERATION_CONFIG, folder / "config.json"):
            stops = _token_ids(_read_optional(source), "eos_token_id", source, vocab)
            if stops is not None:
                break
        eos = ids.get("eos_token", stops[0] if stops else None)
        if eos is None:
            eos = next((i for name in _EOS_NAMES if (i := tokenizer.token_to_id(name)) is not None), None)
        chat: str | dict[str, str] | None = None
        chat_source = f"{folder / CHAT_TEMPLATE}"
        if (folder / CHAT_TEMPLATE).is_file():
            size = (folder / CHAT_TEMPLATE).stat().st_size
            if size > CHAT_TEMPLATE_MAX_BYTES:
                raise InputError(f"{folder / CHAT_TEMPLATE} is {size:,} bytes, more than the {CHAT_TEMPLATE_MAX_BYTES:,} "
                                 f"attnlab reads as a chat template (attnlab.limits.CHAT_TEMPLATE_MAX_BYTES)")
            try:
                chat = (folder / CHAT_TEMPLATE).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise InputError(f"could not read {folder / CHAT_TEMPLATE} as UTF-8 text: {exc}") from None
        elif config.get("chat_template") is not None:
            chat, chat_source = config["chat_template"], f"the chat_template of {config_file}"
            if isinstance(chat, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                              and isinstance(t.get("template"), str) for t in chat):
                chat = {t["name"]: t["template"] for t in chat}  # several, by name (transformers' older form)
            elif not isinstance(chat, str):
                raise InputError(f"{config_file}: chat_template must be a Jinja template (text) or a list of "
                                 f"{{\"name\", \"template\"}} objects; got {type(chat).__name__}")
        return cls(tokenizer, special=special, eos_id=eos,
                   stop_ids=stops if stops is not None else [] if eos is None else [eos], chat_template=chat,
                   chat_source=chat_source, folder=folder)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return self._stop_ids

    @property
    def chat_template(self) -> str | None:
        if isinstance(self._chat, dict):
            if "default" not in self._chat:
                raise InputError(f"{self.chat_source} holds chat templates named {', '.join(sorted(self._chat))} "
                                 f"and none named 'default', the one a chat is rendered with")
            return self._chat["default"]
        return self._chat

    def encode_prompt(self, text: str, *, special_tokens: bool = True) -> list[int]:
        """The ids of ``text`` as ``transformers``' tokenizer gives them (``tokenizer(text)``):
        the special tokens written in it are those tokens, and with ``special_tokens`` the
        post-processor adds its own (the ``bos_token`` of a Llama tokenizer). A rendered chat
        (:meth:`chat_prompt`) holds its special tokens already: ``special_tokens=False``, as
        ``apply_chat_template`` tokenizes it."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str; got {type(text).__name__}")
        return self._prompts.encode(text, add_special_tokens=special_tokens).ids

    def decode_after(self, prefix: Sequence[int], ids: Sequence[int]) -> str:
        """The text ``ids`` add after ``prefix``, decoded together: a SentencePiece-style
        decoder drops the space before the first word of a text, so ``ids`` decoded alone
        would lose the space between a prompt and its continuation (transformers'
        ``TextStreamer`` does the same)."""
        prefix = list(prefix)
        head, whole = self.decode(prefix), self.decode(prefix + list(ids))
        return whole[len(head):] if whole.startswith(head) else self.decode(ids)

    def chat_prompt(self, messages: Sequence[dict[str, Any]]) -> str:
        """``messages`` rendered by the folder's chat template with the header of the
        assistant's reply at the end (``add_generation_prompt=True``), equal to
        ``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``;
        :meth:`encode_prompt` with ``special_tokens=False`` gives its ids."""
        template = self.chat_template
        if template is None:
            if self.folder.is_file():  # a GGUF file
                raise InputError(f"{self.folder} has no chat template to render a chat with (no tokenizer.chat_template "
                                 f"in its metadata)")
            raise InputError(f"{self.folder} has no chat template to render a chat with: neither "
                             f"{self.folder / CHAT_TEMPLATE} nor a chat_template in {self.folder / TOKENIZER_CONFIG}")
        return render_chat(template, messages, add_generation_prompt=True, special_tokens=self.special,
                           source=self.chat_source)

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json`` into the folder ``path``
        (or as ``path``, which must then be named ``tokenizer.json``), with a
        ``tokenizer_config.json`` (the special tokens, the chat template) and a
        ``generation_config.json`` (``eos_token_id``: :attr:`stop_ids`) beside it, each
        atomically, ``tokenizer.json`` last. Returns the ``tokenizer.json`` written;
        :meth:`load` of its folder reads the same tokenizer back."""
        file = tokenizer_file(path)
        if file.name != "tokenizer.json":
            raise InputError(f"path must be a folder or a file named tokenizer.json for {type(self).__name__}.save "
                             f"(its tokenizer_config.json goes beside it); got {file}")
        file.parent.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = dict(self.special)
        if isinstance(self._chat, dict):
            config["chat_template"] = [{"name": k, "template": v} for k, v in self._chat.items()]
        elif self._chat is not None:
            config["chat_template"] = self._chat
        atomic_write_bytes(file.parent / TOKENIZER_CONFIG, json.dumps(config, indent=1, ensure_ascii=False).encode())
        atomic_write_bytes(file.parent / GENERATION_CONFIG, json.dumps({"eos_token_id": list(self.stop_ids)}).encode())
        return super().save(file)

    def __repr__(self) -> str:
        return (f"HFTokenizer(folder={str(self.folder)!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id}, "
                f"stop_ids={list(self.stop_ids)}, chat_template={self._chat is not None})")


def load_run_tokenizer(run_dir: str | Path) -> LMTokenizer:
    """The tokenizer a language-model run wrote beside its weights: an :class:`HFTokenizer`
    when the run started from a pretrained model's folder (its ``tokenizer_config.json`` is
    there too), else whatever :func:`load_tokenizer` reads."""
    run_dir = Path(run_dir)
    if (run_dir / TOKENIZER_CONFIG).is_file():
        return HFTokenizer.load(run_dir)
    return load_tokenizer(run_dir / "tokenizer.json")


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
        spec = parse_json(data, str(file))
    except InputError:
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
