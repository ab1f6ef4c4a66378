"""Multi30k German-to-English translation: BPE, a Transformer trained by the engine with
label smoothing, optional checkpoint averaging, beam search, and BLEU on the test set.

A run directory gains, beside the engine's files::

    tokenizer.json                    joint vocabulary (text.joint_vocab: true), or
    tokenizer.src.json, tokenizer.tgt.json   one per language
    checkpoints/averaged/             mean of the last translate.average_checkpoints checkpoints
    translations.test.txt             the test set's beam-search translations, one per line

``results.json`` holds the test token accuracy and loss (teacher-forced), and the BLEU
of the beam-search translations of ``test_2016_flickr``:

* ``bleu``: sacreBLEU, detokenized and case-sensitive (its default ``13a`` tokenizer), the
  standard figure for this task;
* ``bleu_lowercase``: the same with ``lowercase=True``, i.e. BLEU of lower-cased text
  split by the ``13a`` tokenizer: the lower-cased tokenized measure that tutorials report
  on Multi30k (they split with spaCy instead, which also splits clitics such as ``'s``).
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from ..data.multi30k import load_multi30k
from ..data.tokenize import TextTokenizer
from ..data.translation import TranslationDataset
from ..engine import distributed
from ..engine.checkpoint import average_checkpoints, checkpoint_step, list_checkpoints, save_named_checkpoint
from ..engine.device import select_device
from ..errors import InputError
from ..io import atomic_write_bytes
from ..models import create_model
from ..recipes import Recipe
from .common import load_weights, open_run, read_recipe, train_and_test, write_report_safely

__all__ = ["run", "load_run", "translate", "translate_as_recipe", "translate_texts", "bleu_scores", "evaluate_run"]


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


def build_tokenizers(recipe: Recipe, pairs: Sequence[tuple[str, str]]) -> tuple[TextTokenizer, TextTokenizer]:
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


def build_model(recipe: Recipe, src_tok: TextTokenizer, tgt_tok: TextTokenizer) -> nn.Module:
    ids = {"pad_id": tgt_tok.pad_id, "bos_id": tgt_tok.bos_id, "eos_id": tgt_tok.eos_id}
    if src_tok.pad_id != tgt_tok.pad_id:
        raise InputError(f"source and target tokenizers must share the [PAD] id; got {src_tok.pad_id} and "
                         f"{tgt_tok.pad_id}")
    options = {"max_len": max(recipe.text.max_length, 64) + 64, "share_embeddings": src_tok is tgt_tok,
               **ids, **recipe.model.options}
    return create_model(recipe.model.name, src_vocab_size=src_tok.vocab_size, tgt_vocab_size=tgt_tok.vocab_size,
                        **options)


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


# ----------------------------------------------------------------------------- a run


def _datasets(recipe: Recipe, src_tok: TextTokenizer, tgt_tok: TextTokenizer,
              splits: dict[str, list[tuple[str, str]]]) -> dict[str, TranslationDataset]:
    n = recipe.text.max_length
    return {name: TranslationDataset(pairs, src_tok, tgt_tok, n, n) for name, pairs in splits.items()}


def _load_split(recipe: Recipe, split: str) -> list[tuple[str, str]]:
    return load_multi30k(split, recipe.data.data_dir, recipe.data.source, recipe.data.target)


def run(recipe: Recipe, run_dir: str | Path, *, resume: bool = False, allow_changes: bool = False,
        log=print) -> dict[str, Any]:
    """Train and test ``recipe`` on Multi30k into ``run_dir``; returns ``results.json``'s content
    (see :func:`~attnlab.tasks.common.open_run` for ``resume`` and ``allow_changes``)."""
    run_dir = Path(run_dir)
    with open_run(recipe, run_dir, resume=resume, allow_changes=allow_changes, log=log) as resume_from:
        return _run(recipe, run_dir, resume_from, log)


def _run(recipe: Recipe, run_dir: Path, resume_from: Path | None, log) -> dict[str, Any]:
    splits = {name: _load_split(recipe, name) for name in ("train", "val", "test")}
    src_path, tgt_path = _tokenizer_paths(run_dir, recipe.text.joint_vocab)
    if src_path.is_file() and tgt_path.is_file():  # the resumed weights belong to these vocabularies
        src_tok = TextTokenizer.load(src_path)
        tgt_tok = src_tok if recipe.text.joint_vocab else TextTokenizer.load(tgt_path)
    else:
        src_tok, tgt_tok = build_tokenizers(recipe, splits["train"])
        if distributed.is_main():
            src_tok.save(src_path)
            if tgt_tok is not src_tok:
                tgt_tok.save(tgt_path)
    data = _datasets(recipe, src_tok, tgt_tok, splits)
    extra = {"train_size": len(data["train"]), "dev_size": len(data["val"]), "test_size": len(data["test"]),
             "src_vocab_size": src_tok.vocab_size, "tgt_vocab_size": tgt_tok.vocab_size,
             "joint_vocab": src_tok is tgt_tok, "metric": "token accuracy (teacher forcing)"}
    results = train_and_test(recipe, run_dir, lambda: build_model(recipe, src_tok, tgt_tok), data["train"],
                             data["val"], data["test"], resume_from=resume_from, log=log,
                             extra=extra, report=False)  # written below, once BLEU is in results.json
    if not distributed.is_main():
        return results
    tr = recipe.translate
    averaged = average_last_checkpoints(run_dir, tr.average_checkpoints)
    if averaged is not None:
        log(f"averaged the weights of the last {tr.average_checkpoints} checkpoints into {averaged}")
    model = build_model(recipe, src_tok, tgt_tok)
    folder = load_weights(run_dir, model, tr.checkpoint)
    start = time.perf_counter()
    sources, references = zip(*splits["test"])
    hyps = translate_as_recipe(recipe, model, src_tok, tgt_tok, sources, batch_size=tr.batch_size,
                               device=recipe.train.device)
    seconds = time.perf_counter() - start
    atomic_write_bytes(run_dir / "translations.test.txt", ("\n".join(hyps) + "\n").encode())
    scores = bleu_scores(hyps, references)
    log(f"test_2016_flickr BLEU {scores['bleu']:.2f} (sacreBLEU, cased), {scores['bleu_lowercase']:.2f} "
        f"(lower-cased); beam {tr.num_beams}, {len(hyps) / seconds:.1f} sentences/s, weights {folder.name}")
    results.update(scores, num_beams=tr.num_beams, translate_seconds=seconds, bleu_checkpoint=folder.name)
    atomic_write_bytes(run_dir / "results.json", json.dumps(results, indent=1).encode())
    write_report_safely(run_dir, log)
    return results


# ---------------------------------------------------------------------------- a finished run


def load_run(run_dir: str | Path, checkpoint: str = "auto") -> tuple[Recipe, TextTokenizer, TextTokenizer, nn.Module, Path]:
    """``(recipe, source tokenizer, target tokenizer, model in eval mode, checkpoint folder)``.

    ``checkpoint="auto"``: the averaged weights when the run has them, else the best, else the last."""
    run_dir = Path(run_dir)
    recipe = read_recipe(run_dir)
    if recipe.task != "translation":
        raise InputError(f"run_dir must be a translation run; {run_dir} is a {recipe.task!r} run")
    src_path, tgt_path = _tokenizer_paths(run_dir, recipe.text.joint_vocab)
    for path in (src_path, tgt_path):
        if not path.is_file():
            raise InputError(f"run_dir must hold the run's {path.name}; {run_dir} has none")
    src_tok = TextTokenizer.load(src_path)
    tgt_tok = src_tok if recipe.text.joint_vocab else TextTokenizer.load(tgt_path)
    model = build_model(recipe, src_tok, tgt_tok)
    folder = load_weights(run_dir, model, checkpoint)
    return recipe, src_tok, tgt_tok, model.eval(), folder


def translate_texts(run_dir: str | Path, texts: Sequence[str], *, checkpoint: str = "auto", num_beams: int | None = None,
                    max_length: int | None = None, batch_size: int = 64, device: str = "auto") -> list[str]:
    """Translations of ``texts`` by a finished run (beam size from its recipe unless given)."""
    recipe, src_tok, tgt_tok, model, _ = load_run(run_dir, checkpoint)
    return translate_as_recipe(recipe, model, src_tok, tgt_tok, texts, num_beams=num_beams, max_length=max_length,
                               batch_size=batch_size, device=device)


def evaluate_run(run_dir: str | Path, checkpoint: str = "auto", batch_size: int = 64,
                 device: str = "auto") -> dict[str, Any]:
    """BLEU of a run's checkpoint on ``test_2016_flickr`` (beam search as in its recipe)."""
    recipe, src_tok, tgt_tok, model, folder = load_run(run_dir, checkpoint)
    sources, references = zip(*_load_split(recipe, "test"))
    hyps = translate_as_recipe(recipe, model, src_tok, tgt_tok, sources, batch_size=batch_size, device=device)
    return {**bleu_scores(hyps, references), "samples": len(hyps), "checkpoint": str(folder)}
