"""Translation (Multi30k German to English by default, or parallel files of one's own):
BPE, a Transformer trained by the engine with label smoothing, checkpoint averaging, beam
search, and BLEU on the test set.

Data (``data.name``):

* ``multi30k``: Multi30k task 1, any two of ``de``, ``en``, ``fr``, ``cs``.
* ``files``: a folder ``data.root`` of parallel files, one sentence per line, line ``i``
  of one the translation of line ``i`` of the other: ``train.SRC`` and ``train.TGT`` for
  the language codes ``data.source`` and ``data.target`` (any codes; each file may be
  gzipped, ``train.de.gz``), or a ``train.tsv`` of ``source<TAB>target`` lines. ``val``
  and ``test`` files alike are used when present; else ``data.val_size`` and
  ``data.test_size`` of the training pairs are held out (at random, ``data.seed``).

A run directory gains, beside the engine's files::

    tokenizer.json                    joint vocabulary (text.joint_vocab: true), or
    tokenizer.src.json, tokenizer.tgt.json   one per language
    checkpoints/averaged/             mean of the last translate.average_checkpoints checkpoints
    translations.test.txt             the test set's beam-search translations, one per line

The validation split (Multi30k ``val``) picks ``checkpoints/best``. The test set is
evaluated once, with the weights of ``translate.checkpoint`` (``auto``: averaged, else
best, else last), named in ``results.json``'s ``test_checkpoint``: its token accuracy and
loss (teacher-forced), and the BLEU of the beam-search translations of ``test_2016_flickr``:

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

from ..attention.capture import capture_attention
from ..data.multi30k import MULTI30K_LANGUAGES, load_multi30k
from ..data.parallel import MAX_LINE_CHARS, find_parallel, load_parallel, read_pairs_tsv
from ..data.tokenize import TextTokenizer, shorten
from ..data.translation import TranslationDataset
from ..engine import distributed
from ..engine.checkpoint import average_checkpoints, checkpoint_step, list_checkpoints, save_named_checkpoint
from ..engine.device import select_device
from ..engine.trainer import evaluate_model
from ..errors import InputError
from ..io import atomic_write_bytes
from .base import DataConfig, ModelConfig, Recipe, Task, TrainedRun, check_texts, register_task
from .runs import fit_run, load_weights, open_run, read_recipe, resolve_weights, test_run, write_results
from .text_classification import TextConfig
from .views import AlignmentAttention, SampleTable, TextPrediction

__all__ = ["TranslationDataConfig", "TranslationTextConfig", "TranslateConfig", "TranslationRecipe", "Translation",
           "translate", "bleu_scores", "build_tokenizers", "seq2seq_alignment"]


FILES = {"only": ("files",)}  # a data key that applies to data.name=files alone


@dataclass
class TranslationDataConfig(DataConfig):
    name: Literal["multi30k", "files"] = "multi30k"
    source: str = "de"  # language code of the source (multi30k: de, en, fr or cs; files: any, e.g. the extension)
    target: str = "en"  # language code of the target
    root: str | None = field(default=None, metadata=FILES)  # files: the folder of train.SRC/train.TGT (or train.tsv)
    # files without val / test files: training pairs held out, a count or a fraction below 1
    val_size: float = field(default=0.05, metadata={"min": 0.0, **FILES})
    test_size: float = field(default=0.05, metadata={"min": 0.0, **FILES})
    seed: int = field(default=0, metadata={"min": 0, "max": 2**32 - 1, **FILES})  # files: of the held-out pairs
    skip_blank: bool = field(default=False, metadata=FILES)  # files: drop pairs with a blank side (else an error)
    # the longest line read, in characters: a longer one is refused before it is held in memory
    max_line_chars: int = field(default=MAX_LINE_CHARS, metadata={"min": 1})

    def __post_init__(self) -> None:
        if self.source == self.target:
            raise InputError(f"data.source and data.target must differ; got {self.source!r} for both")
        if self.name == "multi30k":
            for key in ("source", "target"):
                if getattr(self, key) not in MULTI30K_LANGUAGES:
                    raise InputError(f"data.{key} must be one of {', '.join(map(repr, MULTI30K_LANGUAGES))} for "
                                     f"multi30k; got {getattr(self, key)!r}")
        self.check_applies()
        self.check_held_out(("val_size", "test_size"), "pairs")


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
    data: TranslationDataConfig = field(default_factory=TranslationDataConfig)
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
                                 {"step": step, "averaged": [f.name for f in folders]})


def seq2seq_alignment(model: nn.Module, src_ids: list[int], src_tokens: list[str], hyp: list[int],
                      tgt_tokens: list[str], title: str) -> AlignmentAttention:
    """The decoder's cross-attention for the hypothesis ``hyp`` of source ``src_ids``.

    The chosen hypothesis is teacher-forced: row t is the step that produced ``hyp[t]``.
    (Beam search reorders and drops rows between steps, so its per-step weights follow no
    single hypothesis; this pass gives the weights that the cached steps computed.)"""
    cfg, device = model.config, next(model.parameters()).device
    src = torch.tensor([src_ids], device=device)
    tgt_in = torch.tensor([[cfg.bos_id] + hyp[:-1]], device=device)
    with capture_attention(model, include="transformer.decoder.layers.*.cross_attn", cpu=True) as maps:
        memory, memory_pad = model.encode(src)
        model.decode(tgt_in, memory, memory_pad)
    return AlignmentAttention(title, src_tokens, tgt_tokens, [calls[0][0] for calls in maps.values() if calls])


def strip_padding(hyp: list[int], pad_id: int) -> list[int]:
    """A generated row without its right padding (a batch pads its shorter rows)."""
    while len(hyp) > 1 and hyp[-1] == pad_id:
        hyp = hyp[:-1]
    return hyp


def _held_out(n: int, size: float, seed: int, what: str) -> tuple[list[int], list[int]]:
    """``(kept, held out)`` indices of ``range(n)``: ``size`` of them (count or fraction) at random."""
    count = int(size) if size >= 1 else round(size * n)
    if not 0 < count < n:
        raise InputError(f"{what} must leave some of the {n} training pairs and hold out at least one; got {size!r}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(order[count:]), sorted(order[:count])


def file_splits(data: TranslationDataConfig) -> tuple[dict[str, list[tuple[str, str]]], int]:
    """The train, val and test pairs of a folder of parallel files (see the module docstring),
    and how many pairs with a blank side were skipped (``data.skip_blank``): a pure function
    of the recipe, so that evaluation finds the same test pairs."""
    if not data.root:
        raise InputError("data.root must name a folder of parallel files (train.SRC and train.TGT, or train.tsv) "
                         "when data.name is 'files'")
    root = Path(data.root).expanduser()
    if not root.is_dir():
        raise InputError(f"data.root must be a folder of parallel files; {root} "
                         f"{'is a file' if root.exists() else 'does not exist'}")
    read = {"skip_blank": data.skip_blank, "max_line_chars": data.max_line_chars}
    splits = {"train": load_parallel(root, "train", data.source, data.target, **read)}
    for name in ("val", "test"):
        try:
            find_parallel(root, name, data.source, data.target)
        except FileNotFoundError:
            continue
        splits[name] = load_parallel(root, name, data.source, data.target, **read)
    skipped = sum(p.skipped for p in splits.values())
    train = splits["train"]
    if "test" not in splits:
        keep, held = _held_out(len(train), data.test_size, data.seed, "data.test_size")
        splits["test"], train = [train[i] for i in held], [train[i] for i in keep]
    if "val" not in splits:
        keep, held = _held_out(len(train), data.val_size, data.seed + 1, "data.val_size")
        splits["val"], train = [train[i] for i in held], [train[i] for i in keep]
    splits["train"] = train
    return splits, skipped


def _pairs_of(path: Path, data: TranslationDataConfig) -> list[tuple[str, str]]:
    """Sentence pairs of one's own for ``eval --data``: a TSV file, or a folder's test files."""
    if path.is_dir():
        return load_parallel(path, "test", data.source, data.target, max_line_chars=data.max_line_chars)
    return read_pairs_tsv(path, max_line_chars=data.max_line_chars)


def _load_split(recipe: Recipe, split: str) -> list[tuple[str, str]]:
    if recipe.data.name == "files":
        return file_splits(recipe.data)[0][split]
    return load_multi30k(split, recipe.data.data_dir, recipe.data.source, recipe.data.target,
                         max_line_chars=recipe.data.max_line_chars)


def _dataset(recipe: Recipe, src_tok: TextTokenizer, tgt_tok: TextTokenizer,
             pairs: list[tuple[str, str]]) -> TranslationDataset:
    n = recipe.text.max_length
    return TranslationDataset(pairs, src_tok, tgt_tok, n, n)


@register_task
class Translation(Task):
    name = "translation"
    recipe_class = TranslationRecipe
    summary = "translate sentences: Multi30k (de, en, fr, cs) or parallel files of one's own; BLEU with sacreBLEU"
    inputs = "texts"
    outputs = "text"
    sample_unit = "sentence pairs"
    fixed_on_resume = ("task", "data.name", "data.source", "data.target", "data.root", "data.val_size",
                       "data.test_size", "data.seed", "model", "text", "train.optimizer")
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

    # ------------------------------------------------------------------ training
    def train(self, recipe: Recipe, run_dir: str | Path, *, resume: bool = False, allow_changes: bool = False,
              log: Callable[[str], None] = print) -> dict[str, Any]:
        run_dir = Path(run_dir)
        # read before a run directory is made: a missing or mismatched file is named at once
        if recipe.data.name == "files":
            splits, skipped = file_splits(recipe.data)
            log(f"data: {len(splits['train'])} training, {len(splits['val'])} validation, {len(splits['test'])} test "
                f"pairs ({recipe.data.source} -> {recipe.data.target})"
                + (f"; {skipped} pairs with a blank side skipped" if skipped else ""))
        else:
            splits = {name: _load_split(recipe, name) for name in ("train", "val", "test")}
        with open_run(recipe, run_dir, resume=resume, allow_changes=allow_changes, log=log) as resume_from:
            src_path, tgt_path = _tokenizer_paths(run_dir, recipe.text.joint_vocab)
            if src_path.is_file() and tgt_path.is_file():  # a resumed run: its weights belong to these
                src_tok = TextTokenizer.load(src_path)
                tgt_tok = src_tok if recipe.text.joint_vocab else TextTokenizer.load(tgt_path)
            else:
                src_tok, tgt_tok = build_tokenizers(recipe, splits["train"])
                if distributed.is_main():
                    src_tok.save(src_path)
                    if tgt_tok is not src_tok:
                        tgt_tok.save(tgt_path)
            data = {name: _dataset(recipe, src_tok, tgt_tok, pairs) for name, pairs in splits.items()}
            build = lambda: self.build_model(recipe, (src_tok, tgt_tok))  # noqa: E731
            results = fit_run(recipe, run_dir, build, data["train"], data["val"], resume_from=resume_from, log=log)
            tr = recipe.translate
            if distributed.is_main():
                averaged = average_last_checkpoints(run_dir, tr.average_checkpoints)
                if averaged is not None:
                    log(f"averaged the weights of the last {tr.average_checkpoints} checkpoints into {averaged}")
            distributed.barrier()
            tested, model = test_run(recipe, run_dir, build, data["test"], resolve_weights(run_dir, tr.checkpoint))
            results = {**tested, **results, "train_size": len(data["train"]), "dev_size": len(data["val"]),
                       "test_size": len(data["test"]), "src_vocab_size": src_tok.vocab_size,
                       "tgt_vocab_size": tgt_tok.vocab_size, "joint_vocab": src_tok is tgt_tok,
                       "metric": "token accuracy (teacher forcing)"}
            if distributed.is_main():
                start = time.perf_counter()
                sources, references = zip(*splits["test"])
                hyps = translate_as_recipe(recipe, model, src_tok, tgt_tok, sources, batch_size=tr.batch_size,
                                           device=recipe.train.device)
                seconds = time.perf_counter() - start
                atomic_write_bytes(run_dir / "translations.test.txt", ("\n".join(hyps) + "\n").encode())
                scores = bleu_scores(hyps, references)
                log(f"test_2016_flickr BLEU {scores['bleu']:.2f} (sacreBLEU, cased), {scores['bleu_lowercase']:.2f} "
                    f"(lower-cased); beam {tr.num_beams}, {len(hyps) / seconds:.1f} sentences/s, "
                    f"weights {tested['test_checkpoint']}")
                results.update(scores, num_beams=tr.num_beams, translate_seconds=seconds)
            write_results(run_dir, results)
            return results

    # ------------------------------------------------------------------ a finished run
    def load(self, run_dir: Path, recipe: Recipe, checkpoint: str = "auto") -> TrainedRun:
        src_path, tgt_path = _tokenizer_paths(run_dir, recipe.text.joint_vocab)
        for path in (src_path, tgt_path):
            if not path.is_file():
                raise InputError(f"run_dir must hold the run's {path.name}; {run_dir} has none")
        src_tok = TextTokenizer.load(src_path)
        tgt_tok = src_tok if recipe.text.joint_vocab else TextTokenizer.load(tgt_path)
        model = self.build_model(recipe, (src_tok, tgt_tok))
        folder = load_weights(run_dir, model, checkpoint)
        return TrainedRun(self, run_dir, recipe, model.eval(), folder, tokenizer=src_tok, target_tokenizer=tgt_tok)

    def evaluate(self, run: TrainedRun, *, device: str = "auto", batch_size: int | None = None,
                 data: str | Path | None = None) -> dict[str, Any]:
        """Token accuracy and loss (teacher-forced) and the BLEU of the beam-search
        translations on the test set, decoded as the recipe says (``batch_size``:
        sentences per decoding batch; the result does not depend on it). ``data``: pairs of
        one's own instead: a TSV file of ``source<TAB>target`` lines, or a folder holding
        ``test.SRC`` and ``test.TGT`` for the run's language codes."""
        pairs = _load_split(run.recipe, "test") if data is None else _pairs_of(Path(data), run.recipe.data)
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

    def report_items(self, run_dir: Path, *, device: str = "auto") -> list[Any]:
        """The first test sentences with the run's translations (read from
        ``translations.test.txt``: nothing is translated again)."""
        recipe = read_recipe(run_dir)
        path = run_dir / "translations.test.txt"
        if not path.is_file():
            raise InputError(f"run_dir must hold translations.test.txt (written at the end of training); "
                             f"{run_dir} has none")
        hyps = path.read_text(encoding="utf-8").splitlines()
        pairs = _load_split(recipe, "test")
        rows = [(s, r, h) for (s, r), h in zip(pairs[:8], hyps[:8])]
        return [SampleTable("Sample translations", "The first test sentences (test_2016_flickr) with the run's "
                            "beam-search translations.", ("source", "reference", "translation"), rows)]

    @torch.no_grad()
    def attention_views(self, run: TrainedRun, inputs: Sequence[Any] | None, *, max_inputs: int = 2,
                        queries: Sequence[tuple[int, int]] | None = None) -> list[Any]:
        if queries is not None:
            raise InputError(f"queries (--query) choose BoTNet query pixels; run {run.run_dir} is a {self.name} run")
        texts = check_texts(inputs, self.name) if inputs is not None else \
            [s for s, _ in _load_split(run.recipe, "test")[:max_inputs]]
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
