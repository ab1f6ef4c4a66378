"""A GGUF file's tokenizer (its ``tokenizer.ggml.*`` metadata) as a ``tokenizers.Tokenizer``,
wrapped as the :class:`~attnlab.data.tokenizers.lm.HFTokenizer` a folder's ``tokenizer.json``
gives: special tokens, stop ids and the chat template (``tokenizer.chat_template``).

Two vocabularies are read, as llama.cpp reads them:

* ``gpt2``: byte-level BPE. The vocabulary and merges are the file's; the text is split
  before merging by the regular expressions llama.cpp applies for ``tokenizer.ggml.pre``
  (:data:`PRE_SPLITS`; each splits the pieces of the one before, keeping what it does not
  match as pieces of their own).
* ``llama``: SentencePiece-style BPE over pieces that start words with ``▁``, falling back to
  the bytes' tokens (``<0x41>``) for what the vocabulary lacks. The file stores each piece's
  score, not the merges: a merge of two pieces into a third ranks by the third's score
  (Gemma's by its position in the vocabulary, which is its merge order).

Token types (``tokenizer.ggml.token_type``): 3 (control, ``<|im_end|>``) become special
tokens, 4 (user-defined, ``<think>``) added tokens matched whole. The metadata's values are
typed by their schema (:mod:`attnlab.formats.gguf.metadata`) when the file is opened.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import InputError

__all__ = ["gguf_tokenizer", "PRE_SPLITS"]

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> the expressions llama.cpp splits a byte-level vocabulary's text with
# (llama-vocab.cpp), in order.
PRE_SPLITS: dict[str, tuple[str, ...]] = {
    "default": (_GPT2,), "gpt-2": (_GPT2,), "gpt2": (_GPT2,), "mpt": (_GPT2,), "olmo": (_GPT2,),
    "smollm": (r"\p{N}", _GPT2), "starcoder": (r"\p{N}", _GPT2), "refact": (r"\p{N}", _GPT2),
    "codeshell": (r"\p{N}", _GPT2), "command-r": (r"\p{N}", _GPT2),
    "llama3": (_LLAMA3,), "llama-v3": (_LLAMA3,), "llama-bpe": (_LLAMA3,), "smaug-bpe": (_LLAMA3,),
    "dbrx": (_LLAMA3,), "falcon3": (_LLAMA3,), "pixtral": (_LLAMA3,),
    "qwen2": (_QWEN2,), "stablelm2": (_QWEN2,), "deepseek-r1-qwen": (_QWEN2,), "megrez": (_QWEN2,),
}

# Control tokens that end a turn, as llama.cpp finds them by their text when no eot id is given.
_TURN_ENDS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>", "<|end_of_text|>")
_CONTROL, _USER_DEFINED = 3, 4


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of each byte in a byte-level vocabulary."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelled, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in spelled:
            spelled[b] = chr(256 + extra)
            extra += 1
    return spelled


_EDGE = 8  # the characters at each end of a token that its signature holds


def _merges_from_scores(tokens: list[str], scores: dict[str, float]) -> list[tuple[str, str]]:
    """The merges a SentencePiece vocabulary implies: each piece that two pieces of the
    vocabulary join to, ranked by the joined piece's score (the higher first; ties: the longer
    left part, then the longer right one, then the vocabulary's order), as ``transformers``
    derives them for its GGUF tokenizers.

    A piece of ``n`` characters has ``n - 1`` places to split it, each a comparison of ``n``
    characters: tried all, a hostile vocabulary of a few long pieces costs hours. A place is tried
    only where both parts have the length of some piece, and the signature of some piece of that
    length (its first and last characters), which takes a few characters to read; so the time
    grows with the vocabulary's bytes and the merges it really holds. Each merge holds the
    vocabulary's own strings."""
    ids = {t: i for i, t in enumerate(tokens)}
    lengths = sorted({len(t) for t in ids})
    signatures = {(len(t), t[:_EDGE], t[-_EDGE:]) for t in ids}
    merges: list[tuple[float, int, int, str, str]] = []
    for piece in scores:  # the vocabulary's order, a repeated piece once
        n, local = len(piece), []
        for k in lengths:
            if k >= n:
                break
            if (k, piece[:min(k, _EDGE)], piece[max(0, k - _EDGE):k]) not in signatures or \
                    (n - k, piece[k:k + _EDGE], piece[max(k, n - _EDGE):]) not in signatures:
                continue
            left, right = ids.get(piece[:k]), ids.get(piece[k:])
            if left is not None and right is not None:
                local.append((left, right))
        local.sort()
        score = scores[piece]
        merges.extend((score, n - len(tokens[r]), len(tokens[r]), tokens[l], tokens[r]) for l, r in local)
    merges.sort(key=lambda m: (m[0], m[1], m[2]), reverse=True)  # stable: equal keys keep their order
    return [(m[3], m[4]) for m in merges]


def _token_list(meta: dict[str, Any], key: str, path: Any, n: int, kind: type) -> list[Any] | None:
    value = meta.get(key)
    if value is None:
        return None
    if len(value) != n:
        raise InputError(f"{path}: metadata {key} has {len(value):,} entries but tokenizer.ggml.tokens has {n:,}")
    return list(value) if kind is str else np.asarray(value).tolist()


def _token_id(meta: dict[str, Any], key: str, path: Any, n: int) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if value >= n:
        raise InputError(f"{path}: metadata {key} must be a token id below {n:,} (the vocabulary's size); got {value!r}")
    return value


