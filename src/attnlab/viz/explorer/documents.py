"""The explorer's documents, one per input, from the attention views that tasks return
(:mod:`attnlab.run.views`), in the page's format (:mod:`.page`): token labels, each
layer's weights encoded 8 bits a value, and per head the figures that make previous-token,
positional, sink and broad heads stand out, computed from the model's exact weights."""

from __future__ import annotations

import base64
import io
import math
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from ...errors import InputError
from ...run.views import AlignmentAttention, GenerationAttention, ImageAttention, PixelAttention, TextAttention
from ..attention import _rgb, attention_rollout, visible
from .page import encode_weights

__all__ = ["PROFILE_BINS", "ROLES", "head_stats", "head_roles", "group", "document_of", "image_data_url"]

# Distance from a query back to a key, d = i - j, in bins that double: "ahead" (d < 0, keys after the
# query: an encoder's), then 0 (the token itself), 1 (the previous one), 2-3, 4-7, ...
PROFILE_BINS = ["ahead", "0", "1", "2-3", "4-7", "8-15", "16-31", "32-63", "64+"]


# A head's role, named where its figure passes a threshold (the largest share wins): the mean weight
# on the previous token, on the tokens that followed earlier occurrences of the query's token, on
# the first token. Shares of all of a query's weight, so above 0.5 the head puts most of it there.
ROLES = {"previous-token": ("previous", 0.5), "induction": ("induction", 0.4), "first-token": ("first", 0.5)}


def head_roles(stats: dict[str, Any]) -> list[list[str | None]]:
    """Per layer, per head, the :data:`ROLES` name whose figure in ``stats`` (:func:`head_stats`)
    passes its threshold, the largest first; ``None`` where none does."""
    roles = []
    for layer in range(len(stats["previous"])):
        row = []
        for head in range(len(stats["previous"][layer])):
            passed = [(value, name) for name, (key, threshold) in ROLES.items()
                      if (value := stats[key][layer][head]) is not None and value >= threshold]
            row.append(max(passed)[1] if passed else None)
        roles.append(row)
    return roles


def _bin_of_distance(d: Tensor) -> Tensor:
    """The :data:`PROFILE_BINS` index of each distance."""
    bins = torch.zeros_like(d)
    pos = d.clamp_min(1).float()
    bins[d == 0] = 1
    ahead_or_zero = d <= 0
    bins[~ahead_or_zero] = (2 + torch.floor(torch.log2(pos[~ahead_or_zero]))).clamp_max(len(PROFILE_BINS) - 1).long()
    return bins  # d < 0 stays 0: "ahead"


def _induction_keys(labels: Sequence[str]) -> Tensor:
    """Bool ``(L, L)``: key ``j`` follows an earlier occurrence of query ``i``'s token
    (``labels[j - 1] == labels[i]``, ``j - 1 < i``): where an induction head looks, to copy
    what came next the last time."""
    n = len(labels)
    ids = {t: k for k, t in enumerate(dict.fromkeys(labels))}
    tok = torch.tensor([ids[t] for t in labels])
    keys = torch.zeros(n, n, dtype=torch.bool)
    if n > 1:
        i, j = torch.arange(n)[:, None], torch.arange(1, n)[None, :]
        keys[:, 1:] = (tok[:, None] == tok[None, :-1]) & (j - 1 < i) & (j <= i)
    return keys


