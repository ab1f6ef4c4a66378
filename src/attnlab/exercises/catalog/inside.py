"""Exercises of the tutorial *Looking inside a trained model* (docs/en/tutorials/inside.md)."""

from __future__ import annotations

import torch

from .. import solutions as S
from ._common import Case, Exercise, Mistake, rows, t

# ----------------------------------------------------------------------------- inside-1


def _entropy(w, *, log=torch.log2, nan=False, reduce="sum"):
    plogp = w * log(w) if nan else torch.where(w > 0, w * log(w), torch.zeros(()))
    per_row = -(plogp.mean(dim=-1) if reduce == "mean" else plogp.sum(dim=-1))
    return per_row.mean(dim=-1)


def _one_hot_rows(g, h, n):
    return torch.nn.functional.one_hot(torch.randint(0, n, (h, n), generator=g), n).float()


def _entropy_cases(g):
    return [
        Case("random", (rows(g, 4, 5, 5),)),
        Case(t("causal maps (zeros above the diagonal)", "因果注意力（对角线以上为零）"), (rows(g, 2, 6, 6, causal=True),)),
        Case(t("one-hot rows: entropy 0", "独热的行：熵为 0"), (_one_hot_rows(g, 2, 4),)),
        Case(t("uniform rows: 3 bits", "均匀的行：3 比特"), (torch.full((1, 8, 8), 1 / 8),)),
        Case("one token", (torch.ones(3, 1, 1),)),
        Case(t("one head", "只有一个头"), (rows(g, 1, 7, 7, sharp=4.0),)),
    ]


HEAD_ENTROPY = Exercise(
    name="inside-1", func="head_entropy", params="weights",
    title=t("The entropy of each head", "每个头的熵"),
    task=t("Measure how spread out each head's attention is, as the explorer's table does: the entropy of every "
           "query's row in bits, -Σ_j w log2 w (0 · log 0 counted as 0), averaged over the queries.",
           "像注意力浏览器的表格那样，衡量每个头的注意力有多分散：每个查询那一行的熵（以比特为单位），"
           "-Σ_j w log2 w（0 · log 0 记为 0），再对所有查询取平均。"),
    doc=t("The mean entropy of each head's rows, in bits.\n\n"
          "weights: (H, L, L), one layer's attention for one input; rows sum to 1\n"
          "returns: (H,); the mean over the queries of -sum_j w log2 w, 0 log 0 = 0",
          "每个头各行的平均熵（比特）。\n\n"
          "weights: (H, L, L)，一个输入在某一层的注意力；每行之和为 1\n"
          "返回：(H,)；对所有查询取 -sum_j w log2 w 的平均值，0 log 0 = 0"),
    section=t("section 7, “The attention explorer” (its matrix view's table: entropy)",
              "第 7 节“注意力浏览器”（矩阵视图中的表格：entropy）"),
    reference=S.head_entropy, cases=_entropy_cases, library="attnlab.viz.explorer.documents.head_stats",
    mistakes=(
        Mistake("natural log", lambda w: _entropy(w, log=torch.log),
                "the natural logarithm gives nats; the table is in bits: torch.log2",
                "自然对数得到的单位是奈特（nat）；表格用的是比特：torch.log2"),
        Mistake("nan", lambda w: _entropy(w, nan=True),
                "0 · log 0 gave NaN (0 · -inf); count it as 0, e.g. torch.where(w > 0, w * torch.log2(w), 0)",
                "0 · log 0 得到了 NaN（0 · -inf）；应把它记为 0，例如 torch.where(w > 0, w * torch.log2(w), 0)"),
        Mistake("mean over keys", lambda w: _entropy(w, reduce="mean"),
                "the terms of a row were averaged; the entropy is their sum, -Σ_j w log2 w",
                "对一行中的各项取了平均；熵是它们的和：-Σ_j w log2 w"),
    ),
)

