"""Exercises of the tutorial *Attention from scratch* (docs/en/tutorials/attention.md)."""

from __future__ import annotations

import math

import torch

from ... import attention as A
from .. import solutions as S
from ._common import Case, Exercise, Mistake, halves, rand, randn, t

# ----------------------------------------------------------------------------- attention-1


def _sdpa(q, k, v, mask):
    """attnlab's attention, with the mask broadcast to the full (..., Lq, Lk)."""
    full = mask.expand(*q.shape[:-2], q.shape[-2], k.shape[-2])
    return A.scaled_dot_product_attention(q, k, v, attn_mask=full, need_weights=True)


def _attend(q, k, v, mask, *, scale=True, dim=-1, fill=-math.inf, zero_dead=True):
    scores = q @ k.transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(mask, fill)
    weights = scores.softmax(dim=dim)
    if zero_dead:
        weights = weights.nan_to_num(nan=0.0)
    return weights @ v, weights


def _masked_cases(g):
    def keep_first(mask):
        mask[..., 0] = False
        return mask

    padded = torch.tensor([6, 4, 2])[:, None, None] <= torch.arange(6)  # (3, 1, 6): True = padding
    dead = keep_first(rand(g, 4, 6) < 0.3)
    dead[1] = True
    return [
        Case("random", (randn(g, 2, 5, 8), randn(g, 2, 7, 8), randn(g, 2, 7, 6), keep_first(rand(g, 5, 7) < 0.3))),
        Case("heads", (randn(g, 2, 3, 4, 8), randn(g, 2, 3, 4, 8), randn(g, 2, 3, 4, 8),
                       torch.ones(4, 4, dtype=torch.bool).triu(1))),
        Case("one token", (randn(g, 1, 1, 8), randn(g, 1, 1, 8), randn(g, 1, 1, 4),
                           torch.zeros(1, 1, dtype=torch.bool))),
        Case("padding", (randn(g, 3, 4, 8), randn(g, 3, 6, 8), randn(g, 3, 6, 8), padded)),
        Case("fully masked", (randn(g, 2, 4, 8), randn(g, 2, 6, 8), randn(g, 2, 6, 5), dead)),
        Case("float16", halves(randn(g, 2, 5, 8), randn(g, 2, 5, 8), randn(g, 2, 5, 8)) +
             (keep_first(rand(g, 5, 5) < 0.3),), half=True),
        Case("batch 1", (randn(g, 1, 6, 32), randn(g, 1, 6, 32), randn(g, 1, 6, 32), keep_first(rand(g, 6, 6) < 0.5))),
        Case("empty", (randn(g, 0, 3, 8), randn(g, 0, 5, 8), randn(g, 0, 5, 8), keep_first(rand(g, 3, 5) < 0.3))),
    ]


