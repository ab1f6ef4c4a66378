"""Attention pictures of a finished run: load it, run its model on a few inputs under
:func:`~attnlab.attention.capture_attention`, and draw what fits its model.

=====================  ========================================================  ==========================
run                    pictures (one set per input)                              files
=====================  ========================================================  ==========================
sentiment classifier   per layer: every head's token-to-token heatmap, the mean  ``NN_layerL.png``
ViT (hybrid too)       rollout and the last layer's class-token attention per    ``NN_vit.png``
                       head, over the image
BoTNet                 per BoT block: where the query pixels look, per head      ``NN_botnet_blockK.png``
translator             cross-attention (source x generated tokens), heads        ``NN_alignment.png``
                       averaged, one panel per decoder layer
=====================  ========================================================  ==========================

This module is the glue between a run directory and :mod:`attnlab.viz.attention`: it
reads runs through the tasks' ``load_run`` (imported inside the functions; the plotting
module itself knows nothing of runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from ..attention.capture import capture_attention
from ..attention.registry import attention_family
from ..errors import InputError
from .attention import (_printable, _short, alignment_figure, attention_rollout, image_attention_figure,
                        pixel_query_figure, token_heatmaps)

__all__ = ["visualize_run", "token_labels"]


# ----------------------------------------------------------------------------- checks
def _require_weights(run_dir: Path, kind: str, allowed: Sequence[str]) -> None:
    """A run whose attention forms no weight matrix has nothing to draw: say so."""
    if kind in allowed:
        return
    why = ("computes its output without forming the attention weights" if attention_family(kind) == "tokens"
           else "has weights that capture_attention does not record")
    raise InputError(f"run {run_dir} cannot be visualized: its attention kind {kind!r} {why}; "
                     f"visualize needs {' or '.join(repr(a) for a in allowed)} attention")


def _check_queries(queries: Sequence[Sequence[int]] | None) -> list[tuple[int, int]] | None:
    if queries is None:
        return None
    out = []
    for q in queries:
        if (not isinstance(q, (tuple, list)) or len(q) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in q)):
            raise InputError(f"queries must be (row, col) pairs of integers; got {q!r}")
        out.append((int(q[0]), int(q[1])))
    if not out:
        raise InputError("queries must hold at least one (row, col) pair, or be None; got none")
    return out


def _calls(maps: dict[str, list[Tensor]]) -> list[tuple[str, Tensor]]:
    """``(module name, weights of its first call)`` in model order, for the modules that ran."""
    return [(name, calls[0]) for name, calls in maps.items() if calls]


def token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Readable strings for token ids: WordPiece pieces as stored (``##ing``); byte-level
    BPE pieces decoded one by one (``Ġmann`` -> ``mann``, ``Ã¼`` -> ``ü``)."""
    tok = tokenizer.tokenizer
    out = []
    for i in ids:
        piece = tok.id_to_token(int(i)) or f"<{int(i)}>"
        if tokenizer.kind == "bpe":  # whitespace alone decodes to nothing: keep its byte-level mark
            piece = tok.decode([int(i)], skip_special_tokens=False).strip() or piece.replace("Ġ", "▁")
        out.append(_printable(piece))  # a byte-level piece may be a control character
    return out


# ----------------------------------------------------------------------------- text
def _mr_test_texts(recipe: Any, run_dir: Path, n: int) -> list[str]:
    from ..data.mr import load_mr, mr_folds, mr_split

    texts, labels = load_mr(recipe.data.data_dir)
    if recipe.data.protocol == "split":
        idx = mr_split(labels, seed=recipe.data.seed)[2]
    else:
        k = run_dir.name.removeprefix("fold_")
        if not k.isdigit() or not 0 <= int(k) < 10:
            raise InputError(f"run_dir of a cross-validation run must be a fold_<k> folder; got {run_dir}")
        idx = mr_folds(labels, 10, seed=recipe.data.seed)[int(k)][1]
    return [texts[i] for i in idx[:n]]


def _check_texts(inputs: list[Any]) -> list[str]:
    for i, t in enumerate(inputs):
        if not isinstance(t, str):
            raise InputError(f"inputs[{i}] must be a text (str) for a text run; got {type(t).__name__}")
    return inputs


