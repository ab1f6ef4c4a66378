"""Translation (Multi30k German to English by default, or parallel files of one's own):
BPE, a Transformer trained by the engine with label smoothing, checkpoint averaging, beam
search, and BLEU on the test set.

Data: any source of sentence pairs (``data.name``: the built-in ``multi30k``, any two of
``de``, ``en``, ``fr``, ``cs``; ``files``, parallel files of one's own; or a source one
registers; see :mod:`attnlab.data.kinds.sentence_pairs` and :mod:`attnlab.data.sources.parallel_files`).

A run directory gains, beside the engine's files::

    tokenizer.json                    joint vocabulary (text.joint_vocab: true), or
    tokenizer.src.json, tokenizer.tgt.json   one per language
    checkpoints/averaged/             mean of the last translate.average_checkpoints checkpoints
    translations.test.txt             the test set's beam-search translations, one per line

The validation split (Multi30k ``val``) picks ``checkpoints/best``. The test set is
evaluated once, with the weights of ``translate.checkpoint`` (``auto``: averaged, else
best, else last), named in ``results.json``'s ``test_checkpoint``: its token accuracy and
loss (teacher-forced), and the BLEU of the beam-search translations of the test set:

* ``bleu``: sacreBLEU, detokenized and case-sensitive (its default ``13a`` tokenizer), the
  standard figure for this task;
* ``bleu_lowercase``: the same with ``lowercase=True``, i.e. BLEU of lower-cased text
  split by the ``13a`` tokenizer: the lower-cased tokenized measure that tutorials report
  on Multi30k (they split with spaCy instead, which also splits clitics such as ``'s``).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch
from torch import nn

from ..data.kinds.sentence_pairs import Multi30kConfig, PairSource, PairSourceConfig
from ..data.source import Splits, source_of
from ..data.tokenizers.text import TextTokenizer, shorten
from ..data.batches.translation import TranslationDataset
from ..engine import distributed
from ..engine.checkpoint import (average_checkpoints, checkpoint_base, checkpoint_step, list_checkpoints,
                                 save_named_checkpoint)
from ..engine.device import select_device
from ..engine.trainer import evaluate_model
from ..errors import InputError
from ..io import atomic_write_bytes
from ..run.recipe import ModelConfig, Recipe
from ..run.task import Prepared, Preprocessing, Task, check_texts, register_task
from ..run.trained import TrainedRun
from .seq2seq import SEQ2SEQ_KEY_HELP, seq2seq_alignment, strip_padding
from .text import TextConfig
from ..run.views import SampleTable, TextPrediction

__all__ = ["TranslationTextConfig", "TranslateConfig", "TranslationRecipe", "Translation", "translate", "bleu_scores",
           "build_tokenizers"]


@dataclass
class TranslationTextConfig(TextConfig):
    joint_vocab: bool = True  # one vocabulary (and embedding) for both languages


@dataclass
class TranslateConfig:
    """Decoding and scoring of a translation run."""

    num_beams: int = field(default=4, metadata={"min": 1})
    length_penalty: float = field(default=1.0, metadata={"min": 0.0})  # hypotheses ranked by log p / length**this
    batch_size: int = field(default=64, metadata={"min": 1})  # sentences per decoding batch
    average_checkpoints: int = field(default=0, metadata={"min": 0})  # average the last N checkpoints (0, 1: no)
    # weights to test and translate with: auto (averaged > best > last), best, last, averaged
    checkpoint: Literal["auto", "best", "last", "averaged"] = "auto"


@dataclass
class TranslationRecipe(Recipe):
    task: str = "translation"
    data: PairSourceConfig = field(default_factory=Multi30kConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig("transformer_small"))
    text: TranslationTextConfig = field(default_factory=TranslationTextConfig)
    translate: TranslateConfig = field(default_factory=TranslateConfig)

    def __post_init__(self) -> None:
        if self.text.tokenizer_file and not self.text.joint_vocab:
            raise InputError("text.tokenizer_file gives one joint vocabulary; set text.joint_vocab=true with it")
        if self.translate.checkpoint == "averaged" and self.translate.average_checkpoints < 2:
            raise InputError(f"translate.checkpoint=averaged needs translate.average_checkpoints >= 2 (the weights "
                             f"to average); got {self.translate.average_checkpoints}")
        if self.translate.average_checkpoints > self.train.keep_checkpoints:
            raise InputError(
                f"translate.average_checkpoints must not exceed train.keep_checkpoints (the checkpoints kept); "
                f"got {self.translate.average_checkpoints} > {self.train.keep_checkpoints}")


# ----------------------------------------------------------------------------- pieces


def bleu_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    """Corpus BLEU of detokenized ``hypotheses`` against one reference each (see the
    module docstring): ``bleu``, ``bleu_lowercase`` and sacreBLEU's signatures."""
    import sacrebleu

    if len(hypotheses) != len(references):
        raise InputError(f"hypotheses and references must pair up; got {len(hypotheses)} and {len(references)}")
    cased = sacrebleu.BLEU()
    lower = sacrebleu.BLEU(lowercase=True)
    hyps, refs = list(hypotheses), [list(references)]
    return {
        "bleu": cased.corpus_score(hyps, refs).score,
        "bleu_lowercase": lower.corpus_score(hyps, refs).score,
        "bleu_signature": str(cased.get_signature()),
        "bleu_lowercase_signature": str(lower.get_signature()),
    }


