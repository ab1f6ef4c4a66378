"""The attention explorer: every head of every layer of a model, in one self-contained HTML
page that opens from the disk (``attnlab explore TARGET [INPUT ...]``).

::

    from attnlab.viz import explore
    page = explore("runs/shakespeare", ["ROMEO:"])      # a run directory, its task's inputs
    page.save("shakespeare.html")
    explore("checkpoints/gpt2", ["The cat sat on the"])   # a Hugging Face folder
    explore(model, torch.randint(0, 100, (1, 12)))        # any model in Python, on a batch
    page                                                   # in a notebook: shown inline

The weights come from :func:`~attnlab.attention.capture_attention`, the one route to them;
the page (:mod:`.page`) holds them 8 bits a value. Views: heads as lines between tokens, the
grid of every layer by every head, matrices with their values and per-head figures, a
picture's patches, a translation's three attentions, a language model's continuation with
its next-token candidates.
"""

from __future__ import annotations

import html
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from ...attention.capture import attention_modules, capture_attention
from ...errors import AttentionUnavailable, InputError
from ...io import atomic_write_bytes
from ...run.views import GenerationAttention
from ..ablation import head_ablation
from .documents import document_of, tensor_documents
from .page import FORMAT, decode_weights, encode_weights, render_page
from .targets import check_inputs, load_target, target_views

__all__ = ["Exploration", "explore", "encode_weights", "decode_weights", "default_output"]

MAX_NEW_TOKENS = 4096
LANGUAGES = ("en", "zh")  # the page's own texts (explorer.js: TEXTS)