@torch.no_grad()
def _sentiment(run_dir: Path, inputs: list[Any] | None, out: Path, max_inputs: int, checkpoint: str,
               device: torch.device) -> list[Path]:
    from ..tasks import sentiment

    recipe, tok, model, _ = sentiment.load_run(run_dir, checkpoint)
    _require_weights(run_dir, model.config.attention, ("exact",))
    if model.config.depth == 0:
        raise InputError(f"run {run_dir} cannot be visualized: its classifier has no attention layers (depth=0)")
    texts = _check_texts(inputs) if inputs is not None else _mr_test_texts(recipe, run_dir, max_inputs)
    model.to(device)
    paths = []
    for i, text in enumerate(texts):
        batch = tok.encode([text], max_length=recipe.text.max_length)  # one text: no padding
        ids = batch["input_ids"].to(device)
        with capture_attention(model, cpu=True) as maps:
            probs = model(ids, batch["attention_mask"].to(device)).float().softmax(-1)[0]
        labels = token_labels(tok, ids[0].tolist())
        p, c = probs.max(0)
        head = f'"{_short(text)}" -> {sentiment.CLASSES[int(c)]} ({float(p):.2f})'
        for layer, (name, w) in enumerate(_calls(maps)):
            paths.append(token_heatmaps(w[0], labels, labels, out / f"{i:02d}_layer{layer}.png",
                                        title=f"{head}\nlayer {layer} ({name})"))
    return paths


@torch.no_grad()
def _translation(run_dir: Path, inputs: list[Any] | None, out: Path, max_inputs: int, checkpoint: str,
                 device: torch.device) -> list[Path]:
    from ..data.multi30k import load_multi30k
    from ..tasks import translation

    recipe, src_tok, tgt_tok, model, _ = translation.load_run(run_dir, checkpoint)
    if inputs is None:
        pairs = load_multi30k("test", recipe.data.data_dir, recipe.data.source, recipe.data.target)
        texts = [s for s, _ in pairs[:max_inputs]]
    else:
        texts = _check_texts(inputs)
    model.to(device)
    cfg, tr = model.config, recipe.translate
    paths = []
    for i, text in enumerate(texts):
        src_ids = src_tok.tokenize([text], add_cls=False)[0][: recipe.text.max_length - 1] + [src_tok.eos_id]
        src = torch.tensor([src_ids], device=device)
        hyp = model.generate(src, max_new_tokens=min(cfg.max_len, len(src_ids) + 50), num_beams=tr.num_beams,
                             length_penalty=tr.length_penalty)[0].tolist()
        while len(hyp) > 1 and hyp[-1] == cfg.pad_id:  # right padding of a batch; ours has one row
            hyp.pop()
        # Teacher-force the chosen hypothesis: row t is the step that produced hyp[t]. (Beam
        # search reorders and drops rows between steps, so its per-step weights follow no
        # single hypothesis; this pass gives the same weights the cached steps computed.)
        tgt_in = torch.tensor([[cfg.bos_id] + hyp[:-1]], device=device)
        with capture_attention(model, include="transformer.decoder.layers.*.cross_attn", cpu=True) as maps:
            memory, memory_pad = model.encode(src)
            model.decode(tgt_in, memory, memory_pad)
        layers = _calls(maps)
        paths.append(alignment_figure(
            [w[0] for _, w in layers], token_labels(src_tok, src_ids), token_labels(tgt_tok, hyp),
            out / f"{i:02d}_alignment.png", layer_names=[f"decoder layer {j}" for j in range(len(layers))],
            title=f'"{_short(text)}"\n-> "{_short(tgt_tok.decode(hyp))}"  (cross-attention, mean of heads)',
        ))
    return paths