def _tokenizer_paths(run_dir: Path, joint: bool) -> tuple[Path, Path]:
    if joint:
        return run_dir / "tokenizer.json", run_dir / "tokenizer.json"
    return run_dir / "tokenizer.src.json", run_dir / "tokenizer.tgt.json"


def build_tokenizers(recipe: TranslationRecipe, pairs: Sequence[tuple[str, str]]) -> tuple[TextTokenizer, TextTokenizer]:
    """``(source, target)`` tokenizers: the recipe's ``text.tokenizer_file`` (joint), or
    trained on the training pairs, one for both languages or one each."""
    t = recipe.text
    if t.tokenizer_file:
        tok = TextTokenizer.load(t.tokenizer_file)
        return tok, tok
    train = lambda texts: TextTokenizer.train(texts, t.tokenizer, t.vocab_size, lowercase=t.lowercase,  # noqa: E731
                                              min_frequency=t.min_frequency)
    if t.joint_vocab:
        tok = train([s for s, _ in pairs] + [e for _, e in pairs])
        return tok, tok
    return train([s for s, _ in pairs]), train([e for _, e in pairs])


@torch.no_grad()
def translate(model: nn.Module, src_tok: TextTokenizer, tgt_tok: TextTokenizer, texts: Sequence[str], *,
              num_beams: int = 4, max_length: int | None = None, length_penalty: float = 1.0,
              batch_size: int = 64, max_source_length: int = 128, device: str | torch.device = "auto") -> list[str]:
    """Translate ``texts`` in batches of similar length; returns one string per text, in order.

    Blank texts translate to ``""`` without running the model. A source longer than
    ``max_source_length`` tokens is cut (one warning says how many were). ``max_length``
    caps the tokens of each translation (default: the source length + 50, within the
    model's ``max_len``).
    """
    if not isinstance(num_beams, int) or num_beams < 1:
        raise InputError(f"num_beams must be a positive integer; got {num_beams!r}")
    vocab = getattr(model.config, "tgt_vocab_size", None)
    if isinstance(vocab, int) and num_beams > vocab:  # beams are distinct continuations: at most one per token
        raise InputError(f"num_beams must be at most the target vocabulary's {vocab:,} tokens (each beam keeps a "
                         f"different continuation); got {num_beams:,}")
    if max_length is not None and (not isinstance(max_length, int) or max_length < 1):
        raise InputError(f"max_length must be a positive integer; got {max_length!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer; got {batch_size!r}")
    texts = list(texts)
    out = [""] * len(texts)
    live = [i for i, t in enumerate(texts) if isinstance(t, str) and t.strip()]
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise TypeError(f"texts[{bad[0]}] must be a str; got {type(texts[bad[0]]).__name__}")
    if not live:
        return out
    ids = src_tok.tokenize([texts[i] for i in live], add_cls=False)
    limit = max_source_length - 1
    cut = sum(len(row) > limit for row in ids)
    if cut:
        longest = max(len(row) for row in ids) + 1  # with the end token
        warnings.warn(f"{cut} of {len(ids)} texts are longer than {limit} tokens and were truncated; pass "
                      f"max_source_length={longest} or more (the run's text.max_length) to keep them whole", stacklevel=2)
    ids = [row[:limit] + [src_tok.eos_id] for row in ids]
    device_ = select_device(device) if isinstance(device, str) else device
    model.to(device_).eval()
    cap = model.config.max_len
    order = sorted(range(len(ids)), key=lambda j: -len(ids[j]))  # similar lengths share a batch
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        src = src_tok.pad([ids[j] for j in chunk])["input_ids"].to(device_)
        new = min(cap, max_length if max_length is not None else src.shape[1] + 50)
        hyps = model.generate(src, max_new_tokens=new, num_beams=num_beams, length_penalty=length_penalty)
        for j, text in zip(chunk, tgt_tok.decode_batch(hyps.cpu())):
            out[live[j]] = text
    return out