MASKED_ATTENTION = Exercise(
    name="attention-1", func="masked_attention", params="q, k, v, mask",
    title=t("Masked attention", "带掩码的注意力"),
    task=t("Write scaled dot-product attention with a boolean mask that is True where a query may not look at a "
           "key. Return the output and the weights; a query whose keys are all blocked gets zero weights and a zero "
           "output, as in attnlab.",
           "实现带布尔掩码的缩放点积注意力：掩码为 True 的位置表示这个查询不能看这个键。返回输出和注意力权重；"
           "如果某个查询的所有键都被屏蔽，它的权重和输出都应为零（与 attnlab 的约定一致）。"),
    doc=t("Scaled dot-product attention with a boolean mask.\n\n"
          "q: (..., Lq, D), k: (..., Lk, D), v: (..., Lk, Dv)\n"
          "mask: bool, broadcastable to (..., Lq, Lk); True = blocked\n"
          "returns: output (..., Lq, Dv) and weights (..., Lq, Lk); a query whose\n"
          "keys are all blocked gets zero weights and a zero output",
          "带布尔掩码的缩放点积注意力。\n\n"
          "q: (..., Lq, D), k: (..., Lk, D), v: (..., Lk, Dv)\n"
          "mask: bool，可广播到 (..., Lq, Lk)；True = 屏蔽\n"
          "返回：输出 (..., Lq, Dv) 和权重 (..., Lq, Lk)；所有键都被屏蔽的查询，\n"
          "权重和输出都为零"),
    section=t("sections 1 and 3, “The formula” and “Masks: one convention”", "第 1 节“公式”和第 3 节“掩码：只有一套约定”"),
    reference=_sdpa, cases=_masked_cases, outputs=("output", "weights"),
    library="attnlab.attention.scaled_dot_product_attention",
    mistakes=(
        Mistake("no scale", lambda q, k, v, m: _attend(q, k, v, m, scale=False),
                "the logits were not divided by √d (divide q·kᵀ by math.sqrt(q.shape[-1]), section 2)",
                "logits 没有除以 √d（把 q·kᵀ 除以 math.sqrt(q.shape[-1])，见第 2 节）"),
        Mistake("inverted mask", lambda q, k, v, m: _sdpa(q, k, v, ~m),
                "the mask was read the wrong way round: in attnlab True means blocked, so fill the logits with -inf "
                "where mask is True (torch's functional attention uses the opposite convention)",
                "掩码的含义弄反了：attnlab 中 True 表示屏蔽，应在 mask 为 True 的位置把 logits 填成 -inf"
                "（torch 的函数式注意力用的是相反的约定）"),
        Mistake("softmax axis", lambda q, k, v, m: _attend(q, k, v, m, dim=-2),
                "the softmax ran over the queries (dim=-2); each query's weights over the keys must sum to 1: "
                "softmax(dim=-1)",
                "softmax 沿查询方向（dim=-2）计算了；每个查询对所有键的权重之和应为 1：softmax(dim=-1)"),
        Mistake("nan", lambda q, k, v, m: _attend(q, k, v, m, zero_dead=False),
                "a query whose keys are all blocked takes the softmax of a row of -inf, 0/0 = NaN; attnlab gives that "
                "row zero weights and a zero output (find such rows with mask.all(-1, keepdim=True))",
                "所有键都被屏蔽的查询，softmax 的输入是一整行 -inf，得到 0/0 = NaN；attnlab 让这一行的权重和输出都为零"
                "（可以用 mask.all(-1, keepdim=True) 找出这样的行）"),
        Mistake("-1e9", lambda q, k, v, m: _attend(q, k, v, m, fill=-1e9),
                "masking with -1e9 instead of -inf gives a query whose keys are all blocked a uniform row (the mean of "
                "the values, section 7); attnlab gives it zeros",
                "用 -1e9 而不是 -inf 做掩码时，所有键都被屏蔽的查询会得到一行均匀的权重（输出是所有值的平均，见第 7 节）；"
                "attnlab 给它的是零"),
    ),
)

# ----------------------------------------------------------------------------- attention-2


def _split_cases(g):
    return [
        Case("random", (randn(g, 2, 5, 12), 3)),
        Case("random2", (randn(g, 3, 4, 8), 2)),
        Case("one token", (randn(g, 1, 1, 8), 4)),
        Case("float16", (randn(g, 2, 3, 8).half(), 2), half=True),
        Case("batch 1", (randn(g, 1, 6, 16), 4)),
        Case("empty", (randn(g, 0, 3, 8), 4)),
    ]


