"""The lab's models: each one the command line named, loaded once, and what the page asks of it.

* :meth:`LabModel.analyze`: the explorer's page data for a text (every layer and head, the
  per-head figures and roles; a decoder's next tokens after each position);
* :meth:`LabModel.next_tokens`: a decoder's candidates for the next token under temperature,
  top-k and top-p, and its loss on the text, with chosen heads switched off;
* :meth:`LabModel.step`: one head's arithmetic for one query token (:mod:`.steps`).

A model serves one request at a time (its lock): switching heads off changes its weights for
one pass. Every input is bounded before the model sees it (:data:`MAX_CHARS`, :data:`MAX_TOKENS`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ..errors import InputError
from ..models.packaged import resolve_packaged
from ..models.processors import processors_for
from ..models.sampling import check_generation
from ..tasks.base import check_text
from ..viz.ablation import heads_removed, next_token_loss
from ..viz.explorer.documents import document_of
from ..viz.explorer.page import FORMAT
from ..viz.explorer.targets import Target, load_target, target_views
from .steps import head_step

__all__ = ["LabModel", "MAX_CHARS", "MAX_TOKENS", "load_models"]

MAX_CHARS = 2000  # a text the page sends, in characters ...
MAX_TOKENS = 256  # ... and in tokens: the matrices a layer sends grow with its square
CANDIDATES = 10  # next-token candidates shown


@dataclass
class LabModel:
    """One model of the lab: ``name`` as the command line gave it, the loaded ``target``."""

    name: str
    target: Target
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def decoder(self) -> bool:
        run = self.target.run
        return run is not None and run.task.outputs == "text" and hasattr(run.model, "keeps_cache")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.target.title, "subtitle": self.target.subtitle,
                "decoder": self.decoder}

    # ------------------------------------------------------------------ the views of a text
    def _view(self, text: str) -> Any:
        text = check_lab_text(text)
        [view] = target_views(self.target, [text], max_inputs=1, new_tokens=0)
        tokens = getattr(view, "tokens", None)
        if tokens is not None and len(tokens) > MAX_TOKENS:
            raise InputError(f"the text gives {len(tokens):,} tokens; the lab takes at most {MAX_TOKENS}")
        return view

    def analyze(self, text: str) -> dict[str, Any]:
        """The explorer's page data (format ``attnlab-explorer/1``) of ``text``: one document."""
        with self.lock:
            view = self._view(text)
            view.title = self.name
            return {"format": FORMAT, "title": self.name, "subtitle": self.target.subtitle, "notes": [],
                    "documents": [document_of(view)]}

    # ------------------------------------------------------------------ a decoder's next token
    def _decoder_ids(self, text: str) -> tuple[Any, list[int]]:
        if not self.decoder:
            raise InputError(f"{self.name} is not a language model: it has no next token")
        view = self._view(text)
        return view, list(view.ids)

    def next_tokens(self, text: str, *, temperature: float = 0.0, top_k: int | None = None,
                    top_p: float | None = None, off: Sequence[Sequence[int]] = ()) -> dict[str, Any]:
        """The candidates for the token after ``text``, ``[{token, id, prob}]`` (the
        probabilities after temperature, top-k and top-p; greedy: the plain softmax), the
        model's next-token loss on ``text`` (nats a token) and the layer and head of each head in
        ``off`` (``[layer index, head]``) switched off for this pass."""
        options = check_generation(temperature=temperature, **({"top_k": top_k} if top_k is not None else {}),
                                   **({"top_p": top_p} if top_p is not None else {}))
        run = self.target.run
        with self.lock:
            view, ids = self._decoder_ids(text)
            names = [name for name, _ in view.layers]
            removed: dict[str, list[int]] = {}
            for pair in off:
                if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(v, int) for v in pair)
                        and 0 <= pair[0] < len(names)):
                    raise InputError(f"off must list [layer, head] pairs with a layer in [0, {len(names) - 1}]; "
                                     f"got {pair!r}")
                removed.setdefault(names[pair[0]], []).append(pair[1])
            model = run.model  # type: ignore[union-attr]
            device = next(model.parameters()).device
            x = torch.tensor([ids], device=device)
            with torch.no_grad(), heads_removed(model, removed):
                logits = model(x).float()
            loss = float(next_token_loss(logits, x)[0]) if len(ids) > 1 else None
            last = logits[0, -1]
            tokenizer = run.task.tokenizer_of(run)  # type: ignore[union-attr]
            known = tokenizer.vocab_size
            processed = last[None].clone()
            for p in processors_for(temperature=options.get("temperature", 0.0), top_k=options.get("top_k"),
                                    top_p=options.get("top_p"), decodable=known):
                processed = p(x, processed)
            probs = F.softmax(processed[0], dim=-1)
            best = torch.topk(probs, min(CANDIDATES, int((probs > 0).sum())))
            candidates = [{"id": int(i), "token": tokenizer.decode([int(i)]), "prob": round(float(p), 6)}
                          for p, i in zip(best.values, best.indices)]
            return {"candidates": candidates, "loss": loss, "tokens": len(ids), "off": [list(p) for p in off]}

    # ------------------------------------------------------------------ one head, step by step
    def step(self, text: str, layer: int, head: int, query: int) -> dict[str, Any]:
        """:func:`~attnlab.lab.steps.head_step` of ``head`` of the ``layer``-th attention layer for
        the token at ``query``, with the layer's real input on ``text``."""
        run = self.target.run
        if run is None or not self.decoder:
            raise InputError(f"{self.name}: one head step by step is shown for language models")
        with self.lock:
            view, ids = self._decoder_ids(text)
            names = [name for name, _ in view.layers]
            if not (isinstance(layer, int) and 0 <= layer < len(names)):
                raise InputError(f"layer must be in [0, {len(names) - 1}]; got {layer!r}")
            model = run.model
            module = model.get_submodule(names[layer])
            seen: dict[str, Any] = {}

            def keep(_module: Any, args: tuple, kwargs: dict) -> None:
                seen["x"], seen["positions"] = args[0], kwargs.get("positions")

            handle = module.register_forward_pre_hook(keep, with_kwargs=True)
            try:
                with torch.no_grad():
                    model(torch.tensor([ids], device=next(model.parameters()).device))
            finally:
                handle.remove()
            positions = seen["positions"]
            if positions is not None and positions.dim() == 2:
                positions = positions[0]
            out = head_step(module, seen["x"], head, query, positions=positions)
            return {**out, "layer": layer, "layer_name": names[layer], "tokens": view.tokens}


def check_lab_text(text: Any) -> str:
    """``text`` as the lab takes it: a non-empty text of at most :data:`MAX_CHARS` characters."""
    if not isinstance(text, str) or not text.strip():
        raise InputError("text must be a non-empty text")
    if len(text) > MAX_CHARS:
        raise InputError(f"text has {len(text):,} characters; the lab takes at most {MAX_CHARS:,}")
    check_text(text, "text")
    return text


def load_models(names: Sequence[str], *, device: str = "cpu") -> list[LabModel]:
    """Each model the command line named (a run, a Hugging Face folder, a GGUF file, a packaged
    model's name), loaded once; two of the same name are refused."""
    if not names:
        raise InputError("MODEL: name at least one model (a run directory, a Hugging Face folder, a GGUF file or "
                         "a packaged model such as smollm2-135m-instruct)")
    if len(set(names)) != len(names):
        raise InputError(f"MODEL: each model once; got {', '.join(names)}")
    return [LabModel(name, load_target(resolve_packaged(name), device=device)) for name in names]
