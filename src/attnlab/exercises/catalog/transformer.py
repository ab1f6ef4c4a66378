"""Exercises of the tutorial *The Transformer* (docs/en/tutorials/transformer.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...attention import merge_masks
from ...layers.pos_encoding import sinusoid_table
from .. import solutions as S
from ._common import Case, Exercise, Mistake, randint, randn, t

# ----------------------------------------------------------------------------- transformer-1


def _table(length, dim, *, halves=False, swapped=False, exponent_i=False, start=0):
    pos = torch.arange(start, start + length, dtype=torch.float32)[:, None]
    steps = torch.arange(dim // 2, dtype=torch.float32) if exponent_i else torch.arange(0, dim, 2, dtype=torch.float32)
    angle = pos * 10000.0 ** (-steps / dim)
    first, second = (torch.cos(angle), torch.sin(angle)) if swapped else (torch.sin(angle), torch.cos(angle))
    if halves:
        return torch.cat([first, second], dim=-1)
    table = torch.zeros(length, dim)
    table[:, 0::2], table[:, 1::2] = first, second
    return table


SINUSOIDS = Exercise(
    name="transformer-1", func="sinusoid_table", params="length, dim",
    title=t("Sinusoidal position encodings", "正弦位置编码"),
    task=t("Build the table of sinusoidal position encodings that the Transformer adds to its token embeddings: "
           "row m, features 2i and 2i + 1, hold sin and cos of m · 10000^(-2i/dim).",
           "构造 Transformer 加到词元嵌入上的正弦位置编码表：第 m 行的第 2i 和 2i + 1 个特征分别是 "
           "m · 10000^(-2i/dim) 的 sin 和 cos。"),
    doc=t("The sinusoidal position encodings of \"Attention Is All You Need\".\n\n"
          "length: int, the positions 0 ... length - 1; dim: even int\n"
          "returns: (length, dim) float32; [m, 2i] = sin(m * 10000**(-2i/dim)),\n"
          "[m, 2i + 1] = cos(m * 10000**(-2i/dim))",
          "《Attention Is All You Need》中的正弦位置编码。\n\n"
          "length: int，位置 0 ... length - 1；dim：偶数\n"
          "返回：(length, dim) float32；[m, 2i] = sin(m * 10000**(-2i/dim))，\n"
          "[m, 2i + 1] = cos(m * 10000**(-2i/dim))"),
    section=t("section 2, “A whole model from the registry” (its sinusoidal position encodings)",
              "第 2 节“从注册表创建完整模型”（其中的正弦位置编码）"),
    reference=sinusoid_table, library="attnlab.layers.pos_encoding.sinusoid_table", atol=1e-4,
    cases=lambda g: [
        Case(t("a short table", "短表"), (6, 8)),
        Case(t("50 positions", "50 个位置"), (50, 32)),
        Case("one token", (1, 4)),
        Case(t("dim = 2", "dim = 2"), (10, 2)),
        Case(t("no positions", "没有位置"), (0, 8)),
    ],
    mistakes=(
        Mistake("halves", lambda n, d: _table(n, d, halves=True),
                "the sines and cosines were put in two halves; the Transformer interleaves them: sin on the even "
                "features (table[:, 0::2]), cos on the odd ones (table[:, 1::2])",
                "sin 和 cos 被放在了前后两半；Transformer 是交错放的：偶数特征放 sin（table[:, 0::2]），"
                "奇数特征放 cos（table[:, 1::2]）"),
        Mistake("swapped", lambda n, d: _table(n, d, swapped=True),
                "sin and cos were swapped: sin goes on the even features, cos on the odd ones",
                "sin 和 cos 放反了：偶数特征放 sin，奇数特征放 cos"),
        Mistake("exponent", lambda n, d: _table(n, d, exponent_i=True),
                "the exponent used the pair index i instead of 2i: the frequency of features 2i and 2i + 1 is "
                "10000^(-2i/dim), torch.arange(0, dim, 2) / dim",
                "指数里用了 i 而不是 2i：第 2i 和 2i + 1 个特征的频率是 10000^(-2i/dim)，即 torch.arange(0, dim, 2) / dim"),
        Mistake("from 1", lambda n, d: _table(n, d, start=1),
                "the positions started at 1; the first row is position 0 (all sines 0, all cosines 1)",
                "位置从 1 开始了；第一行是位置 0（sin 全为 0，cos 全为 1）"),
    ),
)

# ----------------------------------------------------------------------------- transformer-2


def _decoder_mask_ref(tgt_ids, pad_id):
    b, n = tgt_ids.shape
    mask = merge_masks(None, tgt_ids == pad_id, True, b, 1, n, n, torch.float32, tgt_ids.device)
    return mask.expand(b, 1, n, n).clone()


def _ids(g, lengths, n, pad_id=0, low=3, high=13):
    ids = randint(g, low, high, len(lengths), n)
    pad = torch.tensor(lengths)[:, None] <= torch.arange(n)
    return ids.masked_fill(pad, pad_id)


def _dmask(ids, pad_id, *, query_pad=False, key_pad=True, triangle=None):
    n = ids.shape[1]
    future = torch.ones(n, n, dtype=torch.bool).triu(1) if triangle is None else triangle(n)
    pad = ids == pad_id
    mask = future[None, None].expand(ids.shape[0], 1, n, n)
    if key_pad:
        mask = mask | pad[:, None, None, :]
    if query_pad:
        mask = mask | pad[:, None, :, None]
    return mask


def _past(n):
    """The triangle the wrong way round: the past blocked."""
    return torch.ones(n, n, dtype=torch.bool).tril(-1)


def _decoder_mask_cases(g):
    with_zero = _ids(g, [4, 3], 4, pad_id=1, low=0, high=1)  # token 0 is text here: only 1 is padding
    both_sides = _ids(g, [5, 3, 4], 5)
    both_sides[2] = both_sides[2].roll(1)  # row 2 padded on the left, as a language model's prompts are
    return [
        Case(t("padding, on the right and on the left", "填充（在右边和左边）"), (both_sides, 0)),
        Case("no padding", (_ids(g, [4, 4], 4), 0)),
        Case("one token", (_ids(g, [1], 1), 0)),
        Case(t("pad_id = 1 (0 is a real token)", "pad_id = 1（0 是真实的词元）"), (with_zero, 1)),
        Case("batch 1", (_ids(g, [4], 6), 0)),
        Case("empty", (_ids(g, [], 4), 0)),
    ]


DECODER_MASK = Exercise(
    name="transformer-2", func="decoder_mask", params="tgt_ids, pad_id",
    title=t("The decoder's self-attention mask", "解码器自注意力的掩码"),
    task=t("Build the mask of the decoder's self-attention from a batch of target ids: a boolean (B, 1, Lt, Lt) "
           "tensor, True = blocked, that blocks every key after the query (causal) and every padded key.",
           "根据一批目标序列的 id 构造解码器自注意力的掩码：形状为 (B, 1, Lt, Lt) 的布尔张量，True = 屏蔽；"
           "它屏蔽查询之后的所有键（因果）以及所有填充位置的键。"),
    doc=t("The decoder self-attention mask: causal and key padding.\n\n"
          "tgt_ids: (B, Lt) int64; pad_id: int, the padding id\n"
          "returns: (B, 1, Lt, Lt) bool, True = blocked: [b, 0, i, j] is True when\n"
          "j > i or tgt_ids[b, j] == pad_id",
          "解码器自注意力的掩码：因果 + 键的填充。\n\n"
          "tgt_ids: (B, Lt) int64；pad_id: int，填充的 id\n"
          "返回：(B, 1, Lt, Lt) bool，True = 屏蔽：当 j > i 或 tgt_ids[b, j] == pad_id 时\n"
          "[b, 0, i, j] 为 True"),
    section=t("section 3, “The three masks”", "第 3 节“三种掩码”"),
    reference=_decoder_mask_ref, cases=_decoder_mask_cases, library="attnlab.attention.merge_masks",
    mistakes=(
        Mistake("inverted", lambda ids, p: ~_decoder_mask_ref(ids, p),
                "the mask is the wrong way round: in attnlab True means blocked",
                "掩码反了：attnlab 中 True 表示屏蔽"),
        Mistake("query padding", lambda ids, p: _dmask(ids, p, query_pad=True, key_pad=False),
                "the padding was put on the query rows; it blocks the padded keys, the columns: "
                "padding[:, None, None, :]",
                "填充被放在了查询所在的行上；应屏蔽的是填充位置的键，也就是列：padding[:, None, None, :]"),
        Mistake("rows and columns", lambda ids, p: _dmask(ids, p, query_pad=True),
                "the padded queries' rows were blocked too, which leaves them no key at all; only the padded keys "
                "(columns) are blocked",
                "填充位置的查询所在的行也被屏蔽了，它们就一个键也看不到了；只应屏蔽填充位置的键（列）"),
        Mistake("triangle", lambda ids, p: _dmask(ids, p, triangle=_past),
                "the triangle blocks the past instead of the future: block j > i, torch.ones(L, L).triu(1)",
                "三角形屏蔽的是过去而不是未来：应屏蔽 j > i，即 torch.ones(L, L).triu(1)"),
        Mistake("no head axis", lambda ids, p: _decoder_mask_ref(ids, p)[:, 0],
                "the head axis is missing: return (B, 1, Lt, Lt), which broadcasts over the heads",
                "缺少头的维度：应返回 (B, 1, Lt, Lt)，这样才能在各个头上广播"),
    ),
)

# ----------------------------------------------------------------------------- transformer-3


def _loss_ref(logits, targets, pad_id):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=pad_id)


def _loss(logits, targets, pad_id, *, count_pad=False, reduce="mean", dim=-1):
    logp = logits.log_softmax(dim=dim)
    nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    real = torch.ones_like(targets, dtype=torch.bool) if count_pad else targets != pad_id
    if reduce == "sum":
        return nll[real].sum()
    if reduce == "all":
        return (nll * real).sum() / targets.numel()
    return nll[real].mean()


def _loss_cases(g):
    all_pad = _ids(g, [4, 0, 2], 4, low=1, high=6)
    return [
        Case("padding", (randn(g, 3, 5, 7), _ids(g, [5, 2, 4], 5, low=1, high=7), 0)),
        Case("no padding", (randn(g, 2, 4, 6), _ids(g, [4, 4], 4, low=1, high=6), 0)),
        Case("one token", (randn(g, 1, 1, 5), _ids(g, [1], 1, low=1, high=5), 0)),
        Case(t("a row that is all padding", "整行都是填充"), (randn(g, 3, 4, 6), all_pad, 0)),
        Case(t("pad_id = 2", "pad_id = 2"), (randn(g, 2, 5, 6), _ids(g, [5, 3], 5, pad_id=2, low=3, high=6), 2)),
        Case("batch 1", (randn(g, 1, 6, 10), _ids(g, [4], 6, low=1, high=10), 0)),
    ]


PADDED_LOSS = Exercise(
    name="transformer-3", func="padded_loss", params="logits, targets, pad_id",
    title=t("The loss, padding ignored", "忽略填充的损失"),
    task=t("Compute the training loss of section 5 by hand: the mean cross-entropy of the logits against the target "
           "tokens, over the positions whose target is not padding (what F.cross_entropy(..., ignore_index=pad_id) "
           "computes).",
           "手动计算第 5 节中的训练损失：logits 相对目标词元的交叉熵的平均值，只对目标不是填充的位置求平均"
           "（也就是 F.cross_entropy(..., ignore_index=pad_id) 的结果）。"),
    doc=t("Mean cross-entropy over the target tokens that are not padding.\n\n"
          "logits: (B, L, V); targets: (B, L) int64; pad_id: int\n"
          "returns: a 0-dim tensor, the mean of -log softmax(logits)[target] over the\n"
          "positions where targets != pad_id",
          "对非填充的目标词元求交叉熵的平均值。\n\n"
          "logits: (B, L, V)；targets: (B, L) int64；pad_id: int\n"
          "返回：0 维张量，即在 targets != pad_id 的位置上 -log softmax(logits)[target] 的平均值"),
    section=t("section 5, “Train a tiny model” (the loss of its training loop)", "第 5 节“训练一个小模型”（训练循环里的损失）"),
    reference=_loss_ref, cases=_loss_cases,
    mistakes=(
        Mistake("padding counted", lambda lo, ta, p: _loss(lo, ta, p, count_pad=True),
                "the padded positions were counted; leave out every position whose target is pad_id",
                "填充位置也被计算进去了；目标为 pad_id 的位置都应去掉"),
        Mistake("sum", lambda lo, ta, p: _loss(lo, ta, p, reduce="sum"),
                "the losses were summed; the loss is their mean over the real tokens",
                "把损失求和了；应对真实词元求平均"),
        Mistake("all positions", lambda lo, ta, p: _loss(lo, ta, p, reduce="all"),
                "the sum was divided by all B·L positions; divide by the number of real (not padding) tokens",
                "除以了全部 B·L 个位置；应除以真实（非填充）词元的个数"),
        Mistake("softmax axis", lambda lo, ta, p: _loss(lo, ta, p, dim=1),
                "the log-softmax ran over the positions (dim=1); it runs over the vocabulary, the last axis",
                "log-softmax 沿位置方向（dim=1）计算了；应沿词表方向，也就是最后一个维度"),
    ),
)

# ----------------------------------------------------------------------------- transformer-4


def _greedy_cases(g):
    logits = randn(g, 4, 7)
    logits[1, 5] = 10.0  # the finished row's arg-max is neither EOS nor padding
    picks_eos = randn(g, 3, 6)
    picks_eos[1, 2] = 10.0  # row 1's arg-max is EOS (2)
    return [
        Case("random", (logits, torch.tensor([False, True, False, False]), 2, 0)),
        Case(t("a row that picks EOS", "某一行选中了 EOS"), (picks_eos, torch.tensor([False, False, True]), 2, 0)),
        Case(t("no row finished", "没有已结束的行"), (randn(g, 3, 5), torch.zeros(3, dtype=torch.bool), 2, 0)),
        Case(t("every row finished", "所有行都已结束"), (randn(g, 2, 5), torch.ones(2, dtype=torch.bool), 2, 0)),
        Case("batch 1", (randn(g, 1, 9), torch.tensor([False]), 1, 0)),
        Case("empty", (randn(g, 0, 5), torch.zeros(0, dtype=torch.bool), 2, 0)),
    ]


def _greedy(logits, finished, eos_id, pad_id, *, fill=None, update=True):
    nxt = logits.argmax(dim=-1)
    if fill is not None:
        nxt = torch.where(finished, torch.full_like(nxt, fill), nxt)
    return nxt, (finished | (nxt == eos_id)) if update else finished


GREEDY_STEP = Exercise(
    name="transformer-4", func="greedy_step", params="logits, finished, eos_id, pad_id",
    title=t("One step of greedy search", "贪心搜索的一步"),
    task=t("Choose the next token of every row of a batch, the most probable one, except in the rows that have "
           "already written EOS: they get pad_id, as generate() pads a finished row. Return the tokens and which "
           "rows have finished after this step.",
           "为批量中的每一行选出下一个词元（概率最大的那个），但已经写出 EOS 的行例外：它们得到 pad_id，"
           "就像 generate() 会用填充补齐已结束的行一样。返回这些词元，以及这一步之后哪些行已经结束。"),
    doc=t("One step of greedy decoding with finished rows.\n\n"
          "logits: (B, V); finished: (B,) bool, the rows that have written EOS\n"
          "eos_id, pad_id: int\n"
          "returns: next_tokens (B,) int64 (the arg-max, pad_id in finished rows)\n"
          "and finished (B,) bool after this step",
          "带已结束行的贪心解码的一步。\n\n"
          "logits: (B, V)；finished: (B,) bool，已经写出 EOS 的行\n"
          "eos_id, pad_id: int\n"
          "返回：next_tokens (B,) int64（取 arg-max，已结束的行为 pad_id），\n"
          "以及这一步之后的 finished (B,) bool"),
    section=t("section 6, “Greedy search and beam search”", "第 6 节“贪心解码与束搜索”"),
    reference=S.greedy_step, cases=_greedy_cases, outputs=("next_tokens", "finished"),
    mistakes=(
        Mistake("finished ignored", lambda lo, f, e, p: _greedy(lo, f, e, p),
                "the rows that had finished still got their arg-max; a finished row gets pad_id "
                "(torch.where(finished, pad_id, next_tokens))",
                "已结束的行仍然取了 arg-max；已结束的行应得到 pad_id（torch.where(finished, pad_id, next_tokens)）"),
        Mistake("eos fill", lambda lo, f, e, p: _greedy(lo, f, e, p, fill=e),
                "the finished rows got eos_id; after EOS a row is padded with pad_id",
                "已结束的行得到了 eos_id；写出 EOS 之后应该用 pad_id 补齐"),
        Mistake("not updated", lambda lo, f, e, p: _greedy(lo, f, e, p, fill=p, update=False),
                "finished was not updated: a row that writes EOS in this step has finished too "
                "(finished | (next_tokens == eos_id))",
                "没有更新 finished：在这一步写出 EOS 的行也结束了（finished | (next_tokens == eos_id)）"),
        Mistake("batch axis", lambda lo, f, e, p: (lo.argmax(dim=0), f),
                "the arg-max ran over the batch (dim=0); each row's token is the arg-max over the vocabulary, dim=-1",
                "arg-max 沿批量方向（dim=0）计算了；每一行的词元应是在词表上的 arg-max，dim=-1"),
    ),
)

EXERCISES = [SINUSOIDS, DECODER_MASK, PADDED_LOSS, GREEDY_STEP]