def translate_as_recipe(recipe: Recipe, model: nn.Module, src_tok: TextTokenizer, tgt_tok: TextTokenizer,
                        texts: Sequence[str], *, num_beams: int | None = None, **options: Any) -> list[str]:
    """:func:`translate` with a run's decoding settings (beam size, length penalty,
    source length) from its recipe; ``options`` go to :func:`translate`."""
    tr = recipe.translate
    return translate(model, src_tok, tgt_tok, texts, num_beams=tr.num_beams if num_beams is None else num_beams,
                     length_penalty=tr.length_penalty, max_source_length=recipe.text.max_length, **options)


def average_last_checkpoints(run_dir: Path, count: int) -> Path | None:
    """Write ``checkpoints/averaged``: the mean weights of the last ``count`` step
    checkpoints (fewer if the run kept fewer). ``None`` when ``count`` < 2."""
    folders = list_checkpoints(run_dir / "checkpoints")[-count:]
    if count < 2 or len(folders) < 2:
        return None
    weights = average_checkpoints(folders)
    step = checkpoint_step(folders[-1])
    return save_named_checkpoint(run_dir / "checkpoints", "averaged", step, weights,
                                 {"step": step, "averaged": [f.name for f in folders]},
                                 base=checkpoint_base(folders[-1]))  # LoRA: averaged adapters, the same base


def _source(recipe: Recipe) -> PairSource:
    return source_of(recipe.data)


def _dataset(recipe: Recipe, src_tok: TextTokenizer, tgt_tok: TextTokenizer,
             pairs: list[tuple[str, str]]) -> TranslationDataset:
    n = recipe.text.max_length
    return TranslationDataset(pairs, src_tok, tgt_tok, n, n)