# ----------------------------------------------------------------------------- inside-2


def _previous_head(g, h, n):
    w = rows(g, h, n, n, causal=True, sharp=0.5) * 0.1
    if n > 1:
        idx = torch.arange(1, n)
        w[:, idx, idx - 1] += 0.9
    return w / w.sum(-1, keepdim=True)


def _diag(w, offset, *, all_queries=False):
    n = w.shape[-1]
    d = w.diagonal(offset=offset, dim1=-2, dim2=-1)
    return d.sum(-1) / n if all_queries else d.mean(-1)


PREVIOUS_TOKEN = Exercise(
    name="inside-2", func="previous_token_score", params="weights",
    title=t("The previous-token score", "前一个词元得分"),
    task=t("Measure how much each head looks at the previous token, the explorer's *previous*: the weight of query "
           "i on key i - 1, averaged over the queries i >= 1 (query 0 has no previous token).",
           "衡量每个头在多大程度上关注前一个词元，也就是浏览器中的 *previous*：查询 i 对键 i - 1 的权重，"
           "对 i >= 1 的查询取平均（查询 0 没有前一个词元）。"),
    doc=t("The mean weight of each head on the previous token.\n\n"
          "weights: (H, L, L)\n"
          "returns: (H,); the mean over i = 1 ... L - 1 of weights[:, i, i - 1]\n"
          "(zeros when L = 1)",
          "每个头在前一个词元上的平均权重。\n\n"
          "weights: (H, L, L)\n"
          "返回：(H,)；对 i = 1 ... L - 1 求 weights[:, i, i - 1] 的平均值（L = 1 时为零）"),
    section=t("section 7, “The attention explorer” (its matrix view's table: previous)",
              "第 7 节“注意力浏览器”（矩阵视图中的表格：previous）"),
    reference=S.previous_token_score, library="attnlab.viz.explorer.documents.head_stats",
    cases=lambda g: [
        Case("random", (rows(g, 4, 6, 6),)),
        Case(t("causal maps", "因果注意力"), (rows(g, 2, 5, 5, causal=True),)),
        Case(t("a previous-token head", "一个“前一个词元”头"), (_previous_head(g, 2, 6),)),
        Case(t("two tokens", "两个词元"), (rows(g, 3, 2, 2),)),
        Case("one token", (torch.ones(2, 1, 1),)),
    ],
    mistakes=(
        Mistake("diagonal", lambda w: _diag(w, 0),
                "the diagonal was read, the token itself; the previous token is key i - 1: "
                "weights.diagonal(offset=-1, dim1=-2, dim2=-1)",
                "读的是对角线，也就是词元自己；前一个词元是键 i - 1：weights.diagonal(offset=-1, dim1=-2, dim2=-1)"),
        Mistake("next", lambda w: _diag(w, 1),
                "w[i, i + 1] is the next token; the previous one is w[i, i - 1] (offset=-1)",
                "w[i, i + 1] 是后一个词元；前一个词元是 w[i, i - 1]（offset=-1）"),
        Mistake("all queries", lambda w: _diag(w, -1, all_queries=True),
                "the sum was divided by all L queries; query 0 has no previous token, so average over the L - 1 "
                "queries 1 ... L - 1",
                "和被除以了全部 L 个查询；查询 0 没有前一个词元，应只对查询 1 ... L - 1（共 L - 1 个）取平均"),
    ),
)

# ----------------------------------------------------------------------------- inside-3


def _induction(w, tokens, *, same_token=False, all_queries=False, future=False):
    n = tokens.shape[0]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    before = torch.roll(tokens, 1)  # before[j] = tokens[j - 1]
    if same_token:
        keys = (tokens[None, :] == tokens[:, None]) & (j < i)
    else:
        keys = (before[None, :] == tokens[:, None]) & (j >= 1)
        if not future:
            keys = keys & (j <= i)
    follows = (torch.roll(tokens, 1)[None, :] == tokens[:, None]) & (j >= 1) & (j <= i)
    repeated = follows.any(-1)
    score = (w * keys).sum(-1)
    return score.mean(-1) if all_queries else score[:, repeated].mean(-1)


