"""Language modelling: a decoder-only model learns to predict the next token of a text
corpus (``data.name``: the built-in ``tinyshakespeare``, one's own ``text``, or a source
one registers; see :mod:`attnlab.data.kinds.text_corpus` and :mod:`attnlab.data.sources.text_documents`).

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

A pretrained decoder's Hugging Face folder (any family of :data:`attnlab.families.DECODERS`) fine-tunes on one's
own text with ``model.checkpoint=FOLDER``: the folder decides the model (its registered name
and options, recorded in ``config.yaml``) and the tokenizer (its ``tokenizer.json`` with its
special tokens, copied into the run directory as an
:class:`~attnlab.data.tokenizers.lm.HFTokenizer`); the recipe decides the training (steps, rate,
context, data). :func:`~attnlab.tasks.lm_folders.load_folder` reads such a folder as a finished run, which
``attnlab generate FOLDER "prompt"`` (``--chat``: through its chat template) continues with
the defaults of its ``generation_config.json``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from ..attention.capture import capture_attention
from ..data.batches.lm import LMDataset
from ..data.tokenizers.lm import HFTokenizer, LMTokenizer, load_run_tokenizer, load_tokenizer, train_tokenizer
from ..data.source import Splits, source_of
from ..data.tokenizers.text import shorten
from ..engine import distributed
from ..engine.config import ConfigError
from ..engine.trainer import evaluate_model
from ..errors import AttentionUnavailable, InputError
from ..families import decoder_names
from ..io import atomic_write_bytes
from ..models.gpt import GPT
from ..formats.hf.load import hf_model_spec
from ..formats.hf.files import open_checkpoint
from ..generation.search import DecoderSession, search
from ..generation.processors import cut_at_stop, held_back, processors_for
from ..generation.sampling import check_generation, only_decodable
from ..run.recipe import Recipe
from ..run.task import Prepared, Preprocessing, Task, check_text, check_texts, register_task
from ..run.trained import TrainedRun
from ..run.files import train_config
from ..run.views import GenerationAttention, SampleTable, TextAttention, TextPrediction, token_labels
from ..moved import former_names
from .lm_folders import (DECODER_TYPES, FOLDER_TEXT_KEYS, TRAINING_OPTIONS, check_decoder, check_vocabulary,
                         folder_of)
from .lm_recipe import LanguageModelingRecipe, LMTextConfig, SampleConfig

__all__ = ["LanguageModeling", "lm_figures"]

TOKENIZER = "tokenizer.json"
SAMPLES = "samples.txt"


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
        ids = tokenizer.encode_prompt(prompt)
    except InputError as exc:
        raise InputError(f"{key} {_shown_prompt(prompt)}: {exc}") from None
    if not ids:
        raise InputError(f"{key} must give at least one token; {_shown_prompt(prompt)} gives none with the run's "
                         f"tokenizer")
    return ids


def _stream_eos(tokenizer: LMTokenizer) -> int | None:
    """The ``eos_id`` that :meth:`GPT.stream` continues a finished row with (and stops at, once
    every row has it): the first stop id; the callers end a row at any of them."""
    return tokenizer.stop_ids[0] if tokenizer.stop_ids else None


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
    # model.checkpoint=FOLDER (a Hugging Face decoder): the folder's model and tokenizer are the run's
    folder_keys = ("model.name", "model.options", *(f"text.{key}" for key in FOLDER_TEXT_KEYS))
    key_help = {
        "model.checkpoint": f"weights to start from: a Hugging Face decoder folder ({decoder_names()}; its model and tokenizer "
                            "become the run's), an attnlab "
                            "language-model run directory, or a state dict of this model",
        "model.freeze_backbone": "with checkpoint: train the output layer (head) alone, every block frozen; refused "
                                 "for a head tied to the token embedding (nothing would train)",
        "model.backbone_lr_scale": "the blocks and embeddings learn at train.lr x this, the output layer at train.lr",
        "model.lora": "with checkpoint: low-rank adapters train, nothing else (the output layer stays frozen)",
        "train.early_stop": "stop when the validation token accuracy (what picks checkpoints/best) has not improved "
                            "for this many evaluations in a row; null: train to train.steps",
    }

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
        folder = folder_of(recipe)
        tokens = f"the tokens of {folder}" if folder is not None else f"{recipe.text.tokenizer} tokens"
        return f"{source_of(recipe.data).describe(recipe.data)}, {tokens}, context {recipe.text.context}"

    def check_folder(self, folder: Path) -> None:
        """A language model starts from a decoder's folder (:data:`DECODER_TYPES`)."""
        check_decoder(folder, f"model.checkpoint={folder}")

    def check(self, recipe: Recipe) -> nn.Module | None:
        """Also: a model with absolute positions (learned or sinusoidal) cannot continue a
        prompt past its context, so the samples a finished run writes must fit in it; said
        before training, not after it. A run from a Hugging Face folder
        (``model.checkpoint=FOLDER``) takes the folder's model and tokenizer: ``model.options``
        that contradict its ``config.json`` (any but :data:`TRAINING_OPTIONS`), a tokenizer of
        the recipe's (``text.tokenizer``, ``text.vocab_size``, ``text.min_frequency``,
        ``text.tokenizer_file``), a ``text.context`` past its positions and a folder without
        ``tokenizer.json`` are refused, naming the key."""
        folder = folder_of(recipe)
        tokenizer = self._check_folder_recipe(recipe, folder) if folder is not None else None
        model = super().check(recipe)  # built once, on the meta device
        if model is None or (recipe.model.checkpoint is not None and folder is None):
            return model
        cfg = getattr(model, "config", None)
        pos, max_len = getattr(cfg, "pos_embed", None), getattr(cfg, "max_len", None)
        if pos not in ("learned", "sinusoidal") or not isinstance(max_len, int):
            return model
        sample = recipe.generate
        if tokenizer is not None:
            prompt = max(len(tokenizer.encode_prompt(p)) for p in sample.prompts)
        else:
            prompt = max(len(p.encode()) if recipe.text.tokenizer == "byte" else len(p)
                         if recipe.text.tokenizer == "char" else 1 for p in sample.prompts)  # its tokens (BPE: >= 1)
        if prompt + sample.max_new_tokens > max_len:
            raise ConfigError(f"generate.max_new_tokens must leave the prompts room in the context: a model with "
                              f"pos_embed={pos!r} holds text.context={max_len} positions, and the longest of "
                              f"generate.prompts takes {prompt}; got generate.max_new_tokens={sample.max_new_tokens} "
                              f"(at most {max(max_len - prompt, 0)}, or use pos_embed rope or alibi, which have no "
                              f"such limit)")
        return model

    @staticmethod
    def _check_folder_recipe(recipe: Recipe, folder: Path) -> HFTokenizer:
        """What a recipe that starts from the Hugging Face folder ``folder`` may not say (see
        :meth:`check`); returns the folder's tokenizer."""
        key = f"model.checkpoint={recipe.model.checkpoint}"
        _, spec = hf_model_spec(folder)
        if recipe.model.convert_attention is not None:  # the folder's model as model.convert_attention changes it
            from ..models.convert import convert_options

            spec = convert_options(spec, recipe.model.convert_attention)
        for name, value in recipe.model.options.items():  # pretrained_model put the recipe's over the folder's
            if name in TRAINING_OPTIONS or (name in spec and spec[name] == value):
                continue
            theirs = f"its {name} is {spec[name]!r}" if name in spec else f"its model has no option {name!r}"
            raise ConfigError(f"model.options.{name} must be left out with {key}: the folder's config.json decides "
                              f"the model ({theirs}); got {value!r} (a run from a folder may set "
                              f"{', '.join(TRAINING_OPTIONS)})")
        defaults = LMTextConfig()
        for name in FOLDER_TEXT_KEYS:
            value = getattr(recipe.text, name)
            if value != getattr(defaults, name):
                raise ConfigError(f"text.{name} must be left out with {key}: the run reads text with the folder's "
                                  f"own tokenizer.json, which its model was trained with; got {value!r}")
        if recipe.text.context > spec["max_len"]:
            raise ConfigError(f"text.context must be at most {spec['max_len']}, the positions of the model of {key} "
                              f"({folder / 'config.json' if folder.is_dir() else folder}); got {recipe.text.context}")
        try:
            tokenizer = open_checkpoint(folder).tokenizer()
            check_vocabulary(tokenizer, spec, folder)
        except InputError as exc:
            raise ConfigError(f"{key}: {exc}") from None
        return tokenizer

    def calibration_inputs(self, train_set: Any, count: int) -> list[Any]:
        """``count`` windows spread evenly over the training text, ``(1, L)`` ids each."""
        count = min(count, len(train_set))
        picks = sorted({round(i * (len(train_set) - 1) / max(count - 1, 1)) for i in range(count)})
        return [train_set[i][0]["input_ids"][None] for i in picks]

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
        path, folder = run_dir / TOKENIZER, folder_of(recipe)
        if path.is_file():  # a resumed run: its weights belong to this vocabulary
            tokenizer = load_run_tokenizer(run_dir)
        else:
            t = recipe.text
            if folder is not None:  # a pretrained model reads text with its own tokenizer
                tokenizer = open_checkpoint(folder).tokenizer()
            else:
                tokenizer = load_tokenizer(t.tokenizer_file) if t.tokenizer_file else train_tokenizer(
                    t.tokenizer, data.train, vocab_size=t.vocab_size, min_frequency=t.min_frequency)
            if distributed.is_main():
                tokenizer.save(path)  # (a folder's: with its tokenizer_config.json and generation_config.json)
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

    def check_prepared(self, recipe: Recipe, run_dir: Path, model: nn.Module, prepared: Prepared,
                       log: Callable[[str], None]) -> None:
        """The model embeds every id of the run's tokenizer. An embedding with more rows than
        the tokenizer has tokens (a folder padded past its tokenizer, as Qwen's are) is said in
        one line: those ids are never generated (:func:`~attnlab.generation.sampling.only_decodable`);
        a tokenizer with more ids than the model embeds is refused, naming both sizes and files."""
        embeds = getattr(getattr(model, "config", None), "vocab_size", None)
        if prepared.info is None or not isinstance(embeds, int):
            return
        known = prepared.info.vocab_size
        folder, text = folder_of(recipe), recipe.text
        if folder is not None:
            source, tokens = f"the model of {folder / 'config.json'}", f"{folder / TOKENIZER}"
        else:  # a run of attnlab's own: its vocab_size is the tokenizer's, unless model.options says another
            given = recipe.model.options.get("vocab_size")
            source = f"model {recipe.model.name}" + (f" (model.options.vocab_size={given})" if given else "")
            tokens = text.tokenizer_file or f"the run's tokenizer (text.tokenizer={text.tokenizer})"
        if known > embeds:
            raise InputError(f"{tokens} has {known:,} tokens but {source} embeds {embeds:,} ids (vocab_size): ids "
                             f"{embeds:,}-{known - 1:,} of the tokenizer have no embedding")
        if embeds > known:
            log(f"vocabulary: the model embeds {embeds:,} ids, the tokenizer decodes {known:,}: ids {known:,}-"
                f"{embeds - 1:,} are never generated ({source} has rows past the tokens of {tokens}; they are "
                f"masked out of every choice of a token)")

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
        ends = set(tokenizer.stop_ids)
        out = []
        for first in range(0, len(prompts), batch_size):
            chunk = prompts[first : first + batch_size]
            encoded = [_encode_prompt(tokenizer, p) for p in chunk]
            width = max(len(ids) for ids in encoded)
            ids = torch.tensor([[0] * (width - len(e)) + e for e in encoded], device=device)
            pad = torch.tensor([[True] * (width - len(e)) + [False] * len(e) for e in encoded], device=device)
            new: list[list[int]] = [[] for _ in chunk]
            ended = [False] * len(chunk)
            for token in model.stream(ids, eos_id=_stream_eos(tokenizer), padding_mask=pad if pad.any() else None,
                                      decodable=tokenizer.vocab_size, **settings):
                for row, t in enumerate(token.tolist()):
                    if ended[row]:
                        continue
                    if t in ends:
                        ended[row] = True
                        continue
                    new[row].append(t)
                    if stops and cut_at_stop(tokenizer.decode_after(encoded[row], new[row]), stops)[1]:
                        ended[row] = True
                if all(ended):
                    break  # every row is done: no more steps
            out += [(p, cut_at_stop(tokenizer.decode_after(e, n), stops)[0]) for p, e, n in zip(chunk, encoded, new)]
        return out

    # ------------------------------------------------------------------ a finished run
    def preprocessing(self, run_dir: Path, recipe: Recipe) -> Preprocessing:
        if not (run_dir / TOKENIZER).is_file():
            raise InputError(f"run_dir must hold the run's {TOKENIZER}; {run_dir} has none")
        tokenizer = load_run_tokenizer(run_dir)
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
        before any work (:func:`~attnlab.generation.sampling.check_generation`)."""
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
               stop: str | Sequence[str] | None = None, chat: bool = False,
               system: str | None = None, messages: Sequence[dict[str, str]] | None = None) -> Iterator[str]:
        """The continuation of ``prompt``, as each token comes: the new text since the last
        piece (a byte-level tokenizer may need several tokens for one character; text that
        could begin a stop string waits until it is clear that it does not). It ends at any
        of the tokenizer's stop ids (a folder's ``generation_config.json`` may name several).
        A model with absolute positions stops where they end unless ``max_new_tokens`` is
        given. ``chat``: ``prompt`` is a user's message, rendered with ``system`` (a system message
        before it, when given) by the tokenizer's chat template
        (:meth:`~attnlab.data.tokenizers.lm.LMTokenizer.chat_prompt`), and the continuation is
        the assistant's reply; ``messages`` (with ``chat``): the conversation so far
        (``{"role", "content"}`` each, the system message first when there is one), to
        which ``prompt`` is the user's next message."""
        given = check_generation(**{k: v for k, v in {
            "max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p,
            "min_p": min_p, "repetition_penalty": repetition_penalty, "seed": seed,
            "stop": stop}.items() if v is not None})
        settings = {**run.recipe.generate.options(), **given}
        stops = list(settings.pop("stop"))
        tokenizer = self._tokenizer(run)
        text = check_texts([prompt], self.name)[0]
        if system is not None and not chat:
            raise InputError("system is the system message of a chat: give it with chat=True")
        if messages is not None and not chat:
            raise InputError("messages are a chat's history: give them with chat=True")
        ids = self._chat_ids(run, tokenizer, text, system, messages) if chat else _encode_prompt(tokenizer, text)
        cfg = getattr(run.model, "config", None)
        if max_new_tokens is None and getattr(cfg, "pos_embed", None) in ("learned", "sinusoidal"):
            # a default (the recipe's, a folder's) stops where the positions end; a given number is checked whole
            settings["max_new_tokens"] = max(min(settings["max_new_tokens"], cfg.max_len - len(ids)), 0)
        ends = set(tokenizer.stop_ids)
        new: list[int] = []
        shown = ""
        for token in run.model.stream(torch.tensor([ids], device=run.device), eos_id=_stream_eos(tokenizer),
                                      decodable=tokenizer.vocab_size, **settings):
            if int(token[0]) in ends:
                break
            new.append(int(token[0]))
            text, stopped = cut_at_stop(tokenizer.decode_after(ids, new), stops)
            if stopped:
                yield text[len(shown):]
                return
            if not text.endswith("\ufffd"):  # a character whose bytes are not all out yet waits for them
                ready = text[: len(text) - held_back(text, stops)]
                if len(ready) > len(shown):
                    yield ready[len(shown):]
                    shown = ready
        rest = cut_at_stop(tokenizer.decode_after(ids, new), stops)[0]
        if len(shown) < len(rest):
            yield rest[len(shown):]

    def tokenizer_of(self, run: TrainedRun) -> LMTokenizer:
        """The tokenizer ``run`` reads and writes text with."""
        return self._tokenizer(run)

    def chat_tokens(self, run: TrainedRun, message: str, *, system: str | None = None,
                    history: Sequence[dict[str, str]] | None = None) -> list[int]:
        """The ids of the chat that :meth:`stream` with ``chat=True`` would continue: ``system``,
        ``history`` and ``message`` rendered by the tokenizer's chat template."""
        return self._chat_ids(run, self._tokenizer(run), message, system, history)

    @staticmethod
    def _chat_ids(run: TrainedRun, tokenizer: LMTokenizer, message: str, system: str | None,
                  history: Sequence[dict[str, str]] | None = None) -> list[int]:
        """The ids of a chat of ``system`` (when given), the ``history`` (when given) and the
        user's ``message``, rendered by the tokenizer's chat template, which writes its special
        tokens itself."""
        if system is not None and not isinstance(system, str):
            raise InputError(f"system must be a text; got {type(system).__name__}")
        check_text(message, "the message")
        if system is not None:
            check_text(system, "the system message")
        if not isinstance(tokenizer, HFTokenizer):
            raise InputError(f"{run.run_dir} has no chat template: its tokenizer was learnt by the run (a run "
                             f"fine-tuned from a Hugging Face folder keeps the folder's, in its tokenizer_config.json)")
        messages = ([{"role": "system", "content": system}] if system is not None else []) + \
            list(history or []) + [{"role": "user", "content": message}]
        ids = tokenizer.encode_prompt(tokenizer.chat_prompt(messages), special_tokens=False)
        if not ids:
            raise InputError(f"the chat template of {tokenizer.folder} rendered the message as no tokens")
        return ids

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
                raise AttentionUnavailable(
                    f"run {run.run_dir} cannot be visualized: its attention ({run.model.config.attention!r}) forms "
                    f"no weights", reason=f"its attention ({run.model.config.attention}) forms no weights",
                    instead="Train it with model.options.attention=exact (the default) to see its attention.")
            views.append(TextAttention(f'"{shorten(text)}" (causal self-attention)',
                                       [tokenizer.decode([i]) for i in ids], layers))
        return views

    @torch.no_grad()
    def explore_views(self, run: TrainedRun, inputs: Sequence[Any] | None, *, max_inputs: int = 2,
                      new_tokens: int = 20) -> list[Any]:
        tokenizer = self._tokenizer(run)
        texts = check_texts(inputs, self.name) if inputs is not None else list(run.recipe.generate.prompts)[:max_inputs]
        context = run.recipe.text.context
        known = tokenizer.vocab_size  # a folder's model may embed more ids than its tokenizer has (padded rows)

        def label(i: int) -> str:
            return tokenizer.decode([i]) if i < known else f"<id {i}>"

        views = []
        for text in texts:
            ids = _encode_prompt(tokenizer, text)[:context]
            view = generation_attention(run.model, ids, label, new_tokens=max(0, min(new_tokens, context - len(ids))),
                                        decodable=known)
            view.tokens = token_labels(tokenizer.decode, view.ids, tokenizer.spelling)  # a character on each
            view.title = f'"{shorten(text)}" and its greedy continuation'
            views.append(view)
        return views


