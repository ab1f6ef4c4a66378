"""How closely each efficient kind reproduces exact attention on a trained model's own
queries, keys and values (not random tensors).

The model is the MR classifier that the quality part trains with exact attention (the
shipped ``sentiment-mr`` recipe; trained here when that part has not run). It reads the
test sentences; at each of its attention layers the layer's input and padding mask are
recorded, and its own projection gives the per-head queries, keys and values. Each kind's
:meth:`~attnlab.attention.variants.base.TokenAttention.attend` then runs on exactly those
tensors, at the quality part's MR settings (sentences of at most 96 tokens, so a window of
8, blocks of 8, 16 landmarks, ...), and is compared with a reference under the same mask:

* exact softmax attention, for every kind but ``lsh``;
* for ``lsh``, which shares queries and keys (the Reformer's constraint: a model is
  trained so), its own result with one chunk covering the sentence, which is exact
  attention over the shared keys: the figure is then the error of the hashing and
  chunking alone.

Error: ``‖o - o_ref‖ / ‖o_ref‖`` (Frobenius norms) over the real, not padding, query
positions of all sentences and heads of a layer; the record keeps each layer's and the
mean over layers. For ``topk`` the record also keeps the share of each query's exact
softmax weight that falls on the ``k`` keys it keeps (its mean over queries).

``latent`` (multi-head latent attention) is measured as its cache compresses: each layer's
keys and values of every real token, all heads side by side, pass through the best shared
latent of ``kv_rank`` dimensions for those tokens (the truncated SVD of the ``(tokens, 2 x
embed)`` matrix of keys beside values, a linear map as MLA's down- and up-projections are),
and exact attention runs on what comes back; the record keeps the share of the keys' and
values' squared norm that the latent holds.

``linformer`` is left out: its length projections are weights learned with the model,
and a model trained with exact attention has none (random ones would measure nothing).
The kinds of 2024-2026 other than ``latent`` are not approximations of softmax attention on
given queries and keys: ``differential`` and ``gated_delta`` compute other functions with
weights of their own, ``sinks`` is exact attention plus learned logits that take weight away
(zero error as they go to minus infinity), and ``dsa`` with an indexer that scored keys as
the attention does is ``topk`` (its rows).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from ..attention import build_attention
from ..attention.functional import scaled_dot_product_attention
from ..attention.exact import GroupedQueryAttention
from ..data.source import source_of
from ..data.batches.texts import SentimentDataset
from ..errors import InputError
from ..tasks import load_run
from .quality import MR_OPTIONS, ensure_mr_run

__all__ = ["FIDELITY_SETTINGS", "attention_inputs", "relative_errors", "run_fidelity"]

# (label, kind, options): the quality part's MR settings, and top-k at three k.
FIDELITY_SETTINGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("local", "local", MR_OPTIONS["local"]),
    ("sparse", "sparse", MR_OPTIONS["sparse"]),
    ("linear", "linear", {}),
    ("performer", "performer", MR_OPTIONS["performer"]),
    ("nystrom", "nystrom", MR_OPTIONS["nystrom"]),
    ("topk k=1 (hard)", "topk", {"top_k": 1}),
    ("topk k=4", "topk", {"top_k": 4}),
    ("topk k=16", "topk", {"top_k": 16}),
    ("lsh", "lsh", MR_OPTIONS["lsh"]),
    ("latent kv_rank=16", "latent", {"kv_rank": 16}),
    ("latent kv_rank=32", "latent", {"kv_rank": 32}),
    ("latent kv_rank=64", "latent", {"kv_rank": 64}),
)


@torch.no_grad()
def attention_inputs(model: torch.nn.Module, batches: list[dict[str, Tensor]]) -> list[list[tuple[Tensor, ...]]]:
    """Run ``model(**batch)`` for each batch; for each of its exact self-attention layers,
    in order, the list over batches of ``(q, k, v, key_padding_mask)`` with ``q, k, v``
    ``(B, H, L, D)`` from the layer's own projection and the mask ``(B, L)`` bool
    (``True`` = padding)."""
    layers = [m for m in model.modules() if isinstance(m, GroupedQueryAttention)]
    if not layers:
        raise InputError("model has no exact self-attention layer ('exact' kind) to take queries and keys from")
    for m in layers:
        if m.rotary is not None or m.alibi_slopes is not None or m.num_kv_heads != m.num_heads or \
                m.q_norm is not None or m.sliding_window is not None:
            raise InputError("the model's attention must be plain multi-head self-attention (no rope, alibi, "
                             "grouped heads, QK-norm or window): its projections alone give the queries and keys")
    seen: list[list[tuple[Tensor, ...]]] = [[] for _ in layers]

    def hook(i: int) -> Callable[..., None]:
        def record(module: GroupedQueryAttention, args: tuple, kwargs: dict[str, Any]) -> None:
            if kwargs.get("attn_mask") is not None:
                raise InputError("the model adds an attention bias (attn_mask), which the other kinds cannot take")
            x, pad = args[0], kwargs.get("key_padding_mask")
            b, n, _ = x.shape
            if pad is None:
                pad = torch.zeros(b, n, dtype=torch.bool, device=x.device)
            q, k, v = (proj(x).view(b, n, module.num_heads, module.head_dim).transpose(1, 2)
                       for proj in (module.q_proj, module.k_proj, module.v_proj))
            seen[i].append((q, k, v, pad))
        return record

    handles = [m.register_forward_pre_hook(hook(i), with_kwargs=True) for i, m in enumerate(layers)]
    try:
        for batch in batches:
            model(**batch)
    finally:
        for h in handles:
            h.remove()
    return seen


@torch.no_grad()
def relative_errors(kind: str, options: dict[str, Any], inputs: list[list[tuple[Tensor, ...]]],
                    seed: int = 0) -> dict[str, Any]:
    """Each layer's relative error of ``kind`` (built with ``options``) against its
    reference on ``inputs`` (from :func:`attention_inputs`); see the module docstring."""
    if kind == "latent":
        return _latent_errors(options["kv_rank"], inputs)
    per_layer, kept = [], []
    for layer in inputs:
        q0 = layer[0][0]
        heads, head_dim = q0.shape[1], q0.shape[3]
        torch.manual_seed(seed)  # the random features and rotations of the kinds that draw them
        module = build_attention(kind, heads * head_dim, heads, **options).to(q0.device).eval()
        reference = None
        if kind == "lsh":  # one chunk over the longest sentence: exact attention over the shared keys
            longest = max(q.shape[2] for q, *_ in layer)
            reference = build_attention("lsh", heads * head_dim, heads,
                                        **{**options, "bucket_size": longest}).to(q0.device).eval()
        err = ref_norm = 0.0
        for q, k, v, pad in layer:
            if reference is not None:
                ref, weights = reference.attend(q, k, v, key_padding_mask=pad, is_causal=False), None
            else:
                ref, weights = scaled_dot_product_attention(q, k, v, key_padding_mask=pad, need_weights=kind == "topk")
            out = module.attend(q, k, v, key_padding_mask=pad, is_causal=False)
            real = (~pad)[:, None, :, None]  # the real query positions
            err += float(((out - ref) * real).pow(2).sum())
            ref_norm += float((ref * real).pow(2).sum())
            if weights is not None:  # top-k: the exact weight on the keys it keeps
                mass = weights.topk(min(options["top_k"], weights.shape[-1]), dim=-1).values.sum(-1)  # (B, H, L)
                kept.append(mass.transpose(1, 2)[~pad])  # (real positions, H)
        per_layer.append(math.sqrt(err / max(ref_norm, 1e-30)))
    rec: dict[str, Any] = {"kind": kind, "options": dict(options), "error": sum(per_layer) / len(per_layer),
                           "error_per_layer": per_layer,
                           "reference": "one-chunk lsh (exact, shared keys)" if kind == "lsh" else "exact"}
    if kept:
        rec["kept_mass"] = float(torch.cat(kept).mean())
    return rec


def _latent_errors(rank: int, inputs: list[list[tuple[Tensor, ...]]]) -> dict[str, Any]:
    """Exact attention's relative error when each layer's keys and values go through their best
    shared latent of ``rank`` dimensions (see the module docstring)."""
    per_layer, energy = [], []
    for layer in inputs:
        rows = [torch.cat([k, v], dim=1).permute(0, 2, 1, 3).flatten(2)[~pad] for _, k, v, pad in layer]
        z = torch.cat(rows).double()  # (real tokens, 2 x heads x head size)
        basis = torch.linalg.svd(z, full_matrices=False).Vh[:rank].T  # (2 E, rank)
        energy.append(float((z @ basis).square().sum() / z.square().sum()))
        err = ref_norm = 0.0
        for q, k, v, pad in layer:
            b, h, n, d = k.shape
            kv = torch.cat([k, v], dim=1).permute(0, 2, 1, 3).reshape(b, n, 2 * h * d).double()
            kv = (kv @ basis @ basis.T).to(k.dtype).view(b, n, 2 * h, d).permute(0, 2, 1, 3)
            ref, _ = scaled_dot_product_attention(q, k, v, key_padding_mask=pad)
            out, _ = scaled_dot_product_attention(q, kv[:, :h], kv[:, h:], key_padding_mask=pad)
            real = (~pad)[:, None, :, None]
            err += float(((out - ref) * real).pow(2).sum())
            ref_norm += float((ref * real).pow(2).sum())
        per_layer.append(math.sqrt(err / max(ref_norm, 1e-30)))
    return {"kind": "latent", "options": {"kv_rank": rank}, "error": sum(per_layer) / len(per_layer),
            "error_per_layer": per_layer, "reference": "exact", "kept_energy": sum(energy) / len(energy)}


def run_fidelity(store: Any, out: Path, *, quick: bool = False, device: str = "cpu", data_dir: str | None = None,
                 log: Callable[[str], None] = print) -> None:
    """The error of each of :data:`FIDELITY_SETTINGS` not yet in ``store`` (section
    ``fidelity``), on the quality part's exact MR model (trained first if missing)."""
    todo = [s for s in FIDELITY_SETTINGS if not store.find("fidelity", label=s[0])]
    if not todo:
        return
    run_dir = ensure_mr_run(store, "exact", out, quick=quick, device=device, data_dir=data_dir, log=log)
    run = load_run(run_dir, device=device)
    test = source_of(run.recipe.data).load(run.recipe.data).test
    texts, labels = (test.texts[:64], test.labels[:64]) if quick else (test.texts, test.labels)
    data = SentimentDataset(texts, labels, run.tokenizer, run.recipe.text.max_length)
    order = sorted(range(len(data.texts)), key=lambda i: int(data.lengths[i]))  # little padding per batch
    batches = [{k: t.to(device) for k, t in data.get_batch(order[i:i + 64])[0].items()}
               for i in range(0, len(order), 64)]
    inputs = attention_inputs(run.model, batches)
    for label, kind, options in todo:
        rec = {"label": label, **relative_errors(kind, options, inputs), "sentences": len(texts),
               "layers": len(inputs), "model_run": str(run_dir)}
        store.add("fidelity", rec)
        extra = f", keeps {100 * rec['kept_mass']:.1f}% of the exact weight" if "kept_mass" in rec else \
            f", the latent holds {100 * rec['kept_energy']:.1f}% of the keys' and values' energy" \
            if "kept_energy" in rec else ""
        log(f"fidelity {label:>16}: relative error {rec['error']:.4f} vs {rec['reference']}{extra}")
