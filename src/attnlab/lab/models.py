"""The lab's models: each one the command line named, loaded once, and what the page asks of it.

* :meth:`LabModel.analyze`: the explorer's page data for a text (every layer and head, the
  per-head figures and roles; a decoder's next tokens after each position);
* :meth:`LabModel.next_tokens`: a decoder's candidates for the next token under temperature,
  top-k and top-p, and its loss on the text, with chosen heads switched off;
* :meth:`LabModel.step`: one head's arithmetic for one query token (:mod:`.steps`);
* :meth:`LabModel.analyze_image`: an image model's views of an uploaded image (its patches, each
  layer's attention and the rollout over them).

A model serves one request at a time (its lock): switching heads off changes its weights for
one pass. Every input is bounded before the model sees it (:data:`MAX_CHARS`, :data:`MAX_TOKENS`).
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, UnidentifiedImageError

from ..attention.capture import attention_modules
from ..errors import InputError
from ..formats.packaged import resolve_packaged
from ..generation.processors import processors_for
from ..generation.sampling import check_generation
from ..run.task import check_text
from ..run.views import token_labels
from ..viz.ablation import heads_removed, next_token_loss
from ..viz.explorer.documents import document_of
from ..viz.explorer.page import FORMAT
from ..viz.explorer.targets import Target, load_target, target_views
from .steps import head_step

__all__ = ["LabModel", "START_TEXT", "MAX_CHARS", "MAX_IMAGE_BYTES", "MAX_IMAGE_SIDE", "MAX_TOKENS", "load_models", "open_upload",
           "drawn_picture"]

MAX_CHARS = 2000  # a text the page sends, in characters ...
MAX_TOKENS = 256  # ... and in tokens: the matrices a layer sends grow with its square
MAX_IMAGE_BYTES = 8 * 1024 * 1024  # an uploaded image file ...
MAX_IMAGE_SIDE = 4096  # ... and its pixels a side, read from its header before it is decoded
CANDIDATES = 10  # next-token candidates shown
START_TEXT = "The cat sat on the mat. The cat sat on the"  # a repeat: induction heads show at once


@dataclass
class LabModel:
    """One model of the lab: ``name`` as the command line gave it, the loaded ``target``."""

    name: str
    target: Target
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def reads(self) -> str:
        """``"images"`` (a ViT folder, an image-classification run) or ``"texts"``."""
        run = self.target.run
        images = self.target.family == "vit" or (run is not None and run.task.inputs == "images")
        return "images" if images else "texts"

    @property
    def decoder(self) -> bool:
        run = self.target.run
        return run is not None and run.task.outputs == "text" and hasattr(run.model, "keeps_cache")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.target.title, "subtitle": self.target.subtitle,
                "decoder": self.decoder, "reads": self.reads}

    def first(self, text: str) -> dict[str, Any]:
        """The page data the lab opens with: :meth:`analyze` of ``text``; an image model's
        first test image when its run's data is here, else :func:`drawn_picture`."""
        if self.reads == "texts":
            return self.analyze(text)
        if self.target.run is not None:
            try:
                with self.lock:
                    [view] = target_views(self.target, None, max_inputs=1, new_tokens=0)
                return self._page(view)
            except InputError:  # its data is not on this machine: a picture of the lab's own
                pass
        return self.analyze_image(drawn_picture(), "a drawn picture (upload one of your own)")

    # ------------------------------------------------------------------ the views of a text
    def _view(self, text: str) -> Any:
        if self.reads != "texts":
            raise InputError(f"{self.name} reads images, not text: upload an image")
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
            return self._page(view)

    def _page(self, view: Any) -> dict[str, Any]:
        return {"format": FORMAT, "title": self.name, "subtitle": self.target.subtitle, "notes": [],
                "documents": [document_of(view)]}

    # ------------------------------------------------------------------ an image model's views
    def analyze_image(self, data: bytes | Image.Image, name: str = "your image") -> dict[str, Any]:
        """The explorer's page data of the image ``data`` (a file's bytes, checked by
        :func:`open_upload`, or an image): the image as the model reads it, its patches, each
        layer's attention and the rollout over them; the title says the model's prediction."""
        if self.reads != "images":
            raise InputError(f"{self.name} reads text, not images: type a sentence")
        image = data if isinstance(data, Image.Image) else open_upload(data)
        with self.lock:
            [view] = target_views(self.target, [image], max_inputs=1, new_tokens=0)
        view.title = f"{name}{view.title[len('the image'):]}" if view.title.startswith("the image") else name
        return self._page(view)

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


def open_upload(data: bytes) -> Image.Image:
    """The image file ``data`` (an upload), decoded once its size and its pixels (read from its
    header, before decoding) are within :data:`MAX_IMAGE_BYTES` and :data:`MAX_IMAGE_SIDE`."""
    if not isinstance(data, (bytes, bytearray)) or not data:
        raise InputError("image: the upload is empty; choose an image file")
    if len(data) > MAX_IMAGE_BYTES:
        raise InputError(f"image: the file has {len(data):,} bytes; the lab takes at most {MAX_IMAGE_BYTES:,}")
    readable = "an image file Pillow reads (PNG, JPEG, GIF, WebP, BMP, ...)"
    try:
        image = Image.open(io.BytesIO(data))  # reads the header only
    except Image.DecompressionBombError:  # a header Pillow itself refuses; not an OSError
        raise InputError(f"image: too many pixels to decode safely; the lab takes at most {MAX_IMAGE_SIDE} a "
                         f"side") from None
    except UnidentifiedImageError:
        raise InputError(f"image: the file is not {readable}") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise InputError(f"image: the file is not {readable}: {exc}") from None
    width, height = image.size
    if max(width, height) > MAX_IMAGE_SIDE:
        raise InputError(f"image: {width}x{height} pixels; the lab takes at most {MAX_IMAGE_SIDE} a side (the model "
                         f"reads it much smaller: downscale it)")
    try:
        image.load()
    except (OSError, ValueError, SyntaxError) as exc:  # cut short, or damaged
        raise InputError(f"image: the file is not {readable}: {exc}") from None
    return image


def drawn_picture(size: int = 224) -> Image.Image:
    """A picture the lab opens an image model with when no image of its data is here: a house
    under the sun on a green field, shapes whose patches a model's heads can be seen to follow."""
    image = Image.new("RGB", (size, size), (135, 190, 235))
    draw = ImageDraw.Draw(image)
    u = size / 16
    draw.rectangle([0, 11 * u, size, size], fill=(80, 160, 70))
    draw.ellipse([11 * u, 1.5 * u, 14.5 * u, 5 * u], fill=(250, 215, 60))
    draw.rectangle([3 * u, 7.5 * u, 9 * u, 12.5 * u], fill=(200, 70, 50))
    draw.polygon([(2.2 * u, 7.6 * u), (6 * u, 4 * u), (9.8 * u, 7.6 * u)], fill=(110, 60, 40))
    draw.rectangle([5.3 * u, 10 * u, 6.7 * u, 12.5 * u], fill=(60, 40, 30))
    return image


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
    models = [LabModel(name, load_target(resolve_packaged(name), device=device)) for name in names]
    for model in models:  # what the page opens with, once: a model the lab cannot show is said now, not in the page
        try:
            model.first(START_TEXT)
        except InputError as exc:
            raise InputError(f"MODEL {model.name}: the lab cannot show it: {exc}") from None
    return models