def _induction_head(g, tokens, h):
    n = len(tokens)
    w = rows(g, h, n, n, causal=True, sharp=0.5) * 0.2
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    follows = (torch.roll(tokens, 1)[None, :] == tokens[:, None]) & (j >= 1) & (j <= i)
    w = w + 0.8 * follows / follows.sum(-1, keepdim=True).clamp_min(1)
    return w / w.sum(-1, keepdim=True)


def _induction_cases(g):
    abc = torch.tensor([1, 2, 3, 1, 2, 3])
    mixed = torch.tensor([4, 5, 4, 5, 6, 4])
    triple = torch.tensor([7, 7, 7, 8])
    longer = torch.tensor([3, 9, 2, 5, 3, 9, 2, 5])
    return [
        Case(t("a repeated sequence, a b c a b c", "重复的序列 a b c a b c"), (rows(g, 2, 6, 6), abc)),
        Case(t("causal maps", "因果注意力"), (rows(g, 3, 6, 6, causal=True), mixed)),
        Case(t("an induction head", "一个归纳头"), (_induction_head(g, longer, 2), longer)),
        Case(t("a token repeated three times", "同一个词元重复三次"), (rows(g, 2, 4, 4), triple)),
        Case(t("one head", "只有一个头"), (rows(g, 1, 8, 8), longer)),
    ]


INDUCTION = Exercise(
    name="inside-3", func="induction_score", params="weights, tokens",
    title=t("The induction score", "归纳得分"),
    task=t("Measure the explorer's *induction*: for each query whose token occurred before, the weight on the keys "
           "that followed an earlier occurrence of that token (key j with tokens[j - 1] == tokens[i], 1 <= j <= i), "
           "where an induction head looks to copy what came next the last time; averaged over those queries.",
           "计算浏览器中的 *induction*：对每个“它的词元之前出现过”的查询，求它在那些紧跟在该词元之前某次出现之后的键上的"
           "权重之和（键 j 满足 tokens[j - 1] == tokens[i]，1 <= j <= i）——归纳头正是看那里，好把上次接下来的内容"
           "抄过来；再对这些查询取平均。"),
    doc=t("The mean weight of each head on the tokens that followed earlier\n"
          "occurrences of the query's token.\n\n"
          "weights: (H, L, L); tokens: (L,) int64, with at least one repeated token\n"
          "key j counts for query i when 1 <= j <= i and tokens[j - 1] == tokens[i];\n"
          "only the queries with at least one such key are averaged\n"
          "returns: (H,)",
          "每个头在“查询的词元之前某次出现之后紧跟的词元”上的平均权重。\n\n"
          "weights: (H, L, L)；tokens: (L,) int64，至少有一个词元重复出现\n"
          "当 1 <= j <= i 且 tokens[j - 1] == tokens[i] 时，键 j 计入查询 i；\n"
          "只对至少有一个这样的键的查询取平均\n"
          "返回：(H,)"),
    section=t("section 7, “The attention explorer” (its matrix view's table: induction)",
              "第 7 节“注意力浏览器”（矩阵视图中的表格：induction）"),
    reference=S.induction_score, cases=_induction_cases, library="attnlab.viz.explorer.documents.head_stats",
    mistakes=(
        Mistake("same token", lambda w, tok: _induction(w, tok, same_token=True),
                "the weight on the earlier occurrences of the token itself was measured; an induction head looks at "
                "the token after each earlier occurrence: tokens[j - 1] == tokens[i]",
                "计算的是在该词元之前出现的位置本身上的权重；归纳头看的是每次出现之后的那个词元：tokens[j - 1] == tokens[i]"),
        Mistake("all queries", lambda w, tok: _induction(w, tok, all_queries=True),
                "every query was averaged; only the queries whose token occurred before count",
                "对所有查询都取了平均；只应计入“词元之前出现过”的查询"),
        Mistake("future keys", lambda w, tok: _induction(w, tok, future=True),
                "keys after the query were counted too; only earlier positions count, j <= i",
                "查询之后的键也被算进去了；只应计入之前的位置，j <= i"),
    ),
)

