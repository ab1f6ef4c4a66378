"""Exercises of the tutorial *Efficient attention* (docs/en/tutorials/efficient.md)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...attention import scaled_dot_product_attention
from ...attention.variants.linear import elu_feature_map, kernel_attention
from ...attention.variants.topk import topk_attention
from .. import solutions as S
from ._common import Case, Exercise, Mistake, halves, randn, t

# ----------------------------------------------------------------------------- efficient-1


def _window(length, window, causal, *, wide=False, ahead=False, ignore_causal=False):
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    d = j - i if ahead else i - j
    w = window + 1 if wide else window
    if causal and not ignore_causal:
        return (d < 0) | (d >= w)
    return d.abs() >= w


WINDOW_MASK = Exercise(
    name="efficient-1", func="window_mask", params="length, window, causal",
    title=t("The sliding-window mask", "滑动窗口掩码"),
    task=t("Build the mask of local attention: query i sees key j when |i - j| < window; with causal=True, when "
           "0 <= i - j < window (itself and the window - 1 keys before it). True = blocked.",
           "构造局部注意力的掩码：查询 i 能看到键 j 当且仅当 |i - j| < window；causal=True 时当且仅当 "
           "0 <= i - j < window（它自己以及之前的 window - 1 个键）。True = 屏蔽。"),
    doc=t("The band of sliding-window (local) attention.\n\n"
          "length: int; window: int >= 1; causal: bool\n"
          "returns: (length, length) bool, True = blocked; query i sees key j when\n"
          "|i - j| < window, or, causal, when 0 <= i - j < window",
          "滑动窗口（局部）注意力的带状掩码。\n\n"
          "length: int；window: int >= 1；causal: bool\n"
          "返回：(length, length) bool，True = 屏蔽；查询 i 能看到键 j 当且仅当\n"
          "|i - j| < window，或者在 causal 时 0 <= i - j < window"),
    section=t("section 3, “Local attention: a sliding window”", "第 3 节“局部注意力：滑动窗口”"),
    reference=S.window_mask,
    cases=lambda g: [
        Case(t("bidirectional, window 2", "双向，窗口 2"), (6, 2, False)),
        Case(t("causal, window 3", "因果，窗口 3"), (8, 3, True)),
        Case(t("window 1: each query sees itself", "窗口 1：只看自己"), (5, 1, False)),
        Case(t("a window longer than the sequence", "窗口比序列长"), (4, 10, False)),
        Case("one token", (1, 1, True)),
        Case(t("an empty sequence", "空序列"), (0, 3, False)),
    ],
    mistakes=(
        Mistake("one too wide", lambda n, w, c: _window(n, w, c, wide=True),
                "the window is one key too wide: a key is seen when |i - j| < window, so block |i - j| >= window",
                "窗口多了一个键：键可见的条件是 |i - j| < window，所以应屏蔽 |i - j| >= window"),
        Mistake("inverted", lambda n, w, c: ~S.window_mask(n, w, c),
                "the mask is the wrong way round: True means blocked, the keys outside the window",
                "掩码反了：True 表示屏蔽，也就是窗口之外的键"),
        Mistake("ahead", lambda n, w, c: _window(n, w, c, ahead=True),
                "the causal band looks ahead: query i sees the keys i - window + 1 ... i, none after it",
                "因果的带状区域朝向了未来：查询 i 应看到键 i - window + 1 ... i，不能看之后的键"),
        Mistake("causal ignored", lambda n, w, c: _window(n, w, c, ignore_causal=True),
                "causal=True was ignored: it also blocks every key after the query (i - j < 0)",
                "忽略了 causal=True：它还要屏蔽查询之后的所有键（i - j < 0）"),
    ),
)

# ----------------------------------------------------------------------------- efficient-2 and -3


def _linear_ref(q, k, v, causal=False):
    return kernel_attention(elu_feature_map(q), elu_feature_map(k), v, is_causal=causal)


def _kernel(q, k, v, *, phi=lambda x: F.elu(x) + 1, normalize=True, causal=False, inclusive=True):
    pq, pk = phi(q), phi(k)
    a = pq @ pk.transpose(-2, -1)  # (B, H, L, L), the explicit kernel matrix
    if causal:
        n = q.shape[-2]
        a = a.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1 if inclusive else 0), 0.0)
    out = a @ v
    return out / (a.sum(-1, keepdim=True) + 1e-6) if normalize else out


def _softmax(q, k, v, causal=False):
    return scaled_dot_product_attention(q, k, v, is_causal=causal)[0]


def _linear_cases(g):
    def case(b, h, n, d, dv=None):
        return (randn(g, b, h, n, d), randn(g, b, h, n, d), randn(g, b, h, n, dv or d))

    return [
        Case("random", case(2, 2, 6, 4)),
        Case(t("values of another width", "值的宽度不同"), case(1, 3, 10, 8, 5)),
        Case("one token", case(1, 1, 1, 4)),
        Case("float16", halves(*case(2, 2, 5, 4)), half=True),
        Case("batch 1", case(1, 4, 7, 8)),
        Case("empty", case(0, 2, 4, 4)),
    ]


LINEAR = Exercise(
    name="efficient-2", func="linear_attention", params="q, k, v",
    title=t("Linear attention", "线性注意力"),
    task=t("Replace softmax's exp(q·k) by the kernel phi(q)·phi(k) with phi(x) = elu(x) + 1, and compute it in "
           "linear time: the sums Σ_j phi(k_j) v_jᵀ and Σ_j phi(k_j) once for all queries, then "
           "out_i = phi(q_i)ᵀ (Σ_j phi(k_j) v_jᵀ) / (phi(q_i)ᵀ Σ_j phi(k_j) + 1e-6).",
           "把 softmax 中的 exp(q·k) 换成核函数 phi(q)·phi(k)，其中 phi(x) = elu(x) + 1，并在线性时间内计算它："
           "对所有查询只算一次 Σ_j phi(k_j) v_jᵀ 和 Σ_j phi(k_j)，然后 "
           "out_i = phi(q_i)ᵀ (Σ_j phi(k_j) v_jᵀ) / (phi(q_i)ᵀ Σ_j phi(k_j) + 1e-6)。"),
    doc=t("Non-causal linear attention with phi(x) = elu(x) + 1.\n\n"
          "q, k: (B, H, L, D); v: (B, H, L, Dv)\n"
          "returns: (B, H, L, Dv); out_i = phi(q_i) @ S / (phi(q_i) @ z + 1e-6) with\n"
          "S = sum_j phi(k_j) v_j^T (D, Dv) and z = sum_j phi(k_j) (D,)",
          "非因果的线性注意力，phi(x) = elu(x) + 1。\n\n"
          "q, k: (B, H, L, D)；v: (B, H, L, Dv)\n"
          "返回：(B, H, L, Dv)；out_i = phi(q_i) @ S / (phi(q_i) @ z + 1e-6)，其中\n"
          "S = sum_j phi(k_j) v_j^T，形状 (D, Dv)；z = sum_j phi(k_j)，形状 (D,)"),
    section=t("section 5, “Linear attention: a kernel feature map”", "第 5 节“线性注意力：核特征映射”"),
    reference=_linear_ref, cases=_linear_cases, library="attnlab.attention.variants.linear.kernel_attention",
    atol=1e-4,
    mistakes=(
        Mistake("not normalized", lambda q, k, v: _kernel(q, k, v, normalize=False),
                "the sum was not divided by its normalizer phi(q_i)ᵀ Σ_j phi(k_j), which makes the weights of a "
                "query sum to 1",
                "没有除以归一化项 phi(q_i)ᵀ Σ_j phi(k_j)；正是它让每个查询的权重之和为 1"),
        Mistake("elu", lambda q, k, v: _kernel(q, k, v, phi=F.elu),
                "the features were elu(x), which can be negative; phi(x) = elu(x) + 1 keeps every weight positive",
                "特征用了 elu(x)，它可能为负；phi(x) = elu(x) + 1 才能保证每个权重都是正的"),
        Mistake("softmax", _softmax,
                "this is softmax attention; linear attention uses the kernel phi(q)·phi(k), phi = elu + 1",
                "这是 softmax 注意力；线性注意力用的是核函数 phi(q)·phi(k)，phi = elu + 1"),
    ),
)

CAUSAL_LINEAR = Exercise(
    name="efficient-3", func="causal_linear_attention", params="q, k, v",
    title=t("Causal linear attention", "因果线性注意力"),
    task=t("Make linear attention causal: query i sums over the keys j <= i only. The sums become prefix sums over "
           "the positions (cumsum), so the cost stays linear in the length.",
           "让线性注意力成为因果的：查询 i 只对 j <= i 的键求和。求和变成沿位置方向的前缀和（cumsum），"
           "计算量仍是序列长度的线性函数。"),
    doc=t("Causal linear attention with phi(x) = elu(x) + 1.\n\n"
          "q, k: (B, H, L, D); v: (B, H, L, Dv)\n"
          "returns: (B, H, L, Dv); out_i = phi(q_i) @ S_i / (phi(q_i) @ z_i + 1e-6) with\n"
          "S_i = sum_{j <= i} phi(k_j) v_j^T and z_i = sum_{j <= i} phi(k_j)",
          "因果线性注意力，phi(x) = elu(x) + 1。\n\n"
          "q, k: (B, H, L, D)；v: (B, H, L, Dv)\n"
          "返回：(B, H, L, Dv)；out_i = phi(q_i) @ S_i / (phi(q_i) @ z_i + 1e-6)，其中\n"
          "S_i = sum_{j <= i} phi(k_j) v_j^T，z_i = sum_{j <= i} phi(k_j)"),
    section=t("section 5, “Linear attention: a kernel feature map”", "第 5 节“线性注意力：核特征映射”"),
    reference=lambda q, k, v: _linear_ref(q, k, v, causal=True), cases=_linear_cases,
    library="attnlab.attention.variants.linear.kernel_attention", atol=1e-4,
    mistakes=(
        Mistake("not causal", lambda q, k, v: _kernel(q, k, v),
                "every query summed over all the keys; causal: only j <= i, with prefix sums (cumsum over the "
                "positions)",
                "每个查询都对所有键求和了；因果注意力只对 j <= i 求和，用前缀和（沿位置做 cumsum）"),
        Mistake("exclusive", lambda q, k, v: _kernel(q, k, v, causal=True, inclusive=False),
                "each query left its own key out: the sums run over j <= i, the query's own position included",
                "每个查询都漏掉了它自己的键：求和范围是 j <= i，包括查询自己的位置"),
        Mistake("softmax", lambda q, k, v: _softmax(q, k, v, causal=True),
                "this is causal softmax attention; linear attention uses the kernel phi(q)·phi(k), phi = elu + 1",
                "这是因果 softmax 注意力；线性注意力用的是核函数 phi(q)·phi(k)，phi = elu + 1"),
    ),
)

# ----------------------------------------------------------------------------- efficient-4


def _topk(q, k, v, top_k, *, renormalize=True, largest=True, scale=True):
    scores = q @ k.transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    if top_k >= scores.shape[-1]:
        return scores.softmax(-1) @ v
    kept = torch.zeros_like(scores, dtype=torch.bool).scatter_(
        -1, scores.topk(top_k, dim=-1, largest=largest).indices, True)
    if renormalize:
        return scores.masked_fill(~kept, -math.inf).softmax(-1) @ v
    return scores.softmax(-1).masked_fill(~kept, 0.0) @ v


def _topk_cases(g):
    def qkv(b, h, n, d):
        return (randn(g, b, h, n, d), randn(g, b, h, n, d), randn(g, b, h, n, d))

    return [
        Case("random", (*qkv(2, 2, 6, 4), 2)),
        Case(t("top_k = 1: hard attention", "top_k = 1：硬注意力"), (*qkv(1, 2, 5, 4), 1)),
        Case(t("top_k >= L: exact attention", "top_k >= L：精确注意力"), (*qkv(2, 1, 4, 4), 6)),
        Case("one token", (*qkv(1, 1, 1, 4), 3)),
        Case("float16", halves(*qkv(2, 2, 5, 4)) + (2,), half=True),
        Case("batch 1", (*qkv(1, 4, 8, 8), 3)),
        Case("empty", (*qkv(0, 2, 4, 4), 2)),
    ]


TOPK = Exercise(
    name="efficient-4", func="topk_attention", params="q, k, v, top_k",
    title=t("Top-k attention", "Top-k 注意力"),
    task=t("Let each query keep its top_k largest (scaled) logits and take the softmax over those alone, the others "
           "getting weight 0; top_k = 1 is hard attention, top_k >= L exact attention.",
           "让每个查询只保留它最大的 top_k 个（缩放后的）logits，只在这些 logits 上做 softmax，其余键的权重为 0；"
           "top_k = 1 就是硬注意力，top_k >= L 就是精确注意力。"),
    doc=t("Top-k attention.\n\n"
          "q, k, v: (B, H, L, D); top_k: int >= 1\n"
          "returns: (B, H, L, D); each query's softmax runs over its top_k largest\n"
          "logits q·k / sqrt(D) alone",
          "Top-k 注意力。\n\n"
          "q, k, v: (B, H, L, D)；top_k: int >= 1\n"
          "返回：(B, H, L, D)；每个查询只在它最大的 top_k 个 logits q·k / sqrt(D) 上做 softmax"),
    section=t("section 9, “Top-k and hard attention”", "第 9 节“Top-k 与硬注意力”"),
    reference=lambda q, k, v, top_k: topk_attention(q, k, v, top_k), cases=_topk_cases,
    library="attnlab.attention.variants.topk.topk_attention",
    mistakes=(
        Mistake("not renormalized", lambda q, k, v, n: _topk(q, k, v, n, renormalize=False),
                "the softmax ran over all the keys and the others were zeroed afterwards, so the kept weights no "
                "longer sum to 1; set the other logits to -inf first, then take the softmax",
                "先在所有键上做了 softmax 再把其余的置零，保留下来的权重之和就不再是 1；应先把其余的 logits 设为 -inf，"
                "再做 softmax"),
        Mistake("smallest", lambda q, k, v, n: _topk(q, k, v, n, largest=False),
                "the top_k smallest logits were kept; keep the largest (topk(..., largest=True), the default)",
                "保留的是最小的 top_k 个 logits；应保留最大的（topk(..., largest=True)，即默认值）"),
        Mistake("no scale", lambda q, k, v, n: _topk(q, k, v, n, scale=False),
                "the logits were not divided by √D before the softmax",
                "做 softmax 之前 logits 没有除以 √D"),
    ),
)

EXERCISES = [WINDOW_MASK, LINEAR, CAUSAL_LINEAR, TOPK]