def head_stats(layers: Sequence[Tensor], labels: Sequence[str] | None = None) -> dict[str, Any]:
    """Per layer, per head, averaged over the queries of a self-attention map ``(H, L, L)``:
    ``entropy`` (bits), ``distance`` (the mean of ``i - j`` under the weights: how far back a
    head looks), ``previous`` (weight on ``i - 1``), ``first`` (weight on position 0; both
    over queries ``i >= 1``), ``diagonal`` (weight on ``i``), ``profile`` (the share of
    weight in each :data:`PROFILE_BINS` bin of distance) and, given the tokens' ``labels``,
    ``induction``: the weight on the tokens that followed earlier occurrences of the query's
    token, over the queries whose token occurred before (``None`` when none did); ``roles``: each
    head's :func:`head_roles`."""
    out: dict[str, Any] = {k: [] for k in ("entropy", "distance", "previous", "first", "diagonal", "profile",
                                           "induction")}
    out["profile_bins"] = PROFILE_BINS
    induction = _induction_keys(labels) if labels is not None else None
    repeats = induction.any(-1) if induction is not None else None
    for w in layers:
        w = w.detach().float().cpu()
        n = w.shape[-1]
        i = torch.arange(n)
        d = i[:, None] - i[None, :]
        plogp = torch.where(w > 0, w * torch.log2(w.clamp_min(1e-30)), torch.zeros(()))
        out["entropy"].append((-plogp.sum(-1)).mean(-1).tolist())
        out["distance"].append((w * d).sum(-1).mean(-1).tolist())
        later = w[:, 1:] if n > 1 else w[:, :0]
        out["previous"].append((later.diagonal(offset=0, dim1=-2, dim2=-1).mean(-1) if n > 1 else torch.zeros(w.shape[0])).tolist())
        out["first"].append((later[..., 0].mean(-1) if n > 1 else torch.zeros(w.shape[0])).tolist())
        out["diagonal"].append(w.diagonal(dim1=-2, dim2=-1).mean(-1).tolist())
        bins = _bin_of_distance(d).reshape(-1)
        profile = torch.zeros(w.shape[0], len(PROFILE_BINS)).index_add_(1, bins, w.reshape(w.shape[0], -1)) / n
        out["profile"].append(profile.tolist())
        if induction is None or not bool(repeats.any()):  # type: ignore[union-attr]
            out["induction"].append([None] * w.shape[0])
        else:
            on = (w * induction).sum(-1)[:, repeats]  # (H, queries whose token came before)
            out["induction"].append(on.mean(-1).tolist())
    out = {k: _rounded(v) for k, v in out.items()}
    out["roles"] = head_roles(out)
    return out


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 5) if math.isfinite(value) else None
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _labels(tokens: Sequence[str]) -> list[str]:
    return [visible(t) for t in tokens]


def _is_causal(layers: Sequence[Tensor]) -> bool:
    return all(bool((torch.triu(w.float(), diagonal=1) == 0).all()) for w in layers)


def group(name: str, queries: Sequence[str], keys: Sequence[str], layers: Sequence[tuple[str, Tensor]], *,
          self_attention: bool, ablation: Sequence[Sequence[float] | None] | None = None) -> dict[str, Any]:
    """One attention group of the page: ``layers`` ``[(name, weights (heads, Lq, Lk)), ...]``;
    ``ablation``: per layer, the change in the model's loss with each head removed
    (:func:`attnlab.viz.ablation.head_ablation`)."""
    lq, lk = len(queries), len(keys)
    for lname, w in layers:
        if w.dim() != 3 or tuple(w.shape[1:]) != (lq, lk):
            raise InputError(f"the weights of {lname} must have shape (heads, {lq}, {lk}) for {lq} queries and "
                             f"{lk} keys; got {tuple(w.shape)}")
    maps = [w for _, w in layers]
    return {"name": name, "queries": _labels(queries), "keys": _labels(keys), "self": self_attention,
            "causal": self_attention and _is_causal(maps),
            "layers": [{"name": lname, "heads": int(w.shape[0]), "data": encode_weights(w)} for lname, w in layers],
            "stats": _with_ablation(head_stats(maps, list(queries)), ablation) if self_attention else None}


def _with_ablation(stats: dict[str, Any], ablation: Sequence[Sequence[float] | None] | None) -> dict[str, Any]:
    if ablation is not None:
        stats["ablation"] = [list(row) if row is not None else None for row in ablation]
    return stats


