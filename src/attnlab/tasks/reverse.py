"""A synthetic sequence task that trains in a minute on a CPU: reverse a string of tokens.

It exercises the whole encoder-decoder path (padding masks, causal decoder, tied
embeddings, greedy and beam-search generation with the cache) on data that needs no
download, through the same engine, run directory and protocol as the other tasks, and
reports exact-match accuracy. ``attnlab demo`` trains it; ``attnlab train demo-reverse``
too, into a run directory that ``predict`` and ``visualize`` then read.

Strings are token ids ``FIRST..vocab_size-1`` (0, 1 and 2 are padding, begin and end);
as text they are written as numbers separated by spaces: ``"5 9 3"`` -> ``"3 9 5"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from ..data.kinds.reversal import BOS, EOS, FIRST, PAD, ReverseConfig, ReverseDataset
from ..data.source import Splits, source_of
from ..engine.device import select_device
from ..engine.trainer import evaluate_model
from ..errors import InputError
from ..run.recipe import ModelConfig, Recipe
from ..run.task import Prepared, Task, check_texts, register_task
from ..run.trained import TrainedRun
from .seq2seq import SEQ2SEQ_KEY_HELP, seq2seq_alignment, strip_padding
from ..run.views import TextPrediction

__all__ = ["ReverseRecipe", "Reverse", "exact_match"]


@dataclass
class GenerateConfig:
    num_beams: int = field(default=4, metadata={"min": 1})  # the beam search reported beside greedy decoding


@dataclass
class ReverseRecipe(Recipe):
    task: str = "reverse"
    data: ReverseConfig = field(default_factory=ReverseConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig("transformer_tiny", {"drop_rate": 0.0}))
    generate: GenerateConfig = field(default_factory=GenerateConfig)


def exact_match(pred: Tensor, strings: list[list[int]]) -> float:
    """The share of generated rows that are exactly the reversed string and ``EOS``."""
    hits = sum(strip_padding(row, PAD) == s[::-1] + [EOS] for row, s in zip(pred.tolist(), strings))
    return hits / max(len(strings), 1)


def _parse(text: str, vocab_size: int) -> list[int]:
    try:
        ids = [int(t) for t in text.split()]
    except ValueError:
        raise InputError(f"a reversal input must be token ids separated by spaces (e.g. '5 9 3'); got {text!r}") from None
    if not ids or not all(FIRST <= i < vocab_size for i in ids):
        raise InputError(f"a reversal input must hold token ids in [{FIRST}, {vocab_size}); got {text!r}")
    return ids


@register_task
class Reverse(Task):
    name = "reverse"
    recipe_class = ReverseRecipe
    summary = "reverse random token strings (synthetic, no download): the demo"
    inputs = "texts"
    outputs = "text"
    sample_unit = "strings"
    fixed_on_resume = ("task", "model", "train.optimizer")
    key_help = {**SEQ2SEQ_KEY_HELP,
                "model.checkpoint": "weights to start from: an attnlab reverse run directory or a state dict of this "
                                    "model"}

    def model_options(self, recipe: Recipe, info: Any = None) -> dict[str, Any]:
        v = recipe.data.vocab_size
        return {"src_vocab_size": v, "tgt_vocab_size": v, "max_len": 64, "pad_id": PAD, "bos_id": BOS, "eos_id": EOS}

    def metric_rows(self, metrics: dict[str, Any]) -> list[tuple[str, str]]:
        beams = metrics.get("num_beams", 4)
        return [("exact match, greedy", f"{100 * metrics['exact_match_greedy']:.1f}%"),
                (f"exact match, beam {beams}", f"{100 * metrics['exact_match_beam']:.1f}%"),
                ("test token accuracy", f"{100 * metrics['test_accuracy']:.2f}%"),
                ("test loss", f"{metrics['test_loss']:.4f}")]

    def _test(self, recipe: Recipe) -> ReverseDataset:
        return source_of(recipe.data).load_test(recipe.data)

    def prepare(self, recipe: Recipe, run_dir: Path, data: Splits, log: Callable[[str], None]) -> Prepared:
        return Prepared(data.train, None, data.test)

    def score(self, recipe: Recipe, run_dir: Path, model: nn.Module, prepared: Prepared, data: Splits,
              log: Callable[[str], None]) -> dict[str, Any]:
        return self._exact_match(model, recipe, prepared.test)

    @torch.no_grad()
    def _exact_match(self, model: nn.Module, recipe: Recipe, test: ReverseDataset) -> dict[str, Any]:
        model.eval()
        strings = test.strings(range(len(test)))
        src = test.get_batch(list(range(len(test))))[0]["src"].to(next(model.parameters()).device)
        new = recipe.data.max_length + 1
        beams = recipe.generate.num_beams
        return {"exact_match_greedy": exact_match(model.generate(src, max_new_tokens=new).cpu(), strings),
                "exact_match_beam": exact_match(model.generate(src, max_new_tokens=new, num_beams=beams).cpu(),
                                                strings),
                "num_beams": beams}

    def evaluate(self, run: TrainedRun, *, device: str = "auto", data: str | Path | None = None) -> dict[str, Any]:
        if data is not None:
            raise InputError(f"the {self.name} demo makes its own data; it takes no --data")
        cfg, test = run.recipe.train, self._test(run.recipe)
        res = evaluate_model(run.model, test, batch_size=cfg.batch_size, device=device, precision=run.precision)
        return {"test_accuracy": res["accuracy"], "test_loss": res["loss"], "test_samples": res["samples"],
                **self._exact_match(run.model, run.recipe, test)}

    @torch.no_grad()
    def predict(self, run: TrainedRun, inputs: Sequence[str], *, num_beams: int | None = None,
                max_length: int | None = None, batch_size: int = 64, device: str | None = None) -> list[TextPrediction]:
        """``inputs``: strings of token ids (``"5 9 3"``); each gets the model's reversal, in
        batches of ``batch_size``, with at most ``max_length`` tokens (default: the input's
        length and the end token)."""
        strings = [_parse(text, run.recipe.data.vocab_size) for text in check_texts(inputs, self.name)]
        model = run.model.to(select_device(device) if device else run.device).eval()
        dev = next(model.parameters()).device
        out = []
        for start in range(0, len(strings), batch_size):
            chunk = strings[start : start + batch_size]
            src = torch.full((len(chunk), max(map(len, chunk))), PAD, dtype=torch.long)
            for row, ids in enumerate(chunk):
                src[row, : len(ids)] = torch.tensor(ids)
            new = max_length or src.shape[1] + 1
            hyps = model.generate(src.to(dev), max_new_tokens=new, num_beams=num_beams or run.recipe.generate.num_beams)
            out += [" ".join(str(i) for i in strip_padding(h, PAD) if i != EOS) for h in hyps.tolist()]
        return [TextPrediction(text, o) for text, o in zip(inputs, out)]

    @torch.no_grad()
    def attention_views(self, run: TrainedRun, inputs: Sequence[Any] | None, *, max_inputs: int = 2,
                        queries: Sequence[tuple[int, int]] | None = None) -> list[Any]:
        if queries is not None:
            raise InputError(f"queries (--query) choose BoTNet query pixels; run {run.run_dir} is a {self.name} run")
        strings = [_parse(t, run.recipe.data.vocab_size) for t in check_texts(inputs, self.name)] \
            if inputs is not None else self._test(run.recipe).strings(range(max_inputs))
        views = []
        for ids in strings:
            src = torch.tensor([ids], device=next(run.model.parameters()).device)
            hyp = strip_padding(run.model.generate(src, max_new_tokens=len(ids) + 1)[0].tolist(), PAD)
            names = lambda row: ["<eos>" if i == EOS else str(i) for i in row]  # noqa: E731
            views.append(seq2seq_alignment(run.model, ids, names(ids), hyp, names(hyp),
                                           f"{' '.join(map(str, ids))} -> {' '.join(names(hyp))}"))
        return views