def gguf_tokenizer(meta: dict[str, Any], path: Any, architecture: str) -> Any:
    """The :class:`~attnlab.data.tokenizers.lm.HFTokenizer` of a GGUF file's metadata ``meta``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    from ...data.tokenizers.lm import HFTokenizer

    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise InputError(f"{path}: metadata tokenizer.ggml.tokens is missing or empty: the file has no vocabulary, "
                         f"and a language model reads text with its own")
    n = len(tokens)
    types = _token_list(meta, "tokenizer.ggml.token_type", path, n, int) or [1] * n
    if meta.get("tokenizer.ggml.remove_extra_whitespaces"):
        raise InputError(f"{path}: metadata tokenizer.ggml.remove_extra_whitespaces true is not supported (a "
                         f"normalizer of SentencePiece's that attnlab does not build)")
    spm = kind == "llama"
    if kind == "gpt2":
        spelled = _byte_alphabet()
        alphabet = set(spelled.values())
        vocab_tokens = [t if set(t) <= alphabet else "".join(spelled[b] for b in t.encode("utf-8")) for t in tokens]
        merges_raw = meta.get("tokenizer.ggml.merges")
        if merges_raw is None:
            raise InputError(f"{path}: metadata tokenizer.ggml.merges is missing: a gpt2 (byte-level BPE) vocabulary "
                             f"needs its merges")
        merges = []
        for m in merges_raw:
            left, sep, right = m.partition(" ")
            if not sep:
                raise InputError(f"{path}: metadata tokenizer.ggml.merges holds {m!r}; each merge is two tokens and a "
                                 f"space between")
            merges.append((left, right))
        vocab = {t: i for i, t in enumerate(vocab_tokens)}  # a repeated token: its last id, as llama.cpp
        model = models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False, ignore_merges=False)
        tok = Tokenizer(model)
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_SPLITS:
            raise InputError(f"{path}: metadata tokenizer.ggml.pre {pre!r} is not supported; attnlab splits text as "
                             f"llama.cpp does for {', '.join(PRE_SPLITS)}")
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [*(pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_SPLITS[pre]),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        special_ok = lambda t: set(t) <= alphabet  # noqa: E731  # llama.cpp mislabels some; transformers skips them
    elif spm:
        scores_list = _token_list(meta, "tokenizer.ggml.scores", path, n, float)
        gemma = architecture.startswith("gemma")
        if gemma:  # pieces of spaces alone are stored as spaces; their merge order is the vocabulary's
            tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
            scores = {t: -float(i) for i, t in enumerate(tokens)}
        elif scores_list is None:
            raise InputError(f"{path}: metadata tokenizer.ggml.scores is missing: a llama (SentencePiece) "
                             f"vocabulary ranks its merges by them")
        else:
            scores = dict(zip(tokens, scores_list))
        vocab = {t: i for i, t in enumerate(tokens)}
        unk = _token_id(meta, "tokenizer.ggml.unknown_token_id", path, n)
        model = models.BPE(vocab, _merges_from_scores(tokens, scores), unk_token=tokens[unk] if unk is not None
                           else None, fuse_unk=True, byte_fallback=True)
        tok = Tokenizer(model)
        prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        if gemma or architecture == "phi3":  # the normalizer writes the spaces as ▁ (Phi-3: and one first)
            tok.normalizer = normalizers.Sequence([*([normalizers.Prepend("▁")] if architecture == "phi3" else []),
                                                   normalizers.Replace(" ", "▁")])
        else:
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first" if prefix else "never",
                                                         split=False)
        if prefix and not gemma:
            steps.append(decoders.Strip(" ", 1, 0))
        tok.decoder = decoders.Sequence(steps)
        special_ok = lambda t: True  # noqa: E731
    else:
        raise InputError(f"{path}: metadata tokenizer.ggml.model {kind!r} is not supported; attnlab reads gpt2 "
                         f"(byte-level BPE) and llama (SentencePiece-style) vocabularies")
    control = [t for t, k in zip(tokens, types) if k == _CONTROL and special_ok(t)]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    vocab_now = tok.get_vocab()
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types)
                    if k == _USER_DEFINED and t in vocab_now])
    bos = _token_id(meta, "tokenizer.ggml.bos_token_id", path, n)
    eos = _token_id(meta, "tokenizer.ggml.eos_token_id", path, n)
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", spm)) and bos is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        first = [tokens[bos]] if add_bos else []
        last = [tokens[eos]] if add_eos else []
        tok.post_processor = processors.TemplateProcessing(
            single=" ".join([*first, "$A", *last]), pair=" ".join([*first, "$A", *last, "$B"]),
            special_tokens=[(tokens[i], i) for i in {*(b for b in [bos] if add_bos), *(e for e in [eos] if add_eos)}])
    special = {name: tokens[i] for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                                                  ("pad_token", "padding"))
               if (i := _token_id(meta, f"tokenizer.ggml.{key}_token_id", path, n)) is not None}
    stops = [i for i in (eos, _token_id(meta, "tokenizer.ggml.eot_token_id", path, n),
                         _token_id(meta, "tokenizer.ggml.eom_token_id", path, n)) if i is not None]
    stops += [i for i, (t, k) in enumerate(zip(tokens, types)) if k == _CONTROL and t in _TURN_ENDS and i not in stops]
    chat = meta.get("tokenizer.chat_template")
    named = {name[len("tokenizer.chat_template."):]: t for name, t in meta.items()
             if name.startswith("tokenizer.chat_template.")}
    template: str | dict[str, str] | None = {"default": chat, **named} if named and chat is not None else chat
    return HFTokenizer(tok, special=special, eos_id=eos, stop_ids=stops, chat_template=template,
                       chat_source=f"the tokenizer.chat_template of {path}", folder=path)