def image_data_url(image: Tensor) -> str:
    """A ``(C, H, W)`` image (``uint8``, or floats of any range) as a PNG ``data:`` URL."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.rint(_rgb(image) * 255).astype(np.uint8)).save(buf, format="PNG")  # as the pictures show it
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def document(title: str, kind: str, groups: list[dict[str, Any]], *, notes: Sequence[str] = (),
             lm: dict[str, Any] | None = None, image: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"title": title, "kind": kind, "notes": list(notes), "groups": groups, "lm": lm, "image": image}


def document_of(view: Any, ablation: Sequence[Sequence[float] | None] | None = None) -> dict[str, Any]:
    """The page's document for one attention view of a task; ``ablation``: a language model's
    change in loss with each head removed, per layer of the view."""
    if isinstance(view, GenerationAttention):
        notes = [f"{name}: this attention forms no weight matrix; its layer is not shown" for name in view.opaque]
        how = ("each generated token's row is the weights of the decoding step that read it, with the model's cache"
               if view.cached else "the rows are those of one pass over the prompt and its continuation")
        return document(view.title, "lm", [group("self-attention", view.tokens, view.tokens, view.layers,
                                                 self_attention=True, ablation=ablation)],
                        notes=[f"{view.prompt_len} prompt tokens, then {len(view.tokens) - view.prompt_len} chosen "
                               f"greedily; {how}", *notes],
                        lm={"prompt_len": view.prompt_len,
                            "top": [[[visible(t), round(p, 5)] for t, p in row] for row in view.top]})
    if isinstance(view, TextAttention):
        return document(view.title, "text", [group("self-attention", view.tokens, view.tokens, view.layers,
                                                   self_attention=True)])
    if isinstance(view, AlignmentAttention):
        names = view.layer_names or [f"decoder layer {i}" for i in range(len(view.layers))]
        groups = [group("cross-attention", view.target_tokens, view.source_tokens, list(zip(names, view.layers)),
                        self_attention=False)]
        if view.source_layers:
            groups.append(group("encoder self-attention", view.source_tokens, view.source_tokens, view.source_layers,
                                self_attention=True))
        if view.target_layers:
            groups.append(group("decoder self-attention", view.target_tokens, view.target_tokens, view.target_layers,
                                self_attention=True))
        return document(view.title, "translation", groups)
    if isinstance(view, ImageAttention):
        rows, cols = view.grid
        tokens = ["[CLS]" if view.prefix >= 1 and k == 0 else f"[REG{k}]" for k in range(view.prefix)]
        tokens += [f"patch {r},{c}" for r in range(rows) for c in range(cols)]
        layers = [(f"block {i}", w) for i, w in enumerate(view.layers)]
        rollout = attention_rollout([w for _, w in layers])
        how = "the class token" if view.pooling == "token" else "the mean of the patches"
        return document(view.title, "image", [group("self-attention", tokens, tokens, layers, self_attention=True)],
                        notes=[f"the classifier reads {how}"],
                        image={"src": image_data_url(view.image), "group": 0, "grid": [rows, cols],
                               "prefix": view.prefix, "rollout": encode_weights(rollout)})
    if isinstance(view, PixelAttention):
        groups = []
        for name, w, (h, wd) in view.blocks:
            pixels = [f"({r},{c})" for r in range(h) for c in range(wd)]
            groups.append(group(f"{name} ({h}x{wd})", pixels, pixels, [(name, w)], self_attention=True))
        h, wd = view.blocks[0][2]
        return document(view.title, "image", groups, notes=["each BoT block attends over its own feature map; the "
                                                            "image view shows the first"],
                        image={"src": image_data_url(view.image), "group": 0, "grid": [h, wd], "prefix": 0,
                               "rollout": None})
    raise InputError(f"the explorer cannot show a {type(view).__name__}; it shows the views of attnlab.run.views")


def tensor_documents(maps: dict[str, list[Tensor]], tokens: Sequence[Sequence[str]] | None, title: str,
                     notes: Sequence[str]) -> list[dict[str, Any]]:
    """Documents of any model's captured weights (one per batch row): each module's first
    call, grouped by the shape of its map; ``tokens[b]`` labels row ``b``'s positions."""
    recorded = [(name, calls[0]) for name, calls in maps.items() if calls]
    if not recorded:
        raise InputError("the model recorded no attention on these inputs: none of its attention modules was called")
    batch = recorded[0][1].shape[0]
    if tokens is not None and len(tokens) != batch:
        raise InputError(f"tokens must hold one list of labels per input row ({batch}); got {len(tokens)}")
    docs = []
    for b in range(batch):
        shapes: dict[tuple[int, int], list[tuple[str, Tensor]]] = {}
        for name, w in recorded:
            shapes.setdefault(tuple(w.shape[-2:]), []).append((name, w[b].float()))  # type: ignore[arg-type]
        groups = []
        for (lq, lk), layers in shapes.items():
            labels = list(tokens[b]) if tokens is not None else None
            q = labels if labels is not None and len(labels) == lq else [str(i) for i in range(lq)]
            k = labels if labels is not None and len(labels) == lk else [str(j) for j in range(lk)]
            name = "self-attention" if lq == lk else f"attention {lq} x {lk}"
            if len(shapes) > 1:
                name += f" ({len(layers)} modules)"
            groups.append(group(name, q, k, layers, self_attention=lq == lk))
        docs.append(document(f"{title}, input {b}" if batch > 1 else title, "text", groups, notes=notes))
    return docs