# ----------------------------------------------------------------------------- inside-4


def _rollout(g, b, n):
    a = rows(g, b, n, n) * 0.5 + 0.5 * torch.eye(n)
    return a / a.sum(-1, keepdim=True)


CLS_MAP = Exercise(
    name="inside-4", func="cls_patch_map", params="rollout, grid",
    title=t("The class token's map over the patches", "类别 token 在图像块上的分布图"),
    task=t("Turn a ViT's rollout into the picture of section 4: the class token's row (row 0) without its own "
           "column, the shares of the patches, laid out on the patch grid row by row.",
           "把 ViT 的 rollout 变成第 4 节中的图：取类别 token 的那一行（第 0 行），去掉它自己的那一列，"
           "得到各个图像块所占的份额，再按行排成图像块网格。"),
    doc=t("The class token's rollout over the patch grid.\n\n"
          "rollout: (B, 1 + N, 1 + N), token 0 the class token; grid: (gh, gw), N = gh * gw\n"
          "returns: (B, gh, gw); [b, r, c] = rollout[b, 0, 1 + r * gw + c]",
          "类别 token 在图像块网格上的 rollout。\n\n"
          "rollout: (B, 1 + N, 1 + N)，第 0 个词元是类别 token；grid: (gh, gw)，N = gh * gw\n"
          "返回：(B, gh, gw)；[b, r, c] = rollout[b, 0, 1 + r * gw + c]"),
    section=t("section 4, “Attention rollout over a ViT's image”", "第 4 节“ViT 图像上的注意力 rollout”"),
    reference=S.cls_patch_map,
    cases=lambda g: [
        Case(t("a 4x4 grid", "4x4 网格"), (_rollout(g, 2, 17), (4, 4))),
        Case(t("a 2x3 grid", "2x3 网格"), (_rollout(g, 1, 7), (2, 3))),
        Case(t("one patch", "只有一个图像块"), (_rollout(g, 2, 2), (1, 1))),
        Case("batch 1", (_rollout(g, 1, 10), (3, 3))),
        Case("empty", (_rollout(g, 0, 5), (2, 2))),
    ],
    mistakes=(
        Mistake("column", lambda r, grid: r[:, 1:, 0].reshape(r.shape[0], *grid),
                "the class token's column was read (how much each patch takes from the class token); its row, "
                "rollout[:, 0, 1:], is what it takes from each patch",
                "读的是类别 token 的那一列（每个图像块从类别 token 取了多少）；它的那一行 rollout[:, 0, 1:] 才是"
                "它从每个图像块取了多少"),
        Mistake("column by column", lambda r, grid: r[:, 0, 1:].reshape(r.shape[0], grid[1], grid[0]).transpose(1, 2),
                "the grid was filled column by column; the patches are row-major: patch n sits at row n // gw, "
                "column n % gw",
                "网格是按列填充的；图像块按行排列：第 n 个图像块在第 n // gw 行、第 n % gw 列"),
        Mistake("last column", lambda r, grid: r[:, 0, :-1].reshape(r.shape[0], *grid),
                "the last column was dropped instead of the class token's own column, column 0: take rollout[:, 0, 1:]",
                "去掉的是最后一列，而不是类别 token 自己的那一列（第 0 列）：应取 rollout[:, 0, 1:]"),
    ),
)

EXERCISES = [HEAD_ENTROPY, PREVIOUS_TOKEN, INDUCTION, CLS_MAP]
