"""Subword tokenizers for text tasks: :class:`TextTokenizer`, a small wrapper around a
Hugging Face ``tokenizers.Tokenizer`` that trains, saves, loads, encodes to padded
tensors and decodes.

Special tokens of a tokenizer trained here, and their ids::

    [PAD]=0  [BOS]=1  [EOS]=2  [UNK]=3  [CLS]=4  [SEP]=5

``[PAD]``, ``[BOS]``, ``[EOS]`` are the defaults of attnlab's Transformer (``pad_id=0``,
``bos_id=1``, ``eos_id=2``). Classification wraps a text as ``[CLS] tokens [SEP]``
(``add_cls=True``); translation uses ``add_bos``/``add_eos`` (a source ``tokens [EOS]``,
a target ``[BOS] tokens [EOS]``). A joint source+target vocabulary is one tokenizer
trained on both lists; separate vocabularies are two tokenizers.

Kinds:

* ``"wordpiece"`` (BERT): NFKC, then BERT's normalizer (control characters dropped,
  CJK characters split, optional lower-casing, accents kept), split on whitespace and
  punctuation, ``##`` continuation pieces. A word holding a character never seen in
  training becomes ``[UNK]``.
* ``"bpe"``: byte-level BPE (GPT-2, RoBERTa): NFKC, optional lower-casing, GPT-2's split
  into words, numbers and punctuation; all 256 bytes are in the vocabulary, so every
  text encodes and decodes back, never to ``[UNK]``.

Masks: ``attention_mask`` follows Hugging Face, ``int64``, 1 = real token, 0 = padding.
attnlab's attention takes the opposite, a bool ``key_padding_mask`` that is ``True`` at
padding: :func:`key_padding_mask` converts.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from torch import Tensor

from ...errors import InputError, shape_str
from ...io import atomic_write_bytes, read_json_mapping
from ...jsonfile import parse_json

__all__ = ["SPECIAL_TOKENS", "TOKENIZER_KINDS", "TextTokenizer", "key_padding_mask", "printable", "shorten", "check_texts",
           "parse_tokenizer", "tokenizer_file", "MAX_VOCAB", "check_vocab_size"]

_LONG_TEXT = 1 << 16  # characters: a longer text is encoded on its own (see TextTokenizer._encode_pieces)

SPECIAL_TOKENS = ("[PAD]", "[BOS]", "[EOS]", "[UNK]", "[CLS]", "[SEP]")
TOKENIZER_KINDS = ("wordpiece", "bpe")
TOKENIZER_FILE = "tokenizer.json"

# The largest vocabulary a tokenizer may have: 4x the largest in use (~256k tokens). A model
# holds vocabulary x width twice (embedding, output layer) and its loss batch x length x
# vocabulary logits, so a file of 3 M words is a 3 GB loss tensor: refused before it is built.
MAX_VOCAB = 1 << 20

# role -> token names that play it in a loaded tokenizer.json (BERT's, then RoBERTa's spelling)
_ROLES = {
    "pad": ("[PAD]", "<pad>"),
    "bos": ("[BOS]", "<s>", "<bos>"),
    "eos": ("[EOS]", "</s>", "<eos>"),
    "unk": ("[UNK]", "<unk>"),
    "cls": ("[CLS]", "<s>", "<cls>"),
    "sep": ("[SEP]", "</s>", "<sep>"),
}


def key_padding_mask(attention_mask: Tensor) -> Tensor:
    """Hugging Face's ``attention_mask`` (1 = token) -> attnlab's bool ``key_padding_mask`` (True = padding)."""
    return attention_mask == 0


def check_texts(texts: str | Sequence[str]) -> list[str]:
    """``texts`` as a list of strings (one string: a list of it), or an error naming the first that is not one."""
    if isinstance(texts, str):
        return [texts]
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            # a short value as it is, a tensor or array by its shape: never a whole tensor in a message
            shown = f" {text!r:.60}" if isinstance(text, (int, float, bytes, type(None))) else \
                f" of shape {shape_str(text)}" if hasattr(text, "shape") else ""
            raise TypeError(f"texts[{i}] must be a str; got {type(text).__name__}{shown}")
    return texts


def _new_tokenizer(kind: str, lowercase: bool) -> Tokenizer:
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
        bert = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=lowercase
        )
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), bert, normalizers.Strip()])
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
    else:
        tok = Tokenizer(models.BPE())
        lower = [normalizers.Lowercase()] if lowercase else []
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), *lower, normalizers.Strip()])
        # a space before the first word too, so that a word is one token wherever it stands
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)])  # ... and not in the text
    return tok


def _first_id(tokenizer: Tokenizer, names: Sequence[str]) -> int | None:
    for name in names:
        if (i := tokenizer.token_to_id(name)) is not None:
            return i
    return None


def printable(text: str) -> str:
    """Control characters have no glyph in a font: show them escaped (``\\x03``)."""
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)


def shorten(text: str, n: int = 70) -> str:
    """``text`` on one line, printable, cut to ``n`` characters with an ellipsis."""
    text = printable(" ".join(text.split()))
    return text if len(text) <= n else text[: n - 1] + "…"


def _json_kind(value: object) -> str:
    kinds = {dict: "a JSON object", list: "a JSON array", str: "a JSON string", bool: "a JSON boolean",
             int: "a JSON number", float: "a JSON number", type(None): "JSON null"}
    return kinds.get(type(value), type(value).__name__)


def check_vocab_size(size: int, what: str) -> None:
    """Refuse a vocabulary above :data:`MAX_VOCAB`; ``what`` names it (``"vocab_size"``,
    ``"the vocabulary of FILE"``)."""
    if size > MAX_VOCAB:
        raise InputError(f"{what} must be at most {MAX_VOCAB:,} tokens (4x the largest vocabulary in use; a model's "
                         f"embedding, output layer and loss grow with it); got {size:,}")


def parse_tokenizer(data: bytes, file: Path) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` from the bytes of ``file``, or a ``ValueError`` naming
    the file and what is wrong with it."""
    bad = f"could not read {file} as a Hugging Face tokenizer.json"
    redo = "point at a tokenizer.json saved by attnlab (TextTokenizer.save) or by Hugging Face tokenizers"
    if not data.strip():
        raise InputError(f"{bad}: the file is empty ({'0 bytes' if not data else 'only white space'}); {redo}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{bad}: it is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); {redo}"
        ) from None
    text = text.removeprefix("\ufeff")
    try:
        spec = parse_json(text, "it")  # its size and depth bounded
    except InputError as exc:
        raise InputError(f"{bad}: {str(exc).removeprefix('it ')}; {redo}") from None
    if not isinstance(spec, dict):
        raise InputError(f"{bad}: it must hold a JSON object with a \"model\"; got {_json_kind(spec)}; {redo}")
    if "model" not in spec:
        raise InputError(f"{bad}: its JSON object has no \"model\" (keys: {', '.join(spec) or 'none'}); {redo}")
    if not isinstance(spec["model"], dict):
        raise InputError(f"{bad}: its \"model\" must be a JSON object; got {_json_kind(spec['model'])}; {redo}")
    vocab = spec["model"].get("vocab")
    if isinstance(vocab, (dict, list)):  # before the tokenizer is built from it
        check_vocab_size(len(vocab), f"the vocabulary of {file}")
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as exc:  # the Rust side raises a bare Exception for a field it does not expect
        raise InputError(f"{bad}: {exc}; {redo}") from None
    check_vocab_size(tokenizer.get_vocab_size(with_added_tokens=True), f"the vocabulary of {file}")
    return tokenizer


