"""Exercises of the tutorial *Attention in CNNs* (docs/en/tutorials/cnn-attention.md)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...attention import RelPosSelfAttention2d
from ...layers import SqueezeExcite
from ...layers.channel_attention import SpatialGate
from ...models.attention_cnn import AttentionBlock
from ._common import Case, Exercise, Mistake, halves, randn, t

# ----------------------------------------------------------------------------- cnn-1


def _pixel_ref(x, wq, wk, wv, gamma):
    c, inner = x.shape[1], wq.shape[0]
    block = AttentionBlock(c, reduction=c // inner)
    with torch.no_grad():
        for conv, w in ((block.query, wq), (block.key, wk), (block.value, wv)):
            conv.weight.copy_(w[:, :, None, None])
            conv.bias.zero_()
        block.gamma.fill_(gamma)
        return block(x)


def _pixel(x, wq, wk, wv, gamma, *, fold=True, scale=True, dim=-1, use_gamma=True):
    b, c, h, w = x.shape
    tokens = x.flatten(2).transpose(1, 2)
    q, k, v = tokens @ wq.T, tokens @ wk.T, tokens @ wv.T
    logits = q @ k.transpose(1, 2)
    if scale:
        logits = logits / math.sqrt(q.shape[-1])
    out = logits.softmax(dim=dim) @ v
    out = out.transpose(1, 2).reshape(b, c, h, w) if fold else out.reshape(b, c, h, w)
    return x + (gamma if use_gamma else 1.0) * out


def _pixel_cases(g):
    def case(b, c, h, w):
        inner = max(1, c // 8)
        return (randn(g, b, c, h, w), randn(g, inner, c) * c ** -0.5 * 2, randn(g, inner, c) * c ** -0.5 * 2,
                randn(g, c, c) * c ** -0.5, 0.5)

    return [
        Case("random", case(2, 16, 4, 4)),
        Case("non-square", case(1, 8, 3, 5)),
        Case(t("one pixel", "只有一个像素"), case(2, 8, 1, 1)),
        Case("float16", halves(*case(2, 8, 2, 3)), half=True),
        Case("batch 1", case(1, 16, 3, 3)),
        Case("empty", case(0, 8, 2, 3)),
    ]


PIXEL_ATTENTION = Exercise(
    name="cnn-1", func="pixel_attention", params="x, wq, wk, wv, gamma",
    title=t("Self-attention over the pixels of a feature map", "特征图像素上的自注意力"),
    task=t("Write the SAGAN-style attention block: every pixel gets a query, a key and a value from a 1x1 "
           "projection (given as matrices), attends to every pixel of its map with logits scaled by √(C'), and the "
           "block returns x + gamma · (the attention's output folded back into a map). Maps need not be square.",
           "实现 SAGAN 风格的注意力块：每个像素通过 1x1 投影（以矩阵的形式给出）得到查询、键和值，对同一张特征图上的"
           "所有像素做注意力（logits 除以 √(C')），块的输出是 x + gamma ·（注意力的输出还原成特征图）。特征图不一定是正方形。"),
    doc=t("Pixel self-attention with a gate gamma, (B, C, H, W) -> (B, C, H, W).\n\n"
          "x: (B, C, H, W); wq, wk: (C', C); wv: (C, C); gamma: float\n"
          "the pixels are tokens (B, H*W, C); queries tokens @ wq.T, keys tokens @ wk.T,\n"
          "values tokens @ wv.T; logits divided by sqrt(C')\n"
          "returns: x + gamma * output, (B, C, H, W)",
          "带门控 gamma 的像素自注意力，(B, C, H, W) -> (B, C, H, W)。\n\n"
          "x: (B, C, H, W)；wq, wk: (C', C)；wv: (C, C)；gamma: float\n"
          "每个像素是一个词元 (B, H*W, C)；查询 tokens @ wq.T，键 tokens @ wk.T，\n"
          "值 tokens @ wv.T；logits 除以 sqrt(C')\n"
          "返回：x + gamma * output，形状 (B, C, H, W)"),
    section=t("sections 1 and 6, “Self-attention over the pixels of a feature map” and “What goes wrong in the "
              "tutorials' code”", "第 1 节“特征图像素上的自注意力”和第 6 节“教程代码里的问题”"),
    reference=_pixel_ref, cases=_pixel_cases, library="attnlab.models.attention_cnn.AttentionBlock",
    mistakes=(
        Mistake("fold", lambda *a: _pixel(*a, fold=False),
                "the output (B, HW, C) was reshaped to (B, C, H, W) without moving the channels first; "
                "transpose(1, 2) before the reshape, or the pixels land in the wrong places",
                "输出 (B, HW, C) 没有先把通道移到前面就 reshape 成了 (B, C, H, W)；reshape 之前要 transpose(1, 2)，"
                "否则像素会跑到错误的位置"),
        Mistake("no scale", lambda *a: _pixel(*a, scale=False),
                "the logits were not divided by √(C'), the key size (q.shape[-1])",
                "logits 没有除以键的维度的平方根 √(C')（即 q.shape[-1]）"),
        Mistake("softmax axis", lambda *a: _pixel(*a, dim=1),
                "the softmax ran over the query pixels (dim=1); each query pixel's weights over the keys must sum "
                "to 1: softmax(dim=-1)",
                "softmax 沿查询像素方向（dim=1）计算了；每个查询像素对所有键的权重之和应为 1：softmax(dim=-1)"),
        Mistake("no gamma", lambda *a: _pixel(*a, use_gamma=False),
                "gamma was left out: the block returns x + gamma * output",
                "漏掉了 gamma：块的输出是 x + gamma * output"),
    ),
)

# ----------------------------------------------------------------------------- cnn-2


def _se_ref(x, w1, b1, w2, b2):
    c, hidden = x.shape[1], w1.shape[0]
    se = SqueezeExcite(c, reduction=c // hidden)
    with torch.no_grad():
        se.fc1.weight.copy_(w1[:, :, None, None])
        se.fc1.bias.copy_(b1)
        se.fc2.weight.copy_(w2[:, :, None, None])
        se.fc2.bias.copy_(b2)
        return se(x)


def _se(x, w1, b1, w2, b2, *, pool="mean", gate="sigmoid", relu=True, multiply=True):
    s = x.mean(dim=(2, 3)) if pool == "mean" else x.amax(dim=(2, 3))
    z = s @ w1.T + b1
    z = F.relu(z) if relu else z
    a = z @ w2.T + b2
    a = torch.sigmoid(a) if gate == "sigmoid" else a.softmax(dim=1)
    return x * a[:, :, None, None] if multiply else a[:, :, None, None]


def _se_cases(g):
    def case(b, c, h, w, r):
        hidden = c // r
        return (randn(g, b, c, h, w) + randn(g, 1, c, 1, 1), randn(g, hidden, c), randn(g, hidden),
                randn(g, c, hidden), randn(g, c))

    return [
        Case("random", case(2, 16, 4, 4, 4)),
        Case("random2", case(3, 8, 5, 3, 4)),
        Case(t("one pixel", "只有一个像素"), case(2, 8, 1, 1, 2)),
        Case("float16", halves(*case(2, 8, 3, 3, 4)), half=True),
        Case("batch 1", case(1, 32, 4, 4, 16)),
        Case("empty", case(0, 8, 3, 3, 4)),
    ]


SQUEEZE_EXCITE = Exercise(
    name="cnn-2", func="squeeze_excite", params="x, w1, b1, w2, b2",
    title=t("Squeeze-and-Excitation", "SE 模块：压缩与激励（Squeeze-and-Excitation）"),
    task=t("Squeeze each channel to its mean over the pixels, pass the C numbers through the bottleneck MLP "
           "(C -> C/r, ReLU, C/r -> C, sigmoid) and multiply each channel of x by its gate.",
           "把每个通道在所有像素上求平均（squeeze），让这 C 个数经过瓶颈 MLP（C -> C/r，ReLU，C/r -> C，sigmoid），"
           "再用得到的门控值去乘 x 的对应通道（excite）。"),
    doc=t("Squeeze-and-Excitation, (B, C, H, W) -> (B, C, H, W).\n\n"
          "x: (B, C, H, W); w1: (C/r, C), b1: (C/r,); w2: (C, C/r), b2: (C,)\n"
          "returns: x * sigmoid(w2 relu(w1 mean(x) + b1) + b2), one gate per channel",
          "Squeeze-and-Excitation，(B, C, H, W) -> (B, C, H, W)。\n\n"
          "x: (B, C, H, W)；w1: (C/r, C)，b1: (C/r,)；w2: (C, C/r)，b2: (C,)\n"
          "返回：x * sigmoid(w2 relu(w1 mean(x) + b1) + b2)，每个通道一个门控值"),
    section=t("section 2, “Channel attention: SE and CBAM”", "第 2 节“通道注意力：SE 与 CBAM”"),
    reference=_se_ref, cases=_se_cases, library="attnlab.layers.SqueezeExcite",
    mistakes=(
        Mistake("max pool", lambda *a: _se(*a, pool="max"),
                "each channel was squeezed by its maximum; SE takes the mean over the pixels, x.mean(dim=(2, 3)) "
                "(the maximum is CBAM's second pooling)",
                "每个通道取了最大值；SE 取的是所有像素的平均值 x.mean(dim=(2, 3))（最大值是 CBAM 的第二种池化）"),
        Mistake("softmax gate", lambda *a: _se(*a, gate="softmax"),
                "the gates were a softmax over the channels; each channel has its own gate in (0, 1): a sigmoid",
                "门控值用了沿通道的 softmax；每个通道有自己独立的、位于 (0, 1) 的门控值：应该用 sigmoid"),
        Mistake("no relu", lambda *a: _se(*a, relu=False),
                "the ReLU between the two layers of the bottleneck was left out",
                "漏掉了瓶颈 MLP 两层之间的 ReLU"),
        Mistake("gate only", lambda *a: _se(*a, multiply=False),
                "the gates were returned; multiply x by them (x * gate[:, :, None, None])",
                "返回的是门控值；应该用它们去乘 x（x * gate[:, :, None, None]）"),
    ),
)

# ----------------------------------------------------------------------------- cnn-3


def _spatial_ref(x, weight, bias):
    gate = SpatialGate(weight.shape[-1])
    with torch.no_grad():
        gate.conv.weight.copy_(weight)
        gate.conv.bias.copy_(bias)
        return gate(x)


def _spatial(x, weight, bias, *, order="mean-max", sigmoid=True, mean=True):
    avg = x.mean(1, keepdim=True) if mean else x.sum(1, keepdim=True)
    mx = x.amax(1, keepdim=True)
    pooled = torch.cat([avg, mx] if order == "mean-max" else [mx, avg], dim=1)
    out = F.conv2d(pooled, weight, bias, padding=weight.shape[-1] // 2)
    return torch.sigmoid(out) if sigmoid else out


def _spatial_cases(g):
    def case(b, c, h, w, k):
        return (randn(g, b, c, h, w) + 0.5, randn(g, 1, 2, k, k) / k, randn(g, 1))

    return [
        Case("random", case(2, 8, 5, 5, 7)),
        Case(t("a 3x3 kernel, non-square map", "3x3 卷积核，非正方形特征图"), case(1, 4, 4, 6, 3)),
        Case(t("one pixel", "只有一个像素"), case(2, 4, 1, 1, 7)),
        Case("float16", halves(*case(2, 4, 3, 3, 3)), half=True),
        Case("batch 1", case(1, 16, 6, 6, 7)),
        Case("empty", case(0, 4, 3, 3, 3)),
    ]


SPATIAL_GATE = Exercise(
    name="cnn-3", func="spatial_gate", params="x, weight, bias",
    title=t("CBAM's spatial gate", "CBAM 的空间门控"),
    task=t("Pool the feature map over its channels in two ways, the mean and the maximum (two maps, the mean "
           "first), turn them into one map with a k x k convolution that keeps the size, and squash it with a "
           "sigmoid: one gate per pixel.",
           "沿通道方向用两种方式对特征图做池化：平均值和最大值（得到两张图，平均值在前），再用保持尺寸不变的 k x k "
           "卷积把它们变成一张图，最后经过 sigmoid：每个像素一个门控值。"),
    doc=t("CBAM's spatial attention gate, (B, C, H, W) -> (B, 1, H, W).\n\n"
          "x: (B, C, H, W); weight: (1, 2, k, k) with k odd; bias: (1,)\n"
          "returns: sigmoid(conv2d([mean over C; max over C], weight, bias, padding k // 2))",
          "CBAM 的空间注意力门控，(B, C, H, W) -> (B, 1, H, W)。\n\n"
          "x: (B, C, H, W)；weight: (1, 2, k, k)，k 为奇数；bias: (1,)\n"
          "返回：sigmoid(conv2d([沿 C 的平均; 沿 C 的最大值], weight, bias, padding k // 2))"),
    section=t("section 2, “Channel attention: SE and CBAM”", "第 2 节“通道注意力：SE 与 CBAM”"),
    reference=_spatial_ref, cases=_spatial_cases, library="attnlab.layers.channel_attention.SpatialGate",
    mistakes=(
        Mistake("max first", lambda *a: _spatial(*a, order="max-mean"),
                "the two maps were stacked max first; the mean comes first: torch.cat([mean, max], dim=1)",
                "两张图按最大值在前的顺序拼接了；平均值应在前：torch.cat([mean, max], dim=1)"),
        Mistake("no sigmoid", lambda *a: _spatial(*a, sigmoid=False),
                "the sigmoid was left out: a gate lies in (0, 1)",
                "漏掉了 sigmoid：门控值应在 (0, 1) 之间"),
        Mistake("sum", lambda *a: _spatial(*a, mean=False),
                "the channels were summed instead of averaged: x.mean(dim=1, keepdim=True)",
                "沿通道求了和而不是平均：x.mean(dim=1, keepdim=True)"),
    ),
)

# ----------------------------------------------------------------------------- cnn-4


def _rel_ref(q, rel_height, rel_width, size):
    heads, d = q.shape[1], q.shape[-1]
    attn = RelPosSelfAttention2d(heads * d, heads, size=tuple(size))
    with torch.no_grad():
        attn.rel_height.copy_(rel_height)
        attn.rel_width.copy_(rel_width)
        return attn.position_logits(q, tuple(size))


def _rel(q, rh, rw, size, *, reverse=False, column_major=False, width=True):
    h, w = size
    if column_major:
        ys, xs = torch.arange(h).repeat(w), torch.arange(w).repeat_interleave(h)
    else:
        ys, xs = torch.arange(h).repeat_interleave(w), torch.arange(w).repeat(h)
    sign = -1 if reverse else 1
    rel = rh[sign * (ys[None, :] - ys[:, None]) + h - 1]
    if width:
        rel = rel + rw[sign * (xs[None, :] - xs[:, None]) + w - 1]
    return torch.einsum("bnid,ijd->bnij", q, rel)


def _rel_cases(g):
    def case(b, heads, h, w, d):
        return (randn(g, b, heads, h * w, d), randn(g, 2 * h - 1, d), randn(g, 2 * w - 1, d), (h, w))

    return [
        Case("random", case(2, 2, 3, 4, 4)),
        Case(t("a 2x2 map", "2x2 特征图"), case(1, 1, 2, 2, 8)),
        Case(t("one pixel", "只有一个像素"), case(1, 2, 1, 1, 4)),
        Case(t("a 2x5 map", "2x5 特征图"), case(2, 1, 2, 5, 4)),
        Case("float16", halves(*case(1, 2, 2, 3, 4)), half=True),
        Case("batch 1", case(1, 4, 3, 3, 8)),
        Case("empty", case(0, 2, 2, 3, 4)),
    ]


RELATIVE_LOGITS = Exercise(
    name="cnn-4", func="relative_logits", params="q, rel_height, rel_width, size",
    title=t("BoTNet's relative position logits", "BoTNet 的相对位置 logits"),
    task=t("Compute the position part of BoTNet's attention logits: query pixel i = (y_i, x_i) and key pixel "
           "j = (y_j, x_j) get q_i · (r^h[y_j - y_i] + r^w[x_j - x_i]), the offset y_j - y_i read from row "
           "y_j - y_i + H - 1 of rel_height (and the same for the width); pixels are numbered row by row.",
           "计算 BoTNet 注意力 logits 中的位置部分：查询像素 i = (y_i, x_i) 与键像素 j = (y_j, x_j) 的 logit 为 "
           "q_i · (r^h[y_j - y_i] + r^w[x_j - x_i])，偏移 y_j - y_i 对应 rel_height 的第 y_j - y_i + H - 1 行"
           "（宽度方向同理）；像素按行编号。"),
    doc=t("The content-position logits of BoTNet's 2-D relative attention.\n\n"
          "q: (B, heads, H*W, D), pixel i = y * W + x; rel_height: (2H - 1, D);\n"
          "rel_width: (2W - 1, D); size: (H, W)\n"
          "returns: (B, heads, H*W, H*W); [b, n, i, j] =\n"
          "q[b, n, i] · (rel_height[y_j - y_i + H - 1] + rel_width[x_j - x_i + W - 1])",
          "BoTNet 二维相对注意力中“内容-位置”部分的 logits。\n\n"
          "q: (B, heads, H*W, D)，像素 i = y * W + x；rel_height: (2H - 1, D)；\n"
          "rel_width: (2W - 1, D)；size: (H, W)\n"
          "返回：(B, heads, H*W, H*W)；[b, n, i, j] =\n"
          "q[b, n, i] · (rel_height[y_j - y_i + H - 1] + rel_width[x_j - x_i + W - 1])"),
    section=t("section 4, “BoTNet: MHSA with 2-D relative positions”", "第 4 节“BoTNet：带二维相对位置编码的 MHSA”"),
    reference=_rel_ref, cases=_rel_cases, library="attnlab.attention.RelPosSelfAttention2d.position_logits",
    mistakes=(
        Mistake("reversed", lambda *a: _rel(*a, reverse=True),
                "the offset was taken as y_i - y_j; BoTNet reads row y_j - y_i + H - 1 (key minus query)",
                "偏移取成了 y_i - y_j；BoTNet 读取的是第 y_j - y_i + H - 1 行（键减查询）"),
        Mistake("column major", lambda *a: _rel(*a, column_major=True),
                "the pixels were numbered column by column; they are row-major: pixel i = y * W + x",
                "像素是按列编号的；应按行编号：像素 i = y * W + x"),
        Mistake("height only", lambda *a: _rel(*a, width=False),
                "the width term was left out: each key gets the sum of its row term and its column term",
                "漏掉了宽度方向的项：每个键的位置项是行方向与列方向两项之和"),
    ),
)

EXERCISES = [PIXEL_ATTENTION, SQUEEZE_EXCITE, SPATIAL_GATE, RELATIVE_LOGITS]