class Exploration:
    """An explorer page's data (``.data``, the format of :mod:`.page`) and its HTML
    (:meth:`html`, :meth:`save`); a notebook shows it inline."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def html(self) -> str:
        return render_page(self.data)

    def save(self, path: str | Path, *, force: bool = False) -> Path:
        """Write the page to ``path`` (atomically); an existing file is replaced only with ``force``."""
        path = Path(path).expanduser()
        check_output(path, force)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, self.html().encode("utf-8"))
        return path

    def _repr_html_(self) -> str:  # Jupyter: the page in a frame of its own, its script apart from the notebook's
        return (f'<iframe srcdoc="{html.escape(self.html(), quote=True)}" style="width:100%;height:760px;'
                f'border:1px solid #ddd" sandbox="allow-scripts"></iframe>')

    def __repr__(self) -> str:
        docs = self.data["documents"]
        return f"<Exploration {self.data['title']!r}: {len(docs)} input{'s' if len(docs) != 1 else ''}>"


def check_output(path: Path, force: bool) -> None:
    """Refuse an output path that exists (unless ``force``) or is a folder."""
    if path.is_dir():
        raise InputError(f"--out must be a file path for the page; {path} is a folder")
    if path.exists() and not force:
        raise InputError(f"--out {path} exists; pass --force to replace it")


def default_output(target: str | Path) -> Path:
    """Where ``attnlab explore TARGET`` writes by default: ``RUN/explore.html`` for a run
    directory (beside its report.html), ``FOLDER.explore.html`` beside a Hugging Face folder
    (whose own folder may be a read-only download)."""
    path = Path(target).expanduser()
    if (path / "config.yaml").is_file():
        return path / "explore.html"
    return path.parent / f"{path.name}.explore.html"


def _check_language(lang: Any) -> str:
    if not isinstance(lang, str) or lang not in LANGUAGES:
        raise InputError(f"lang must be one of {', '.join(map(repr, LANGUAGES))}; got {lang!r}")
    return lang


def _check_count(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(f"{name} must be an integer from {low} to {high}; got {value!r}")
    return value


def explore(target: Any, inputs: Any = None, *, tokens: Sequence[Sequence[str]] | None = None,
            max_inputs: int = 2, new_tokens: int = 20, checkpoint: str = "auto", device: str = "cpu",
            title: str | None = None, ablate: bool = False, lang: str = "en") -> Exploration:
    """The explorer page of ``target`` on ``inputs``.

    Args:
        target: a run directory (``attnlab train``'s), a Hugging Face folder that
            :func:`~attnlab.formats.from_hf` reads, a loaded :class:`~attnlab.tasks.TrainedRun`,
            or any ``nn.Module`` with attention that records weights.
        inputs: what the target's task takes: texts for classifiers and language models, a
            source sentence for translation, image files for image models (``None``: the
            run's first test examples, or its recipe's prompts). For a module: a tensor (its
            one argument), a tuple of arguments or a dict of keyword arguments.
        tokens: for a module, the labels of each input row's positions (default 0, 1, ...).
        max_inputs: how many test examples when ``inputs`` is None.
        new_tokens: how many tokens a language model adds to each prompt, greedily.
        checkpoint: a run's ``"auto"``, ``"best"``, ``"last"``, ``"averaged"`` or a checkpoint folder.
        device: ``"cpu"`` (default), ``"cuda"``, ... or ``"auto"``.
        title: the page's title (default: the target's name).
        ablate: for a language model, add to each head's row the change in the model's loss on
            the input shown when that head's output is removed (one batched pass a layer:
            :func:`attnlab.viz.ablation.head_ablation`).
        lang: the language the page opens in, ``"en"`` or ``"zh"`` (its own labels and captions;
            a button on the page switches). The model's tokens and names are shown as they are.

    Raises:
        InputError: a target that is neither a run, a folder nor a module; inputs of the wrong
            kind or empty texts; a model whose attention records no weights; a ``lang`` other
            than ``"en"`` or ``"zh"``.
    """
    _check_language(lang)
    _check_count(max_inputs, "max_inputs", 1, 64)
    _check_count(new_tokens, "new_tokens", 0, MAX_NEW_TOKENS)
    if isinstance(target, nn.Module):
        return _explore_module(target, inputs, tokens, title or type(target).__name__, lang)
    if tokens is not None:
        raise InputError("tokens labels a module's inputs; a run or a folder labels its own tokens")
    inputs = check_inputs(inputs)  # before anything is loaded
    loaded = load_target(target, checkpoint=checkpoint, device=device, has_inputs=inputs is not None)
    with warnings.catch_warnings(record=True) as caught:  # capture's note on kinds that form no weights
        warnings.simplefilter("always")
        views = target_views(loaded, inputs, max_inputs=max_inputs, new_tokens=new_tokens)
    notes = [str(w.message) for w in caught if "never form" in str(w.message)]
    documents = []
    for view in views:
        ablation = None
        if ablate and isinstance(view, GenerationAttention):
            model = loaded.run.model
            ids = torch.tensor([view.ids], device=next(model.parameters()).device)
            ablation = head_ablation(model, ids, [name for name, _ in view.layers])
        documents.append(document_of(view, ablation))
    if ablate and not any(isinstance(v, GenerationAttention) for v in views):
        notes.append("head removal (ablate) applies to language models: this target's loss is not a next-token loss")
    return Exploration({"format": FORMAT, "title": title or loaded.title, "subtitle": loaded.subtitle,
                        "notes": notes, "lang": lang, "documents": documents})


@torch.no_grad()
def _explore_module(model: nn.Module, inputs: Any, tokens: Sequence[Sequence[str]] | None,
                    title: str, lang: str) -> Exploration:
    recordable, opaque = attention_modules(model)
    if not recordable:
        what = (f"its attention ({', '.join(n or type(m).__name__ for n, m in opaque[:3])}) forms no weight matrix"
                if opaque else "it has no attention module that records weights")
        raise AttentionUnavailable(f"{type(model).__name__} records no attention: {what}", reason=what)
    if inputs is None:
        raise InputError("inputs must be given for a module: a tensor, a tuple of arguments or a dict of keyword "
                         "arguments")
    if isinstance(inputs, Tensor):
        args, kwargs = (inputs,), {}
    elif isinstance(inputs, tuple):
        args, kwargs = inputs, {}
    elif isinstance(inputs, dict):
        args, kwargs = (), inputs
    else:
        raise InputError(f"inputs must be a tensor, a tuple of arguments or a dict of keyword arguments for a "
                         f"module; got {type(inputs).__name__}")
    was_training = model.training
    model.eval()
    try:
        with capture_attention(model, include=[n for n, _ in recordable], cpu=True) as maps:
            model(*args, **kwargs)
    finally:
        model.train(was_training)
    notes = [f"{name or type(m).__name__} ({type(m).__name__}): this attention forms no weight matrix; not shown"
             for name, m in opaque]
    return Exploration({"format": FORMAT, "title": title, "subtitle": f"{type(model).__name__}, "
                        f"{sum(p.numel() for p in model.parameters()):,} parameters", "notes": notes, "lang": lang,
                        "documents": tensor_documents({name or type(m).__name__: maps[name] for name, m in recordable},
                                                      tokens, title, [])})