def _model_max_length(folder: Path) -> int | None:
    """``model_max_length`` of ``folder/tokenizer_config.json`` (Hugging Face's), when the file
    has a real one (not its "unlimited" placeholder of about 1e30)."""
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return None
    value = read_json_mapping(path).get("model_max_length")
    return int(value) if isinstance(value, (int, float)) and 1 < value < 1e9 else None


def tokenizer_file(path: str | Path) -> Path:
    """``path`` itself when it names a ``.json`` file, else the ``tokenizer.json`` inside it."""
    path = Path(path).expanduser()
    return path if path.suffix == ".json" else path / TOKENIZER_FILE


class TextTokenizer:
    """A ``tokenizers.Tokenizer`` with known special-token ids (see the module docstring).

    Make one with :meth:`train` or :meth:`load`, or wrap a ``tokenizers.Tokenizer``
    (its own truncation and padding settings are switched off: :meth:`encode` does both).

    Attributes: ``tokenizer`` (the wrapped one), ``kind`` (its model, lower-case:
    ``"wordpiece"``, ``"bpe"``, ...), ``vocab_size``, and ``pad_id``, ``bos_id``,
    ``eos_id``, ``unk_id``, ``cls_id``, ``sep_id`` (``None`` when the vocabulary lacks
    that token; only ``[PAD]`` is required).
    """

    def __init__(self, tokenizer: Tokenizer, source: str = "tokenizer", *, max_length: int | None = None) -> None:
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.tokenizer = tokenizer
        self.max_length = max_length  # the longest input its model reads (a checkpoint's model_max_length), if known
        self.kind = type(tokenizer.model).__name__.lower()
        ids = {role: _first_id(tokenizer, names) for role, names in _ROLES.items()}
        if ids["pad"] is None:
            raise InputError(
                f"{source} must have a padding token ({' or '.join(_ROLES['pad'])}) in its vocabulary; "
                f"it has none among its {tokenizer.get_vocab_size()} tokens"
            )
        self.pad_id: int = ids["pad"]
        self.bos_id, self.eos_id, self.unk_id = ids["bos"], ids["eos"], ids["unk"]
        self.cls_id, self.sep_id = ids["cls"], ids["sep"]

    # ------------------------------------------------------------------ make, save, load
    @classmethod
    def train(
        cls,
        texts: Sequence[str],
        kind: str = "wordpiece",
        vocab_size: int = 8000,
        *,
        lowercase: bool = False,
        min_frequency: int = 2,
    ) -> TextTokenizer:
        """Learn a vocabulary of at most ``vocab_size`` tokens from ``texts`` (a training split only).

        ``kind``: ``"wordpiece"`` or ``"bpe"`` (byte-level). ``min_frequency``: a merge
        (a new token) must occur at least this often. Special tokens get ids 0..5.
        """
        if kind not in TOKENIZER_KINDS:
            raise InputError(f"kind must be one of {', '.join(map(repr, TOKENIZER_KINDS))}; got {kind!r}")
        texts = check_texts(texts)
        if not any(t.strip() for t in texts):
            raise InputError(
                f"texts must hold at least one non-blank string to learn a vocabulary from; got {len(texts)} blank"
            )
        floor = len(SPECIAL_TOKENS) + (256 if kind == "bpe" else 1)
        if not isinstance(vocab_size, int) or vocab_size < floor:
            extra = " (256 bytes + 6 special tokens)" if kind == "bpe" else ""
            raise InputError(f"vocab_size must be an integer >= {floor} for kind={kind!r}{extra}; got {vocab_size!r}")
        check_vocab_size(vocab_size, "vocab_size")
        if not isinstance(min_frequency, int) or min_frequency < 0:
            raise InputError(f"min_frequency must be a non-negative integer; got {min_frequency!r}")
        tok = _new_tokenizer(kind, lowercase)
        common = dict(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS), show_progress=False
        )
        if kind == "wordpiece":
            trainer = trainers.WordPieceTrainer(continuing_subword_prefix="##", **common)
        else:
            trainer = trainers.BpeTrainer(initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), **common)
        tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
        return cls(tok)

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json`` atomically: to ``path`` when it ends in ``.json``, else
        into the folder ``path`` (created). Returns the file written."""
        file = tokenizer_file(path)
        atomic_write_bytes(file, self.tokenizer.to_str(pretty=True).encode("utf-8"))
        return file

    @classmethod
    def load(cls, path: str | Path) -> TextTokenizer:
        """Read a ``tokenizer.json`` (a file, or a folder holding one): one saved here, or
        any Hugging Face tokenizer file whose vocabulary has a padding token.

        A pretrained checkpoint's tokenizer (BERT's WordPiece, RoBERTa's byte-level BPE) is
        used as it is: its normalizer (lower-casing, accents), pre-tokenizer and vocabulary;
        :meth:`encode` with ``add_cls=True`` puts its ``[CLS]``/``<s>`` and ``[SEP]``/``</s>``
        around a text as the file's post-processor does for one sentence, so the ids equal
        ``transformers``' tokenizer's. ``model_max_length`` of a ``tokenizer_config.json``
        beside the file becomes :attr:`max_length`."""
        file = tokenizer_file(path)
        if file.is_dir():
            raise InputError(f"path must be a tokenizer.json file or a folder holding one; {file} is a folder")
        if not file.exists():
            raise FileNotFoundError(
                f"path must be a tokenizer.json file or a folder holding one; {file} does not exist"
            )
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise InputError(f"could not read {file}: {exc.strerror or exc}") from None
        return cls(parse_tokenizer(data, file), source=str(file), max_length=_model_max_length(file.parent))

    # ------------------------------------------------------------------ encode
    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def normalize(self, text: str) -> str:
        """``text`` as the tokenizer sees it (NFKC, lower-casing if trained so, stripped)."""
        normalizer = self.tokenizer.normalizer
        return normalizer.normalize_str(text) if normalizer is not None else text

    def _specials(self, add_cls: bool, add_bos: bool, add_eos: bool) -> tuple[list[int], list[int]]:
        if add_cls and (add_bos or add_eos):
            raise InputError(
                "add_cls must be False when add_bos or add_eos is True: a text is [CLS] ... [SEP] or [BOS] ... [EOS]"
            )
        wanted = [("add_cls", add_cls, ("cls", "sep")), ("add_bos", add_bos, ("bos",)), ("add_eos", add_eos, ("eos",))]
        for flag, on, roles in wanted:
            missing = [_ROLES[r][0] for r in roles if getattr(self, f"{r}_id") is None]
            if on and missing:
                raise InputError(
                    f"{flag}=True needs {' and '.join(missing)} in the vocabulary; this tokenizer has no such token"
                )
        prefix = [self.cls_id] if add_cls else [self.bos_id] if add_bos else []
        suffix = [self.sep_id] if add_cls else [self.eos_id] if add_eos else []
        return prefix, suffix

    def tokenize(
        self,
        texts: str | Sequence[str],
        max_length: int | None = None,
        *,
        truncation: bool = True,
        add_cls: bool = True,
        add_bos: bool = False,
        add_eos: bool = False,
        length_hint: str | None = None,
    ) -> list[list[int]]:
        """Token ids of each text, special tokens included, unpadded.

        With ``max_length`` and ``truncation``, a text longer than ``max_length`` tokens
        (special tokens included) keeps its first tokens and its special tokens, and one
        ``UserWarning`` per call says how many texts were cut, and what to do about it:
        ``length_hint`` (a caller that reads ``max_length`` from a recipe names its key),
        else "pass max_length=N or more". With ``truncation=False`` a
        text too long raises ``ValueError``. Empty and blank texts give the special tokens alone.
        """
        ids, cut = self._tokenize(texts, max_length, truncation, add_cls, add_bos, add_eos)
        if cut:
            limit, hint = (f"{max_length}", length_hint) if length_hint else (
                f"max_length={max_length}", f"pass max_length={max(cut)} or more to keep them whole")
            warnings.warn(
                f"{len(cut):,} of {len(ids):,} texts were longer than {limit} tokens and were truncated (the "
                f"longest had {max(cut)}); {hint}",
                stacklevel=2,
            )
        return ids

    def _tokenize(
        self,
        texts: str | Sequence[str],
        max_length: int | None,
        truncation: bool,
        add_cls: bool,
        add_bos: bool,
        add_eos: bool,
    ) -> tuple[list[list[int]], list[int]]:
        """:meth:`tokenize` without its warning: the ids, and the whole length (special
        tokens included) of each text that was truncated, for the caller's own warning."""
        texts = check_texts(texts)
        prefix, suffix = self._specials(add_cls, add_bos, add_eos)
        n_special = len(prefix) + len(suffix)
        if max_length is not None and (not isinstance(max_length, int) or max_length <= n_special):
            raise InputError(
                f"max_length must be an integer > {n_special} (room for {n_special} special tokens and one more); "
                f"got {max_length!r}"
            )
        pieces = self._encode_pieces(texts)
        cut: list[int] = []
        if max_length is not None:
            budget = max_length - n_special
            cut = [len(p) + n_special for p in pieces if len(p) > budget]
            if cut and not truncation:
                raise InputError(
                    f"{len(cut)} of {len(texts)} texts are longer than max_length={max_length} tokens (the longest: "
                    f"{max(cut)}); pass truncation=True or a larger max_length"
                )
            if cut:
                pieces = [p[:budget] for p in pieces]
        return [prefix + p + suffix for p in pieces], cut

    def _encode_pieces(self, texts: list[str]) -> list[list[int]]:
        """The ids of each text, without special tokens. Texts longer than :data:`_LONG_TEXT`
        characters are encoded one at a time: the tokenizer holds ~100 bytes per character
        of a batch at once (a batch of 64 texts of a million characters: several GB)."""
        encode_batch = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)  # fast: no offsets
        long = {i for i, t in enumerate(texts) if len(t) > _LONG_TEXT}
        if not long:
            return [e.ids for e in encode_batch(texts, add_special_tokens=False)]
        short = iter(encode_batch([t for i, t in enumerate(texts) if i not in long], add_special_tokens=False))
        return [self.tokenizer.encode(t, add_special_tokens=False).ids if i in long else next(short).ids
                for i, t in enumerate(texts)]

    def pad(self, sequences: Sequence[Sequence[int]], length: int | None = None) -> dict[str, Tensor]:
        """Right-pad id lists with ``pad_id``: ``input_ids`` and ``attention_mask``, ``int64``
        ``(B, L)``; ``L`` is ``length``, else the longest sequence (at least 1)."""
        lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
        longest = int(lengths.max(initial=0))
        if length is None:
            length = max(longest, 1)
        elif longest > length:
            raise InputError(f"length must be >= the longest sequence ({longest} ids); got {length}")
        flat = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int64, count=int(lengths.sum()))
        mask = np.arange(length) < lengths[:, None]
        ids = np.full((len(sequences), length), self.pad_id, dtype=np.int64)
        ids[mask] = flat  # row-major: row i gets its own ids, in order
        return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask.astype(np.int64))}

    def encode(
        self,
        texts: str | Sequence[str],
        max_length: int | None = None,
        padding: bool | str = True,
        truncation: bool = True,
        *,
        add_cls: bool = True,
        add_bos: bool = False,
        add_eos: bool = False,
        length_hint: str | None = None,
    ) -> dict[str, Tensor]:
        """``B`` texts (or one str) -> ``{"input_ids": (B, L), "attention_mask": (B, L)}``, both ``int64``.

        ``padding``: ``True`` (or ``"longest"``): ``L`` is the longest encoded text of the
        batch; ``"max_length"``: ``L = max_length``. ``attention_mask`` is 1 at tokens and
        0 at padding (:func:`key_padding_mask` gives attnlab's mask). Truncation, empty
        texts, special tokens and ``length_hint``: see :meth:`tokenize`.
        """
        if padding is not True and padding not in ("longest", "max_length"):
            raise InputError(f"padding must be True, 'longest' or 'max_length'; got {padding!r}")
        if padding == "max_length" and max_length is None:
            raise InputError("max_length must be given when padding='max_length'; got None")
        ids = self.tokenize(texts, max_length, truncation=truncation, add_cls=add_cls, add_bos=add_bos, add_eos=add_eos,
                            length_hint=length_hint)
        return self.pad(ids, max_length if padding == "max_length" else None)

    # ------------------------------------------------------------------ decode
    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """One id sequence ``(L,)`` -> text, special tokens (padding included) dropped and
        subwords joined (``##`` pieces, or bytes for byte-level BPE)."""
        if isinstance(ids, Tensor):
            if ids.dim() != 1:
                raise InputError(
                    f"ids must be one sequence (L,); got shape {tuple(ids.shape)} (use decode_batch for (B, L))"
                )
            ids = ids.tolist()
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise InputError(f"ids must lie in [0, {self.vocab_size}) (the vocabulary size); got {bad[:5]}")
        specials = {self.pad_id, self.bos_id, self.eos_id, self.cls_id, self.sep_id}
        return self.tokenizer.decode([i for i in ids if i not in specials], skip_special_tokens=True)

    def decode_batch(self, ids: Sequence[Sequence[int]] | Tensor) -> list[str]:
        """``(B, L)`` ids -> ``B`` texts, as :meth:`decode`."""
        if isinstance(ids, Tensor) and ids.dim() != 2:
            raise InputError(f"ids must be a batch (B, L); got shape {tuple(ids.shape)}")
        return [self.decode(row) for row in ids]

    def readable_tokens(self, ids: Sequence[int] | Tensor) -> list[str]:
        """Readable strings for token ids, for pictures and tables: WordPiece pieces as
        stored (``##ing``); byte-level BPE pieces decoded one by one (``Ġmann`` ->
        ``mann``, ``Ã¼`` -> ``ü``), whitespace alone as ``▁``."""
        out = []
        for i in (ids.tolist() if isinstance(ids, Tensor) else ids):
            piece = self.tokenizer.id_to_token(int(i)) or f"<{int(i)}>"
            if self.kind == "bpe":  # whitespace alone decodes to nothing: keep its byte-level mark
                piece = self.tokenizer.decode([int(i)], skip_special_tokens=False).strip() or piece.replace("Ġ", "▁")
            out.append(printable(piece))  # a byte-level piece may be a control character
        return out

    def __repr__(self) -> str:
        return (
            f"TextTokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, pad_id={self.pad_id}, "
            f"bos_id={self.bos_id}, eos_id={self.eos_id}, unk_id={self.unk_id}, "
            f"cls_id={self.cls_id}, sep_id={self.sep_id})"
        )