@register_task
class Translation(Task):
    name = "translation"
    recipe_class = TranslationRecipe
    summary = "translate sentences: Multi30k (de, en, fr, cs) or parallel files of one's own; BLEU with sacreBLEU"
    key_help = {
        **SEQ2SEQ_KEY_HELP,
        "model.checkpoint": "weights to start from: an attnlab translation run directory or a state dict of this "
                            "model (the vocabularies must be the same sizes)",
        "train.early_stop": "stop when the validation token accuracy (what picks checkpoints/best) has not improved "
                            "for this many evaluations in a row; null: train to train.steps",
    }
    inputs = "texts"
    outputs = "text"
    sample_unit = "sentence pairs"
    fixed_on_resume = ("task", "model", "text", "train.optimizer")
    legacy_keys = ("data.augment", "data.protocol")

    def model_options(self, recipe: Recipe, info: tuple[TextTokenizer, TextTokenizer] | None = None) -> dict[str, Any]:
        if info is None:
            src = tgt = recipe.text.vocab_size
            ids = {"pad_id": 0, "bos_id": 1, "eos_id": 2}  # TextTokenizer's special tokens come first
            joint = recipe.text.joint_vocab
        else:
            src_tok, tgt_tok = info
            if src_tok.pad_id != tgt_tok.pad_id:
                raise InputError(f"source and target tokenizers must share the [PAD] id; got {src_tok.pad_id} and "
                                 f"{tgt_tok.pad_id}")
            src, tgt, joint = src_tok.vocab_size, tgt_tok.vocab_size, src_tok is tgt_tok
            ids = {"pad_id": tgt_tok.pad_id, "bos_id": tgt_tok.bos_id, "eos_id": tgt_tok.eos_id}
        return {"src_vocab_size": src, "tgt_vocab_size": tgt, "max_len": max(recipe.text.max_length, 64) + 64,
                "share_embeddings": joint, **ids}

    def metric_rows(self, metrics: dict[str, Any]) -> list[tuple[str, str]]:
        rows = []
        if "bleu" in metrics:
            rows += [("test BLEU (sacreBLEU, cased)", f"{metrics['bleu']:.2f}"),
                     ("test BLEU (lower-cased)", f"{metrics['bleu_lowercase']:.2f}")]
        if "test_accuracy" in metrics:
            rows.append(("test token accuracy", f"{100 * metrics['test_accuracy']:.2f}%"))
        if "test_loss" in metrics:
            rows.append(("test loss", f"{metrics['test_loss']:.4f}"))
        return rows

    def save_preprocessing(self, run_dir: Path, recipe: Recipe, *, classes: Sequence[str] | None = None,
                           tokenizer: TextTokenizer | None = None,
                           target_tokenizer: TextTokenizer | None = None) -> list[Path]:
        """The source and target tokenizers, as this task names them (one joint file when
        ``text.joint_vocab``)."""
        if tokenizer is None:
            raise InputError("a translation run needs its source tokenizer (and target_tokenizer, unless "
                             "text.joint_vocab)")
        src_path, tgt_path = _tokenizer_paths(run_dir, recipe.text.joint_vocab)
        written = [tokenizer.save(src_path)]
        if not recipe.text.joint_vocab:
            if target_tokenizer is None:
                raise InputError("target_tokenizer must be given when text.joint_vocab is false")
            written.append(target_tokenizer.save(tgt_path))
        return written

    def describe(self, recipe: Recipe) -> str:
        return _source(recipe).describe(recipe.data)

    # ------------------------------------------------------------------ training
    def prepare(self, recipe: Recipe, run_dir: Path, data: Splits, log: Callable[[str], None]) -> Prepared:
        src_path, tgt_path = _tokenizer_paths(run_dir, recipe.text.joint_vocab)
        if src_path.is_file() and tgt_path.is_file():  # a resumed run: its weights belong to these
            src_tok = TextTokenizer.load(src_path)
            tgt_tok = src_tok if recipe.text.joint_vocab else TextTokenizer.load(tgt_path)
        else:
            src_tok, tgt_tok = build_tokenizers(recipe, data.train)
            if distributed.is_main():
                src_tok.save(src_path)
                if tgt_tok is not src_tok:
                    tgt_tok.save(tgt_path)
        train, val, test = (_dataset(recipe, src_tok, tgt_tok, pairs) for pairs in (data.train, data.val, data.test))
        return Prepared(train, val, test, (src_tok, tgt_tok), facts={
            "train_size": len(train), "dev_size": len(val), "test_size": len(test),
            "src_vocab_size": src_tok.vocab_size, "tgt_vocab_size": tgt_tok.vocab_size,
            "joint_vocab": src_tok is tgt_tok, "metric": "token accuracy (teacher forcing)"})

    def test_weights(self, recipe: Recipe, run_dir: Path, log: Callable[[str], None]) -> str:
        """The averaged weights, written first when ``translate.average_checkpoints`` asks,
        unless ``translate.checkpoint`` names others."""
        tr = recipe.translate
        if distributed.is_main():
            averaged = average_last_checkpoints(run_dir, tr.average_checkpoints)
            if averaged is not None:
                log(f"averaged the weights of the last {tr.average_checkpoints} checkpoints into {averaged}")
        distributed.barrier()
        if tr.checkpoint == "auto" and (run_dir / "checkpoints" / "averaged").is_dir():
            return "averaged"
        return tr.checkpoint

    def score(self, recipe: Recipe, run_dir: Path, model: nn.Module, prepared: Prepared, data: Splits,
              log: Callable[[str], None]) -> dict[str, Any]:
        """The BLEU of the beam-search translations of the test set, which are kept in
        ``translations.test.txt``."""
        tr = recipe.translate
        src_tok, tgt_tok = prepared.info
        start = time.perf_counter()
        sources, references = zip(*data.test)
        hyps = translate_as_recipe(recipe, model, src_tok, tgt_tok, sources, batch_size=tr.batch_size,
                                   device=recipe.train.device)
        seconds = time.perf_counter() - start
        atomic_write_bytes(run_dir / "translations.test.txt", ("\n".join(hyps) + "\n").encode())
        scores = bleu_scores(hyps, references)
        log(f"{_source(recipe).test_name} BLEU {scores['bleu']:.2f} (sacreBLEU, cased), "
            f"{scores['bleu_lowercase']:.2f} (lower-cased); beam {tr.num_beams}, {len(hyps) / seconds:.1f} "
            f"sentences/s")
        return {**scores, "num_beams": tr.num_beams, "translate_seconds": seconds}

    # ------------------------------------------------------------------ a finished run
    def preprocessing(self, run_dir: Path, recipe: Recipe) -> Preprocessing:
        src_path, tgt_path = _tokenizer_paths(run_dir, recipe.text.joint_vocab)
        for path in (src_path, tgt_path):
            if not path.is_file():
                raise InputError(f"run_dir must hold the run's {path.name}; {run_dir} has none")
        src_tok = TextTokenizer.load(src_path)
        tgt_tok = src_tok if recipe.text.joint_vocab else TextTokenizer.load(tgt_path)
        return Preprocessing((src_tok, tgt_tok), tokenizer=src_tok, target_tokenizer=tgt_tok)

    def evaluate(self, run: TrainedRun, *, device: str = "auto", batch_size: int | None = None,
                 data: str | Path | None = None) -> dict[str, Any]:
        """Token accuracy and loss (teacher-forced) and the BLEU of the beam-search
        translations on the test set, decoded as the recipe says (``batch_size``:
        sentences per decoding batch; the result does not depend on it). ``data``: pairs of
        one's own instead: a TSV file of ``source<TAB>target`` lines, or a folder holding
        ``test.SRC`` and ``test.TGT`` for the run's language codes."""
        source = _source(run.recipe)
        pairs = source.load_test(run.recipe.data) if data is None else source.read_pairs(run.recipe.data, data)
        cfg = run.recipe.train
        res = evaluate_model(run.model, _dataset(run.recipe, run.tokenizer, run.target_tokenizer, pairs),
                             batch_size=cfg.batch_size, device=device, precision=run.precision)
        sources, references = zip(*pairs)
        hyps = translate_as_recipe(run.recipe, run.model, run.tokenizer, run.target_tokenizer, sources,
                                   batch_size=batch_size or run.recipe.translate.batch_size, device=device)
        return {**bleu_scores(hyps, references), "test_accuracy": res["accuracy"], "test_loss": res["loss"],
                "test_samples": res["samples"]}

    def predict(self, run: TrainedRun, inputs: Sequence[str], *, num_beams: int | None = None,
                max_length: int | None = None, batch_size: int = 64, device: str | None = None) -> list[TextPrediction]:
        """Translations of ``inputs`` (beam size and length penalty from the recipe unless given),
        on ``device`` (default: where the run's model is)."""
        texts = check_texts(inputs, self.name)
        device = device or str(run.device)
        outs = translate_as_recipe(run.recipe, run.model, run.tokenizer, run.target_tokenizer, texts,
                                   num_beams=num_beams, max_length=max_length, batch_size=batch_size, device=device)
        return [TextPrediction(t, o) for t, o in zip(texts, outs)]

    def report_items(self, runs: Sequence[TrainedRun], *, device: str = "auto") -> list[Any]:
        """The first test sentences with the run's translations (read from
        ``translations.test.txt``: nothing is translated again)."""
        [run] = runs
        recipe, run_dir = run.recipe, run.run_dir
        path = run_dir / "translations.test.txt"
        if not path.is_file():
            raise InputError(f"run_dir must hold translations.test.txt (written at the end of training); "
                             f"{run_dir} has none")
        hyps = path.read_text(encoding="utf-8").splitlines()
        source = _source(recipe)
        pairs = source.load_test(recipe.data)
        rows = [(s, r, h) for (s, r), h in zip(pairs[:8], hyps[:8])]
        return [SampleTable("Sample translations", f"The first test sentences ({source.test_name}) with the run's "
                            "beam-search translations.", ("source", "reference", "translation"), rows)]

    @torch.no_grad()
    def attention_views(self, run: TrainedRun, inputs: Sequence[Any] | None, *, max_inputs: int = 2,
                        queries: Sequence[tuple[int, int]] | None = None) -> list[Any]:
        if queries is not None:
            raise InputError(f"queries (--query) choose BoTNet query pixels; run {run.run_dir} is a {self.name} run")
        texts = check_texts(inputs, self.name) if inputs is not None else \
            [s for s, _ in _source(run.recipe).load_test(run.recipe.data)[:max_inputs]]
        model, cfg, tr = run.model, run.model.config, run.recipe.translate
        src_tok, tgt_tok = run.tokenizer, run.target_tokenizer
        views = []
        for text in texts:
            src_ids = src_tok.tokenize([text], add_cls=False)[0][: run.recipe.text.max_length - 1] + [src_tok.eos_id]
            hyp = model.generate(torch.tensor([src_ids], device=next(model.parameters()).device), max_new_tokens=min(cfg.max_len, len(src_ids) + 50),
                                 num_beams=tr.num_beams, length_penalty=tr.length_penalty)[0].tolist()
            hyp = strip_padding(hyp, cfg.pad_id)
            title = f'"{shorten(text)}"\n-> "{shorten(tgt_tok.decode(hyp))}"  (cross-attention, mean of heads)'
            views.append(seq2seq_alignment(model, src_ids, src_tok.readable_tokens(src_ids), hyp,
                                           tgt_tok.readable_tokens(hyp), title))
        return views