@torch.no_grad()
def generation_attention(model: GPT, ids: Sequence[int], label: Callable[[int], str], *, new_tokens: int,
                         top_k: int = 10, decodable: int | None = None) -> GenerationAttention:
    """The attention of ``model`` over the prompt ``ids`` and its greedy continuation of
    ``new_tokens`` tokens, and its ``top_k`` next tokens after each position
    (:class:`~attnlab.run.views.GenerationAttention`). With a model whose attention keeps a
    cache, the prompt goes through once and each new token through its own decoding step with
    the cache, as ``generate`` reads it (its rows are those steps' weights); otherwise the
    whole sequence goes through again after the continuation is chosen. ``decodable``: the ids
    the tokenizer decodes; the rows past them are neither chosen nor among the next tokens
    (:class:`~attnlab.generation.processors.Decodable`, as ``generate`` has it)."""
    from ..attention.capture import attention_modules
    from ..memory import require_memory

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        seq = [int(i) for i in ids]
        n, total = len(seq), len(seq) + new_tokens
        cached = bool(getattr(model, "keeps_cache", False))
        recordable, opaque = ([name for name, _ in found] for found in attention_modules(model))
        if not recordable:
            what = f"its attention ({', '.join(opaque[:3]) or 'none'}) forms no weight matrix"
            raise AttentionUnavailable(f"{type(model).__name__} records no attention weights: {what}", reason=what,
                                       instead="Train it with model.options.attention=exact (the default) to see "
                                               "its attention.")
        # every head's (L, L) map, recorded, assembled and encoded: about three float32 copies, checked first
        heads = sum(int(getattr(m, "num_heads", 1)) for name, m in model.named_modules() if name in set(recordable))
        require_memory(3 * 4 * heads * total * total, f"the attention of {total} positions ({n} prompt tokens and "
                                                      f"{new_tokens} new; {heads} heads in all)")
        with capture_attention(model, include=recordable, cpu=True) as maps:  # the view names the others
            # generate's own session and search (greedy, the tokenizer's ids only), watched step by step
            session = DecoderSession(model, torch.tensor([seq], device=device), new_tokens, use_cache=cached,
                                     lean=False)  # through forward, which records the weights
            logits: list[Tensor] = []
            watch = lambda step: logits.append(  # noqa: E731
                step.prompt_logits[0].float() if step.index == 0 and cached else step.logits)
            chosen = [int(t) for t in search(session, new_tokens, processors_for(decodable=decodable), observer=watch)]
            seq += chosen
            if cached:
                if chosen:  # the last token read too: its row of weights, and what would follow it
                    logits.append(session.next(torch.tensor(chosen[-1:], device=device)).float())
                else:  # nothing to generate: the prompt alone
                    session.first()
                    logits = [session.prompt_logits[0].float()]  # type: ignore[index]
            else:
                for calls in maps.values():
                    calls.clear()  # only the last pass, over everything, is kept
                logits = [model(torch.tensor([seq], device=device))[0].float()]
        probs = only_decodable(torch.cat(logits), decodable).softmax(-1)
        p, idx = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
        top = [[(label(int(i)), float(v)) for v, i in zip(pv, iv)] for pv, iv in zip(p.tolist(), idx.tolist())]
        layers = []
        for name, calls in maps.items():
            if not calls:
                continue
            heads = calls[0].shape[1]
            full = torch.zeros(heads, len(seq), len(seq))
            row = 0
            for w in calls:  # (1, H, q, k): the keys a step saw are the latest k positions
                q, k = w.shape[2], w.shape[3]
                end = row + q
                full[:, row:end, end - k : end] = w[0].float()
                row = end
            layers.append((name, full))
        return GenerationAttention("", [label(i) for i in seq], n, layers, top, cached, opaque, ids=seq)
    finally:
        model.train(was_training)


__getattr__ = former_names(__name__)  # load_folder and the rest, now in lm_folders, lm_recipe and generation