# ----------------------------------------------------------------------------- images
def _images(recipe: Any, inputs: list[Any] | None, max_inputs: int) -> tuple[Tensor, list[str]]:
    """``uint8`` ``(N, C, H, W)`` images as the model's data has them, and their names."""
    from ..tasks import image_classification as ic

    info = ic.DATA_INFO[recipe.data.name]
    if inputs is not None:
        for i, f in enumerate(inputs):
            if not isinstance(f, (str, Path)):
                raise InputError(f"inputs[{i}] must be an image file path for an image run; got {type(f).__name__}")
        images = torch.stack([ic.read_image(f, info["mode"], info["size"]) for f in inputs])
        return images, [Path(f).name for f in inputs]
    if recipe.data.name == "digits":
        from ..data import load_digits_dataset

        test = load_digits_dataset("test")
    else:
        from ..data.images import CIFAR10

        test = CIFAR10(recipe.data.data_dir, "test")
    n = min(max_inputs, len(test))
    images = test.images[:n] if isinstance(test.images, Tensor) else torch.stack(list(test.images[:n]))
    return images, [f"test image {k}, label {info['classes'][int(test.targets[k])]}" for k in range(n)]


def _vit(model: nn.Module, images: Tensor, x: Tensor, names: list[str], classes: list[str], out: Path) -> list[Path]:
    with capture_attention(model, cpu=True) as maps:
        probs = model(x).float().softmax(-1)
    layers = [w for _, w in _calls(maps)]  # (B, H, N, N) per block
    grid = model.patch_embed.grid_for(x.shape[-2], x.shape[-1])
    prefix = model.num_prefix_tokens
    rollout = attention_rollout(layers)  # (B, N, N)
    last = layers[-1].float()
    paths = []
    for b in range(images.shape[0]):
        if model.config.global_pool == "token":  # the class token is what the head reads
            roll, heads, who = rollout[b, 0, prefix:], last[b, :, 0, prefix:], "class token"
        else:  # mean pooling reads every patch token alike
            roll = rollout[b, prefix:, prefix:].mean(0)
            heads, who = last[b, :, prefix:, prefix:].mean(1), "mean of the patch queries"
        maps_ = torch.cat([roll[None], heads]).reshape(-1, *grid)
        titles = ["rollout (all layers)"] + [f"last layer, head {h}" for h in range(heads.shape[0])]
        p, c = probs[b].max(0)
        paths.append(image_attention_figure(
            images[b], maps_, titles, out / f"{b:02d}_vit.png",
            title=f"{names[b]} -> {classes[int(c)]} ({float(p):.2f}); attention of the {who}",
        ))
    return paths


