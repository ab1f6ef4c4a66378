"""Language modelling: a decoder-only model learns to predict the next token of a text
corpus (``data.name``: the built-in ``tinyshakespeare``, one's own ``text``, or a source
one registers; see :mod:`attnlab.data.text_corpus` and :mod:`attnlab.data.text_documents`).

The tokenizer (``text.tokenizer``: characters, bytes or a byte-level BPE) is trained on the
training part alone and kept as ``tokenizer.json`` beside the weights. The documents of
each part are packed into windows of ``text.context`` tokens with a document mask (no token
attends across a document boundary). The validation part picks ``checkpoints/best``; the
test part is evaluated once, at the end:

* ``test_loss``: cross-entropy in nats per token, ``test_perplexity`` its exponential;
* ``test_bits_per_char``: the same information per character of the text, which compares
  models with different tokenizers;
* ``val_loss`` and ``val_bits_per_char`` with the tested weights.

A run also writes a few samples (``samples.txt``) from the ``generate`` section's prompts.
``attnlab predict RUN "prompt"`` continues prompts; ``run.predict([...], max_new_tokens=...,
temperature=..., top_k=..., top_p=..., seed=...)`` in Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Optional, Sequence

import torch
from torch import nn

from ..attention.capture import capture_attention
from ..data.lm_dataset import LMDataset
from ..data.lm_tokenize import LMTokenizer, load_tokenizer, train_tokenizer
from ..data.source import Splits, source_of
from ..data.text_corpus import CorpusSourceConfig
from ..data.tokenize import MAX_VOCAB, shorten
from ..engine import distributed
from ..engine.config import ConfigError
from ..engine.trainer import evaluate_model
from ..errors import InputError
from ..io import atomic_write_bytes
from ..models.sampling import GENERATION_OPTIONS, check_generation
from .base import ModelConfig, Prepared, Preprocessing, Recipe, Task, TrainedRun, check_texts, register_task
from .run_files import train_config
from .views import SampleTable, TextAttention, TextPrediction

__all__ = ["LMTextConfig", "SampleConfig", "LanguageModelingRecipe", "LanguageModeling", "lm_figures"]

TOKENIZER = "tokenizer.json"
SAMPLES = "samples.txt"


@dataclass
class LMTextConfig:
    """Tokenization and context of a language model."""

    tokenizer: Literal["char", "byte", "bpe"] = "char"
    vocab_size: int = field(default=8192, metadata={"min": 260, "max": MAX_VOCAB})  # bpe: the vocabulary to learn
    min_frequency: int = field(default=2, metadata={"min": 1})  # bpe: of a merge
    context: int = field(default=256, metadata={"min": 2})  # tokens a model reads at once
    tokenizer_file: Optional[str] = None  # a tokenizer.json to use instead of training one
    # tokenizer_file: the largest share of the training text's tokens it may map to its unknown token (a tokenizer
    # made for other text); a larger share is refused before training, one above the default is said in the log
    max_unknown: float = field(default=0.01, metadata={"min": 0.0, "max": 1.0})


@dataclass
class SampleConfig:
    """The samples a finished run writes (and the defaults of ``predict``)."""

    prompts: list = field(default_factory=lambda: ["\n"])
    max_new_tokens: int = field(default=200, metadata={"min": 0})
    temperature: float = field(default=0.8, metadata={"min": 0.0})  # 0: greedy
    top_k: Optional[int] = field(default=None, metadata={"min": 0})  # 0 or null: no limit
    top_p: Optional[float] = field(default=None, metadata={"gt": 0.0, "max": 1.0})
    min_p: Optional[float] = field(default=None, metadata={"min": 0.0, "max": 1.0})  # of the likeliest's probability
    repetition_penalty: float = field(default=1.0, metadata={"gt": 0.0})  # above 1: repeats less likely; 1: none
    seed: int = field(default=0, metadata={"min": 0, "max": 2**64 - 1})
    stop: list = field(default_factory=list)  # texts that end a continuation (left out of it)

    def __post_init__(self) -> None:
        if not isinstance(self.prompts, list) or not self.prompts or \
                not all(isinstance(p, str) and p for p in self.prompts):
            raise InputError(f"generate.prompts must be a list of non-empty texts; got {self.prompts!r}")
        check_generation(names=lambda key: f"generate.{key}", **self.options())

    def options(self) -> dict[str, Any]:
        """The sampling options, as :meth:`GPT.stream` takes them (and ``stop``)."""
        return {key: getattr(self, key) for key in GENERATION_OPTIONS}


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``(text up to its first stop string, whether one was found)``."""
    ends = [i for i in (text.find(t) for t in stops) if i >= 0]
    return (text[: min(ends)], True) if ends else (text, False)


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of ``text`` could begin a stop string (and so wait for
    the next token before they are shown)."""
    return max((k for t in stops for k in range(min(len(t) - 1, len(text)), 0, -1) if text.endswith(t[:k])),
               default=0)


@dataclass
class LanguageModelingRecipe(Recipe):
    task: str = "language_modeling"
    data: CorpusSourceConfig = field(default_factory=CorpusSourceConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig("gpt_tiny"))
    text: LMTextConfig = field(default_factory=LMTextConfig)
    generate: SampleConfig = field(default_factory=SampleConfig)


def lm_figures(loss: float, data: LMDataset, prefix: str) -> dict[str, float]:
    """Loss in nats per token, perplexity and bits per character of ``data``."""
    return {f"{prefix}_loss": loss, f"{prefix}_perplexity": math.exp(min(loss, 700.0)),
            f"{prefix}_bits_per_char": data.bits_per_char(loss)}


def _shown_prompt(prompt: str) -> str:
    """A prompt as a message shows it: its repr (a newline stays visible), cut."""
    text = repr(prompt)
    return text if len(text) <= 72 else text[:70] + "…" + text[0]


def _encode_prompt(tokenizer: LMTokenizer, prompt: str, key: str = "prompt") -> list[int]:
    try:
        ids = tokenizer.encode(prompt)
    except InputError as exc:
        raise InputError(f"{key} {_shown_prompt(prompt)}: {exc}") from None
    if not ids:
        raise InputError(f"{key} must give at least one token; {_shown_prompt(prompt)} gives none with the run's "
                         f"tokenizer")
    return ids


def unknown_share(data: LMDataset, tokenizer: LMTokenizer) -> float:
    """The share of ``data``'s tokens that are ``tokenizer``'s unknown token (0 without one)."""
    if tokenizer.unk_id is None or data.num_tokens == 0:
        return 0.0
    return int((data.tokens == tokenizer.unk_id).sum()) / data.num_tokens


@register_task
class LanguageModeling(Task):
    name = "language_modeling"
    recipe_class = LanguageModelingRecipe
    summary = "predict the next token of a text: Tiny Shakespeare or text of one's own; loss, perplexity, bits/char"
    inputs = "texts"
    outputs = "text"
    sample_unit = "windows"
    fixed_on_resume = ("task", "model", "text", "train.optimizer")

    def model_options(self, recipe: Recipe, info: LMTokenizer | None = None) -> dict[str, Any]:
        """``vocab_size`` of the tokenizer (``None``, for checking a recipe: BPE's asked size, or
        a byte's 257 and a placeholder for characters) and ``max_len``, the context."""
        text = recipe.text
        if info is not None:
            vocab = info.vocab_size
        else:
            vocab = {"bpe": text.vocab_size, "byte": 257}.get(text.tokenizer, 256)
        return {"vocab_size": vocab, "max_len": text.context}

    def describe(self, recipe: Recipe) -> str:
        return (f"{source_of(recipe.data).describe(recipe.data)}, {recipe.text.tokenizer} tokens, context "
                f"{recipe.text.context}")

    def check(self, recipe: Recipe) -> None:
        """Also: a model with absolute positions (learned or sinusoidal) cannot continue a
        prompt past its context, so the samples a finished run writes must fit in it; said
        before training, not after it."""
        super().check(recipe)
        if not recipe.model.name or recipe.model.checkpoint is not None:
            return
        with torch.device("meta"):
            cfg = getattr(self.build_model(recipe), "config", None)
        pos, max_len = getattr(cfg, "pos_embed", None), getattr(cfg, "max_len", None)
        if pos not in ("learned", "sinusoidal") or not isinstance(max_len, int):
            return
        sample = recipe.generate
        prompt = max(len(p.encode()) if recipe.text.tokenizer == "byte" else len(p) if recipe.text.tokenizer == "char"
                     else 1 for p in sample.prompts)  # its tokens (BPE: at least one)
        if prompt + sample.max_new_tokens > max_len:
            raise ConfigError(f"generate.max_new_tokens must leave the prompts room in the context: a model with "
                              f"pos_embed={pos!r} holds text.context={max_len} positions, and the longest of "
                              f"generate.prompts takes {prompt}; got generate.max_new_tokens={sample.max_new_tokens} "
                              f"(at most {max(max_len - prompt, 0)}, or use pos_embed rope or alibi, which have no "
                              f"such limit)")

    def metric_rows(self, metrics: dict[str, Any]) -> list[tuple[str, str]]:
        rows = []
        for split in ("val", "test"):
            if f"{split}_loss" in metrics:
                rows.append((f"{split} loss (nats/token)", f"{metrics[f'{split}_loss']:.4f}"))
            if f"{split}_bits_per_char" in metrics:
                rows.append((f"{split} bits/char", f"{metrics[f'{split}_bits_per_char']:.4f}"))
        if "test_perplexity" in metrics:
            rows.append(("test perplexity", f"{metrics['test_perplexity']:.2f}"))
        return rows

    # ------------------------------------------------------------------ training
    def prepare(self, recipe: Recipe, run_dir: Path, data: Splits, log: Callable[[str], None]) -> Prepared:
        path = run_dir / TOKENIZER
        if path.is_file():  # a resumed run: its weights belong to this vocabulary
            tokenizer = load_tokenizer(path)
        else:
            t = recipe.text
            tokenizer = load_tokenizer(t.tokenizer_file) if t.tokenizer_file else train_tokenizer(
                t.tokenizer, data.train, vocab_size=t.vocab_size, min_frequency=t.min_frequency)
            if distributed.is_main():
                tokenizer.save(path)
        n = recipe.text.context
        train, test = LMDataset(data.train, tokenizer, n), LMDataset(data.test, tokenizer, n)
        val = None if data.val is None else LMDataset(data.val, tokenizer, n)  # a source may give none (text: data.val_size=0)
        self._check_tokenizer(recipe, tokenizer, train, log)
        log(f"data: {train.num_tokens:,} training, {val.num_tokens if val else 0:,} validation, {test.num_tokens:,} "
            f"test tokens ({tokenizer.vocab_size} in the vocabulary), windows of {n}")
        return Prepared(train, val, test, tokenizer, facts={
            "vocab_size": tokenizer.vocab_size, "context": n, "train_tokens": train.num_tokens,
            "val_tokens": val.num_tokens if val else 0, "test_tokens": test.num_tokens, "test_chars": test.num_chars,
            "metric": "token accuracy (next token)"})

    @staticmethod
    def _check_tokenizer(recipe: Recipe, tokenizer: LMTokenizer, train: LMDataset, log: Callable[[str], None]) -> None:
        """What the run needs of its tokenizer, said before training: the ``generate``
        section's prompts encode with it (the samples are written after training), and a
        given ``text.tokenizer_file`` reads the training text as more than unknown tokens."""
        t = recipe.text
        share = unknown_share(train, tokenizer)
        if share > t.max_unknown:
            source = f"text.tokenizer_file={t.tokenizer_file}" if t.tokenizer_file else "the run's tokenizer"
            raise ConfigError(f"{source} maps {100 * share:.2f}% of the training text's {train.num_tokens:,} tokens "
                              f"to its unknown token (at most text.max_unknown={t.max_unknown:g}): it was made for "
                              f"other text; leave text.tokenizer_file out to learn one from this text, or raise "
                              f"text.max_unknown to train on it anyway")
        default = LMTextConfig.__dataclass_fields__["max_unknown"].default
        if share > default:  # allowed by a raised text.max_unknown: said, not silent
            log(f"warning: the tokenizer maps {100 * share:.2f}% of the training text's tokens to its unknown token "
                f"(accepted up to text.max_unknown={t.max_unknown:g})")
        for i, prompt in enumerate(recipe.generate.prompts):
            try:
                _encode_prompt(tokenizer, prompt, f"generate.prompts[{i}]")
            except InputError as exc:
                raise ConfigError(f"{exc} (the samples written after training start from generate.prompts: give "
                                  f"prompts that the run's tokenizer reads)") from None

    def score(self, recipe: Recipe, run_dir: Path, model: nn.Module, prepared: Prepared, data: Splits,
              log: Callable[[str], None]) -> dict[str, Any]:
        """Perplexity and bits per character of the test part, the validation figures of the
        tested weights, and the samples of the ``generate`` section."""
        cfg = recipe.train
        precision = train_config(recipe, run_dir).precision  # as the run resolved it
        device = next(model.parameters()).device
        if prepared.tested is not None:  # the skeleton's test figures: the same evaluation, done once
            test_loss = prepared.tested["test_loss"]
        else:
            test_loss = evaluate_model(model, prepared.test, batch_size=cfg.batch_size, device=device,
                                       precision=precision)["loss"]
        figures = lm_figures(test_loss, prepared.test, "test")
        if prepared.val is not None:
            val = evaluate_model(model, prepared.val, batch_size=cfg.batch_size, device=device, precision=precision)
            figures.update(lm_figures(val["loss"], prepared.val, "val"))
        samples = self._samples(model, prepared.info, recipe.generate)
        atomic_write_bytes(run_dir / SAMPLES, "\n\n".join(f"{p!r} ->\n{s}" for p, s in samples).encode())
        log(f"test {figures['test_loss']:.4f} nats/token, perplexity {figures['test_perplexity']:.2f}, "
            f"{figures['test_bits_per_char']:.4f} bits/char; samples in {run_dir / SAMPLES}")
        return {**figures, "samples": [s for _, s in samples]}

    @staticmethod
    def _samples(model: nn.Module, tokenizer: LMTokenizer, sample: SampleConfig, prompts: Sequence[str] | None = None,
                 *, batch_size: int = 16, **options: Any) -> list[tuple[str, str]]:
        """``(prompt, continuation)`` for each prompt, ``batch_size`` prompts at a time
        (left-padded to the longest of them), each ending at the end-of-text token or before
        its first stop string."""
        settings = {**sample.options(), **check_generation(**options)}
        stops = list(settings.pop("stop"))
        device = next(model.parameters()).device
        prompts = list(prompts if prompts is not None else sample.prompts)
        out = []
        for first in range(0, len(prompts), batch_size):
            chunk = prompts[first : first + batch_size]
            encoded = [_encode_prompt(tokenizer, p) for p in chunk]
            width = max(len(ids) for ids in encoded)
            ids = torch.tensor([[0] * (width - len(e)) + e for e in encoded], device=device)
            pad = torch.tensor([[True] * (width - len(e)) + [False] * len(e) for e in encoded], device=device)
            new: list[list[int]] = [[] for _ in chunk]
            ended = [False] * len(chunk)
            for token in model.stream(ids, eos_id=tokenizer.eos_id, padding_mask=pad if pad.any() else None,
                                      **settings):
                for row, t in enumerate(token.tolist()):
                    if ended[row]:
                        continue
                    if t == tokenizer.eos_id:
                        ended[row] = True
                        continue
                    new[row].append(t)
                    if stops and cut_at_stop(tokenizer.decode(new[row]), stops)[1]:
                        ended[row] = True
                if all(ended):
                    break  # every row is done: no more steps
            out += [(p, cut_at_stop(tokenizer.decode(n), stops)[0]) for p, n in zip(chunk, new)]
        return out

    # ------------------------------------------------------------------ a finished run
    def preprocessing(self, run_dir: Path, recipe: Recipe) -> Preprocessing:
        if not (run_dir / TOKENIZER).is_file():
            raise InputError(f"run_dir must hold the run's {TOKENIZER}; {run_dir} has none")
        tokenizer = load_tokenizer(run_dir / TOKENIZER)
        return Preprocessing(tokenizer, tokenizer=tokenizer)  # type: ignore[arg-type]  # an LMTokenizer

    def _tokenizer(self, run: TrainedRun) -> LMTokenizer:
        return run.tokenizer  # type: ignore[return-value]  # read once, by load_run

    def _test(self, run: TrainedRun, tokenizer: LMTokenizer, data: str | Path | None = None) -> LMDataset:
        source = source_of(run.recipe.data)
        documents = source.load(run.recipe.data).test if data is None else \
            source.read_documents(run.recipe.data, data)
        return LMDataset(documents, tokenizer, run.recipe.text.context)

    def evaluate(self, run: TrainedRun, *, device: str = "auto", data: str | Path | None = None) -> dict[str, Any]:
        """The test part's loss (nats per token), perplexity and bits per character, or
        (``data``) those of text of one's own: a ``.txt`` file, a folder of them, or a JSONL,
        CSV or TSV text column, in windows of the run's context, tokenized by its tokenizer."""
        tokenizer = self._tokenizer(run)
        test = self._test(run, tokenizer, data)
        res = evaluate_model(run.model, test, batch_size=run.recipe.train.batch_size, device=device,
                             precision=run.precision)
        return {**lm_figures(res["loss"], test, "test"), "test_accuracy": res["accuracy"],
                "test_samples": res["samples"]}

    def predict(self, run: TrainedRun, inputs: Sequence[str], *, max_new_tokens: int | None = None,
                temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                min_p: float | None = None, repetition_penalty: float | None = None, seed: int | None = None,
                stop: str | Sequence[str] | None = None, batch_size: int = 16, **_: Any) -> list[TextPrediction]:
        """The continuation of each prompt of ``inputs``, sampled as the recipe's ``generate``
        section says unless given, ``batch_size`` prompts of any lengths at a time; ``stop``: a
        text or texts that end a continuation (left out of it). The options are checked
        before any work (:func:`~attnlab.models.sampling.check_generation`)."""
        given = check_generation(**{k: v for k, v in {
            "max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p,
            "min_p": min_p, "repetition_penalty": repetition_penalty, "seed": seed,
            "stop": stop}.items() if v is not None})
        prompts = check_texts(inputs, self.name)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"batch_size must be a positive integer; got {batch_size!r}")
        pairs = self._samples(run.model, self._tokenizer(run), run.recipe.generate, prompts, batch_size=batch_size,
                              **given)
        return [TextPrediction(p, s) for p, s in pairs]

    def stream(self, run: TrainedRun, prompt: str, *, max_new_tokens: int | None = None,
               temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
               min_p: float | None = None, repetition_penalty: float | None = None, seed: int | None = None,
               stop: str | Sequence[str] | None = None) -> Iterator[str]:
        """The continuation of ``prompt``, as each token comes: the new text since the last
        piece (a byte-level tokenizer may need several tokens for one character; text that
        could begin a stop string waits until it is clear that it does not)."""
        given = check_generation(**{k: v for k, v in {
            "max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p,
            "min_p": min_p, "repetition_penalty": repetition_penalty, "seed": seed,
            "stop": stop}.items() if v is not None})
        settings = {**run.recipe.generate.options(), **given}
        stops = list(settings.pop("stop"))
        tokenizer = self._tokenizer(run)
        ids = _encode_prompt(tokenizer, check_texts([prompt], self.name)[0])
        new: list[int] = []
        shown = ""
        for token in run.model.stream(torch.tensor([ids], device=run.device), eos_id=tokenizer.eos_id, **settings):
            if tokenizer.eos_id is not None and int(token[0]) == tokenizer.eos_id:
                break
            new.append(int(token[0]))
            text, stopped = cut_at_stop(tokenizer.decode(new), stops)
            if stopped:
                yield text[len(shown):]
                return
            if not text.endswith("\ufffd"):  # a character whose bytes are not all out yet waits for them
                ready = text[: len(text) - held_back(text, stops)]
                if len(ready) > len(shown):
                    yield ready[len(shown):]
                    shown = ready
        rest = cut_at_stop(tokenizer.decode(new), stops)[0]
        if len(shown) < len(rest):
            yield rest[len(shown):]

    def report_items(self, runs: Sequence[TrainedRun], *, device: str = "auto") -> list[Any]:
        [run] = runs
        pairs = self._samples(run.model, self._tokenizer(run), run.recipe.generate)
        rows = [(repr(p), s) for p, s in pairs]
        return [SampleTable("Samples", "Continuations of the recipe's prompts (its generate section) by the tested "
                            "weights.", ("prompt", "continuation"), rows)]

    @torch.no_grad()
    def attention_views(self, run: TrainedRun, inputs: Sequence[Any] | None, *, max_inputs: int = 2,
                        queries: Sequence[tuple[int, int]] | None = None) -> list[Any]:
        if queries is not None:
            raise InputError(f"queries (--query) choose BoTNet query pixels; run {run.run_dir} is a {self.name} run")
        tokenizer = self._tokenizer(run)
        texts = check_texts(inputs, self.name) if inputs is not None else list(run.recipe.generate.prompts)[:max_inputs]
        views = []
        for text in texts:
            ids = _encode_prompt(tokenizer, text)[: run.recipe.text.context]
            with capture_attention(run.model, cpu=True) as maps:
                run.model(torch.tensor([ids], device=run.device))
            layers = [(name, calls[0][0]) for name, calls in maps.items() if calls]
            if not layers:
                raise InputError(f"run {run.run_dir} cannot be visualized: its attention "
                                 f"({run.model.config.attention!r}) forms no weights")
            views.append(TextAttention(f'"{shorten(text)}" (causal self-attention)',
                                       [tokenizer.decode([i]) for i in ids], layers))
        return views