def _split(shape_of):
    def fn(x, h):
        b, n, e = x.shape
        return shape_of(x, b, n, h, e // h)
    return fn


SPLIT_HEADS = Exercise(
    name="attention-2", func="split_heads", params="x, num_heads",
    title=t("Split into heads", "拆分成多个头"),
    task=t("Cut the E features of every token into num_heads heads of D = E / num_heads features and move the head "
           "axis forward: (B, L, E) becomes (B, H, L, D), head h holding features h·D to h·D + D - 1.",
           "把每个词元的 E 个特征切成 num_heads 个头，每个头 D = E / num_heads 个特征，再把头的维度移到前面："
           "(B, L, E) 变成 (B, H, L, D)，第 h 个头拿到第 h·D 到 h·D + D - 1 个特征。"),
    doc=t("(B, L, E) -> (B, H, L, D) with H = num_heads and D = E / H.\n\n"
          "x: (B, L, E); num_heads: int that divides E\n"
          "returns: (B, H, L, D); head h holds the features h*D ... h*D + D - 1",
          "(B, L, E) -> (B, H, L, D)，其中 H = num_heads，D = E / H。\n\n"
          "x: (B, L, E)；num_heads：能整除 E 的整数\n"
          "返回：(B, H, L, D)；第 h 个头拿到第 h*D ... h*D + D - 1 个特征"),
    section=t("section 5, “Multi-head attention”", "第 5 节“多头注意力”"),
    reference=S.split_heads, cases=_split_cases,
    mistakes=(
        Mistake("direct reshape", _split(lambda x, b, n, h, d: x.reshape(b, h, n, d)),
                "the tensor was reshaped straight to (B, H, L, D), which cuts the positions, not the features, into "
                "heads: view it as (B, L, H, D), then transpose(1, 2)",
                "直接 reshape 成 (B, H, L, D) 会把位置而不是特征切成多个头：应先 view 成 (B, L, H, D)，再 transpose(1, 2)"),
        Mistake("no transpose", _split(lambda x, b, n, h, d: x.view(b, n, h, d)),
                "the head axis was not moved forward: after view(B, L, H, D), transpose(1, 2) gives (B, H, L, D)",
                "没有把头的维度移到前面：view(B, L, H, D) 之后还要 transpose(1, 2)，得到 (B, H, L, D)"),
        Mistake("interleaved", _split(lambda x, b, n, h, d: x.view(b, n, d, h).permute(0, 3, 1, 2)),
                "the features were dealt to the heads in turn (feature f to head f % H); head h holds the D features "
                "h·D ... h·D + D - 1",
                "特征被轮流分给了各个头（特征 f 给了头 f % H）；第 h 个头应拿到连续的 D 个特征 h·D ... h·D + D - 1"),
    ),
)

# ----------------------------------------------------------------------------- attention-3


def _merge_cases(g):
    return [
        Case("random", (randn(g, 2, 3, 5, 4),)),
        Case("random2", (randn(g, 1, 4, 2, 8),)),
        Case("one token", (randn(g, 2, 2, 1, 4),)),
        Case("float16", (randn(g, 2, 2, 3, 4).half(),), half=True),
        Case("batch 1", (randn(g, 1, 8, 6, 2),)),
        Case("empty", (randn(g, 0, 2, 3, 4),)),
    ]


def _merge(fn):
    def variant(x):
        b, h, n, d = x.shape
        return fn(x, b, h, n, d)
    return variant


MERGE_HEADS = Exercise(
    name="attention-3", func="merge_heads", params="x",
    title=t("Merge the heads", "合并多个头"),
    task=t("Put the heads back side by side: (B, H, L, D) becomes (B, L, H·D), head 0's D features first, then head "
           "1's, and so on (the inverse of split_heads).",
           "把各个头重新拼在一起：(B, H, L, D) 变成 (B, L, H·D)，先是第 0 个头的 D 个特征，然后是第 1 个头的，依此类推"
           "（split_heads 的逆操作）。"),
    doc=t("(B, H, L, D) -> (B, L, H*D): the heads concatenated, head 0 first.\n\n"
          "x: (B, H, L, D)\n"
          "returns: (B, L, H*D)",
          "(B, H, L, D) -> (B, L, H*D)：把各个头拼接起来，第 0 个头在前。\n\n"
          "x: (B, H, L, D)\n"
          "返回：(B, L, H*D)"),
    section=t("section 5, “Multi-head attention”", "第 5 节“多头注意力”"),
    reference=S.merge_heads, cases=_merge_cases,
    mistakes=(
        Mistake("no transpose", _merge(lambda x, b, h, n, d: x.reshape(b, n, h * d)),
                "the heads were merged without moving the head axis back: transpose(1, 2) to (B, L, H, D) first, then "
                "reshape to (B, L, H·D)",
                "合并前没有把头的维度移回去：先 transpose(1, 2) 得到 (B, L, H, D)，再 reshape 成 (B, L, H·D)"),
        Mistake("interleaved", _merge(lambda x, b, h, n, d: x.permute(0, 2, 3, 1).reshape(b, n, h * d)),
                "the features were interleaved across the heads (D before H); concatenate the heads instead: head 0's "
                "D features first",
                "各个头的特征被交错排列了（D 在 H 前面）；应把各头依次拼接：先是第 0 个头的 D 个特征"),
        Mistake("summed", _merge(lambda x, b, h, n, d: x.sum(1)),
                "the heads were added instead of concatenated: the output has H·D features",
                "把各个头相加了，而不是拼接：输出应有 H·D 个特征"),
    ),
)

# ----------------------------------------------------------------------------- attention-4


def _causal_cases(g):
    return [
        Case(t("Lq = Lk", "Lq = Lk"), (4, 4)),
        Case(t("fewer queries than keys (a cache)", "查询比键少（有缓存）"), (3, 7)),
        Case(t("one new query after 5 cached keys", "缓存了 5 个键之后的一个新查询"), (1, 6)),
        Case("one token", (1, 1)),
        Case(t("no queries", "没有查询"), (0, 4)),
        Case(t("a longer sequence", "更长的序列"), (7, 7)),
    ]


CAUSAL_MASK = Exercise(
    name="attention-4", func="causal_mask", params="lq, lk",
    title=t("A causal mask, aligned bottom-right", "右下角对齐的因果掩码"),
    task=t("Build attnlab's causal mask: a (Lq, Lk) boolean tensor, True = blocked, in which query i may see key j "
           "when j <= i + (Lk - Lq). With a key/value cache there are fewer queries than keys, and the last query, "
           "the newest position, sees every key.",
           "构造 attnlab 的因果掩码：形状为 (Lq, Lk) 的布尔张量，True = 屏蔽；查询 i 能看到键 j 当且仅当 "
           "j <= i + (Lk - Lq)。有键值缓存时查询比键少，最后一个查询（最新的位置）能看到所有键。"),
    doc=t("The causal mask of attnlab, aligned to the bottom right.\n\n"
          "lq, lk: int, the numbers of queries and keys\n"
          "returns: (lq, lk) bool, True = blocked; query i sees key j when j <= i + (lk - lq)",
          "attnlab 的因果掩码，按右下角对齐。\n\n"
          "lq, lk：int，查询和键的个数\n"
          "返回：(lq, lk) bool，True = 屏蔽；查询 i 能看到键 j 当且仅当 j <= i + (lk - lq)"),
    section=t("section 3, “Masks: one convention” (causal masking)", "第 3 节“掩码：只有一套约定”（因果掩码）"),
    reference=lambda lq, lk: A.causal_mask(lq, lk), cases=_causal_cases,
    library="attnlab.attention.causal_mask",
    mistakes=(
        Mistake("top-left", lambda lq, lk: torch.ones(lq, lk, dtype=torch.bool).triu(1),
                "the triangle was aligned top-left, like torch's is_causal; attnlab aligns it bottom-right: query i "
                "sees key j when j <= i + (Lk - Lq), so with a cache the newest query sees every key",
                "三角形按左上角对齐了（像 torch 的 is_causal）；attnlab 按右下角对齐：查询 i 能看到键 j 当且仅当 "
                "j <= i + (Lk - Lq)，所以有缓存时最新的查询能看到所有键"),
        Mistake("inverted", lambda lq, lk: ~A.causal_mask(lq, lk),
                "the mask is the wrong way round: True must mean blocked, not the keys a query may see",
                "掩码反了：True 应表示屏蔽，而不是查询能看到的键"),
        Mistake("diagonal", lambda lq, lk: torch.ones(lq, lk, dtype=torch.bool).triu(lk - lq),
                "each query's own position was blocked too: the diagonal j = i + (Lk - Lq) must stay False",
                "连查询自己的位置也被屏蔽了：对角线 j = i + (Lk - Lq) 应为 False"),
    ),
)

EXERCISES = [MASKED_ATTENTION, SPLIT_HEADS, MERGE_HEADS, CAUSAL_MASK]
