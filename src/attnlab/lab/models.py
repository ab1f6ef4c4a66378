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

from ..attention.capture import attention_modules
from ..errors import InputError
from ..models.packaged import resolve_packaged
from ..models.processors import processors_for
from ..models.sampling import check_generation
from ..tasks.base import check_text
from ..tasks.views import token_labels
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
        """The explorer's page data (format ``attnlab-explorer/1``) of ``text``: one document. A
        decoder's pass also keeps what the next questions about the same text need (its last
        logits, each attention layer's input), so that they run no pass of their own."""
        with self.lock:
            if not self.decoder:
                view = self._view(text)
            else:
                model = self.target.run.model  # type: ignore[union-attr]
                kept: dict[str, Any] = {"inputs": {}}
                hooks = [module.register_forward_pre_hook(_keep_input(kept["inputs"], name), with_kwargs=True)
                         for name, module in attention_modules(model)[0]]
                hooks.append(model.register_forward_hook(lambda m, a, k, out: kept.setdefault("logits", out),
                                                         with_kwargs=True))
                try:
                    view = self._view(text)
                finally:
                    for hook in hooks:
                        hook.remove()
                logits = kept.get("logits")
                if logits is not None and logits.shape[1] == len(view.ids):  # the prompt's one pass
                    self._kept = (tuple(view.ids), kept["inputs"], logits[0].float())
            view.title = self.name
            return {"format": FORMAT, "title": self.name, "subtitle": self.target.subtitle, "notes": [],
                    "documents": [document_of(view)]}

    def _kept_for(self, ids: list[int]) -> tuple[dict[str, Any], Any] | None:
        """The layers' inputs and the logits that the last :meth:`analyze` kept, when it read ``ids``."""
        kept = getattr(self, "_kept", None)
        return (kept[1], kept[2]) if kept is not None and kept[0] == tuple(ids) else None

    # ------------------------------------------------------------------ a decoder's next token
    def _decoder_ids(self, text: str) -> tuple[list[str], list[int]]:
        """The names of the decoder's attention layers that the views show (in their order), and
        the ids of ``text`` as its views read them: no views are made (a forward pass fewer)."""
        if not self.decoder:
            raise InputError(f"{self.name} is not a language model: it has no next token")
        run = self.target.run
        text = check_lab_text(text)
        ids = run.task.tokenizer_of(run).encode_prompt(text)[: run.recipe.text.context]  # type: ignore[union-attr]
        if not ids:
            raise InputError("text gives no token")
        if len(ids) > MAX_TOKENS:
            raise InputError(f"the text gives {len(ids):,} tokens; the lab takes at most {MAX_TOKENS}")
        if "layers" not in self.__dict__:
            self.__dict__["layers"] = [name for name, _ in attention_modules(run.model)[0]]  # type: ignore[union-attr]
        return self.__dict__["layers"], ids

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
            names, ids = self._decoder_ids(text)
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
            kept = None if removed else self._kept_for(ids)
            if kept is not None:  # the analysis of this text has its logits
                logits = kept[1][None]
            else:
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
        the token at ``query`` (negative: from the end), with the layer's real input on ``text``."""
        run = self.target.run
        if run is None or not self.decoder:
            raise InputError(f"{self.name}: one head step by step is shown for language models")
        with self.lock:
            names, ids = self._decoder_ids(text)
            if isinstance(query, int) and not isinstance(query, bool) and -len(ids) <= query < 0:
                query += len(ids)  # from the end: -1 is the last token
            if not (isinstance(layer, int) and 0 <= layer < len(names)):
                raise InputError(f"layer must be in [0, {len(names) - 1}]; got {layer!r}")
            model = run.model
            module = model.get_submodule(names[layer])
            kept = self._kept_for(ids)
            if kept is not None:  # the analysis of this text kept the layer's input
                seen = kept[0][names[layer]]
            else:
                inputs: dict[str, Any] = {}
                handle = module.register_forward_pre_hook(_keep_input(inputs, names[layer]), with_kwargs=True)
                try:
                    with torch.no_grad():
                        model(torch.tensor([ids], device=next(model.parameters()).device))
                finally:
                    handle.remove()
                seen = inputs[names[layer]]
            positions = seen["positions"]
            if positions is not None and positions.dim() == 2:
                positions = positions[0]
            out = head_step(module, seen["x"], head, query, positions=positions)
            tokenizer = run.task.tokenizer_of(run)
            tokens = token_labels(tokenizer.decode, ids, tokenizer.spelling)
            return {**out, "layer": layer, "layer_name": names[layer], "tokens": tokens}


def _keep_input(store: dict[str, Any], name: str) -> Any:
    """A forward pre-hook keeping an attention layer's input and positions under ``name``."""
    def keep(_module: Any, args: tuple, kwargs: dict) -> None:
        store.setdefault(name, {"x": args[0].detach(), "positions": kwargs.get("positions")})
    return keep


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