def _botnet(model: nn.Module, images: Tensor, x: Tensor, names: list[str], classes: list[str], out: Path,
            queries: list[tuple[int, int]] | None) -> list[Path]:
    from ..models.botnet import BoTBlock

    blocks = [(name, m) for name, m in model.named_modules() if isinstance(m, BoTBlock)]
    sizes: dict[str, tuple[int, int]] = {}

    def note_size(name: str):
        def hook(module: nn.Module, args: tuple) -> None:  # returns None: the input stays as it is
            sizes.setdefault(name, tuple(args[0].shape[-2:]))
        return hook

    # The attention runs at the block's input resolution (its 1x1 reduce keeps the size).
    hooks = [m.register_forward_pre_hook(note_size(name)) for name, m in blocks]
    try:
        with capture_attention(model, include=[f"{n}.attn" if n else "attn" for n, _ in blocks], cpu=True) as maps:
            probs = model(x).float().softmax(-1)
    finally:
        for h in hooks:
            h.remove()
    H, W = images.shape[-2:]
    queries = queries or [(H // 2, W // 2), (H // 4, W // 4), (3 * H // 4, 3 * W // 4)]
    paths = []
    for b in range(images.shape[0]):
        p, c = probs[b].max(0)
        for k, (name, _) in enumerate(blocks):
            w = maps[f"{name}.attn" if name else "attn"][0]
            paths.append(pixel_query_figure(
                images[b], w[b], sizes[name], queries, out / f"{b:02d}_botnet_block{k}.png",
                title=f"{names[b]} -> {classes[int(c)]} ({float(p):.2f}); BoT block {k} ({name}), "
                      f"{sizes[name][0]}x{sizes[name][1]} map",
            ))
    return paths


@torch.no_grad()
def _image(run_dir: Path, inputs: list[Any] | None, out: Path, max_inputs: int, checkpoint: str,
           device: torch.device, queries: list[tuple[int, int]] | None) -> list[Path]:
    from ..data.transforms import cifar_eval_transforms, digits_transforms
    from ..models.botnet import BoTNet
    from ..models.vit import VisionTransformer
    from ..tasks import image_classification as ic

    recipe, model, _ = ic.load_run(run_dir, checkpoint)
    if isinstance(model, VisionTransformer):
        _require_weights(run_dir, model.config.attention, ("exact",))
        kind = "vit"
    elif isinstance(model, BoTNet):
        _require_weights(run_dir, model.config.attention, ("relpos2d", "exact"))
        kind = "botnet"
    else:
        raise InputError(f"run {run_dir} cannot be visualized: visualize draws ViT (hybrid too) and BoTNet image "
                         f"models, and this run's model is {recipe.model.name!r}")
    if queries is not None and kind != "botnet":
        raise InputError(f"queries (--query) choose BoTNet query pixels; run {run_dir} is a ViT")
    images, names = _images(recipe, inputs, max_inputs)
    if queries is not None:
        h, w = images.shape[-2:]
        for r, c in queries:
            if not (0 <= r < h and 0 <= c < w):
                raise InputError(f"queries: ({r}, {c}) lies outside the {h}x{w} image the model sees; "
                                 f"need 0 <= row < {h} and 0 <= col < {w}")
    prep = cifar_eval_transforms() if recipe.data.name == "cifar10" else digits_transforms(train=False)
    model.to(device)
    x = prep(images).to(device)
    classes = ic.DATA_INFO[recipe.data.name]["classes"]
    if kind == "vit":
        return _vit(model, images, x, names, classes, out)
    return _botnet(model, images, x, names, classes, out, queries)


# ----------------------------------------------------------------------------- entry
def visualize_run(run_dir: str | Path, inputs: Sequence[Any] | None = None, out_dir: str | Path | None = None, *,
                  max_inputs: int = 2, checkpoint: str = "auto", device: str = "cpu",
                  queries: Sequence[Sequence[int]] | None = None) -> list[Path]:
    """Draw the attention of a finished run's model on a few inputs; returns the PNGs written.

    Args:
        run_dir: a run directory written by ``attnlab train`` (a cross-validation run:
            one of its ``fold_<k>`` folders).
        inputs: texts for a sentiment or translation run, image file paths for an image
            run; ``None``: the first ``max_inputs`` examples of the run's test set (MR and
            Multi30k, CIFAR-10 need the data directory of the run's recipe, or
            ``ATTNLAB_DATA_DIR``; digits are bundled).
        out_dir: where the PNGs go (default ``run_dir/visualize``; files of the same
            name are replaced).
        max_inputs: how many test examples when ``inputs`` is None.
        checkpoint: ``"auto"``, ``"best"``, ``"last"``, ``"averaged"`` or a checkpoint folder.
        device: ``"cpu"`` (default), ``"cuda"``, ... or ``"auto"``.
        queries: BoTNet runs only: ``(row, col)`` pixels of the input image (as the model
            sees it, e.g. 32x32 for CIFAR-10) whose attention to draw; default the centre
            and two pixels on the diagonal.

    Raises:
        ValueError: not a run directory, an attention kind that forms no weights (the
            efficient kinds), a model with nothing to draw, bad ``inputs`` or ``queries``.
    """
    from ..engine.device import select_device
    from ..tasks.common import read_recipe

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(f"run_dir must be a run directory; {run_dir} does not exist")
    recipe = read_recipe(run_dir)
    if not isinstance(max_inputs, int) or isinstance(max_inputs, bool) or max_inputs < 1:
        raise InputError(f"max_inputs must be a positive integer; got {max_inputs!r}")
    if inputs is not None:
        inputs = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
        if not inputs:
            raise InputError("inputs must hold at least one text or image file (None: the run's test examples)")
    checked = _check_queries(queries)
    if checked is not None and recipe.task != "image_classification":
        raise InputError(f"queries (--query) choose BoTNet query pixels; run {run_dir} is a {recipe.task} run")
    out = Path(out_dir) if out_dir is not None else run_dir / "visualize"
    dev = select_device(device)
    if recipe.task == "sentiment":
        return _sentiment(run_dir, inputs, out, max_inputs, checkpoint, dev)
    if recipe.task == "translation":
        return _translation(run_dir, inputs, out, max_inputs, checkpoint, dev)
    return _image(run_dir, inputs, out, max_inputs, checkpoint, dev, checked)
