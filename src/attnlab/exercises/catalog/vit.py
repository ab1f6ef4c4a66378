"""Exercises of the tutorial *The Vision Transformer* (docs/en/tutorials/vit.md)."""

from __future__ import annotations

import torch

from ...layers.patch_embed import PatchEmbed
from .. import solutions as S
from ._common import Case, Exercise, Mistake, halves, randn, rows, t

# ----------------------------------------------------------------------------- vit-1


def _patches(images, p, order):
    b, c, h, w = images.shape
    cut = images.unfold(2, p, p).unfold(3, p, p)  # (B, C, H/p, W/p, p, p)
    return cut.permute(*order).reshape(b, (h // p) * (w // p), c * p * p)


def _patchify_cases(g):
    return [
        Case("random", (randn(g, 2, 3, 8, 8), 4)),
        Case(t("a non-square grid", "非正方形的网格"), (randn(g, 1, 1, 6, 9), 3)),
        Case(t("one patch", "只有一个图像块"), (randn(g, 2, 3, 4, 4), 4)),
        Case("float16", (randn(g, 2, 3, 4, 4).half(), 2), half=True),
        Case("batch 1", (randn(g, 1, 3, 6, 6), 2)),
        Case("empty", (randn(g, 0, 3, 8, 8), 4)),
    ]


PATCHIFY = Exercise(
    name="vit-1", func="patchify", params="images, p",
    title=t("Cut an image into patches", "把图像切成图像块"),
    task=t("Cut every image into p x p patches, row by row (left to right, then top to bottom), and flatten each "
           "patch in the order (channel, row, column), the order of a convolution's weight (E, C, p, p): so that "
           "patches @ weight.reshape(E, -1).T is the patch embedding.",
           "把每张图像切成 p x p 的图像块，按行排列（先从左到右，再从上到下），每个图像块按（通道、行、列）的顺序展平，"
           "也就是卷积权重 (E, C, p, p) 的顺序：这样 patches @ weight.reshape(E, -1).T 就是图像块嵌入。"),
    doc=t("(B, C, H, W) -> (B, N, C*p*p), N = (H/p) * (W/p).\n\n"
          "images: (B, C, H, W), H and W multiples of p; p: int\n"
          "returns: (B, N, C*p*p); patch n = row * (W/p) + column, each flattened\n"
          "as (C, p, p)",
          "(B, C, H, W) -> (B, N, C*p*p)，N = (H/p) * (W/p)。\n\n"
          "images: (B, C, H, W)，H 和 W 都是 p 的倍数；p: int\n"
          "返回：(B, N, C*p*p)；第 n 个图像块 n = 行 * (W/p) + 列，每块按 (C, p, p) 展平"),
    section=t("section 1, “An image as a sequence of patches”", "第 1 节“把图像变成图像块序列”"),
    reference=S.patchify, cases=_patchify_cases,
    mistakes=(
        Mistake("channels last", lambda x, p: _patches(x, p, (0, 2, 3, 4, 5, 1)),
                "each patch was flattened channels-last, (p, p, C); the convolution's weight (E, C, p, p) needs "
                "(C, p, p): permute(0, 2, 3, 1, 4, 5) after the two unfolds",
                "每个图像块按通道在后 (p, p, C) 展平了；卷积权重 (E, C, p, p) 需要 (C, p, p) 的顺序："
                "两次 unfold 之后用 permute(0, 2, 3, 1, 4, 5)"),
        Mistake("column major", lambda x, p: _patches(x, p, (0, 3, 2, 1, 4, 5)),
                "the patches were taken column by column; the ViT (and the convolution) goes row by row: "
                "n = row * (W/p) + column",
                "图像块是按列取的；ViT（以及卷积）是按行取的：n = 行 * (W/p) + 列"),
        Mistake("plain reshape", lambda x, p: x.reshape(x.shape[0], -1, x.shape[1] * p * p),
                "the image was reshaped without being cut into patches: consecutive numbers in memory are a row of "
                "pixels, not a patch; cut with unfold (or reshape to (B, C, H/p, p, W/p, p) and permute)",
                "图像没有被切成块，而是直接 reshape 了：内存中相邻的数是一行像素而不是一个图像块；应先用 unfold 切块"
                "（或 reshape 成 (B, C, H/p, p, W/p, p) 再 permute）"),
    ),
)

# ----------------------------------------------------------------------------- vit-2


def _patch_embed_ref(images, weight, bias):
    e, c, p, _ = weight.shape
    layer = PatchEmbed(img_size=tuple(images.shape[2:]), patch_size=p, in_chans=c, embed_dim=e)
    with torch.no_grad():
        layer.proj.weight.copy_(weight)
        layer.proj.bias.copy_(bias)
        return layer(images)


def _embed_channels_last(images, weight, bias):
    """Patches flattened as (p, p, C), the weight as (C, p, p)."""
    patches = _patches(images, weight.shape[-1], (0, 2, 3, 4, 5, 1))
    return patches @ weight.reshape(weight.shape[0], -1).T + bias


def _embed_cases(g):
    def case(b, c, h, w, e, p):
        return (randn(g, b, c, h, w), randn(g, e, c, p, p) / p, randn(g, e))

    return [
        Case("random", case(2, 3, 8, 8, 16, 4)),
        Case(t("a non-square grid", "非正方形的网格"), case(1, 1, 6, 9, 8, 3)),
        Case(t("one patch", "只有一个图像块"), case(2, 3, 4, 4, 6, 4)),
        Case("float16", halves(*case(2, 2, 4, 4, 8, 2)), half=True),
        Case("batch 1", case(1, 3, 6, 6, 12, 2)),
        Case("empty", case(0, 3, 8, 8, 16, 4)),
    ]


PATCH_EMBED = Exercise(
    name="vit-2", func="patch_embed", params="images, weight, bias",
    title=t("The patch embedding", "图像块嵌入"),
    task=t("Turn a batch of images into patch tokens with the projection of a ViT's patch embedding, given as a "
           "convolution weight (E, C, p, p) and bias (E,): one token per patch, row by row, (B, N, E).",
           "用 ViT 的图像块嵌入的投影（以卷积权重 (E, C, p, p) 和偏置 (E,) 的形式给出）把一批图像变成图像块词元："
           "每个图像块一个词元，按行排列，形状为 (B, N, E)。"),
    doc=t("The patch embedding of a ViT.\n\n"
          "images: (B, C, H, W); weight: (E, C, p, p); bias: (E,)\n"
          "returns: (B, N, E) with N = (H/p) * (W/p), patches row by row",
          "ViT 的图像块嵌入。\n\n"
          "images: (B, C, H, W)；weight: (E, C, p, p)；bias: (E,)\n"
          "返回：(B, N, E)，N = (H/p) * (W/p)，图像块按行排列"),
    section=t("section 1, “An image as a sequence of patches”", "第 1 节“把图像变成图像块序列”"),
    reference=_patch_embed_ref, cases=_embed_cases, library="attnlab.layers.patch_embed.PatchEmbed",
    mistakes=(
        Mistake("no transpose", lambda x, w, b: torch.nn.functional.conv2d(x, w, b, stride=w.shape[-1]).flatten(2),
                "the result is (B, E, N): after flatten(2), transpose(1, 2) gives one token per row, (B, N, E)",
                "结果是 (B, E, N)：flatten(2) 之后还要 transpose(1, 2)，才能每行一个词元，得到 (B, N, E)"),
        Mistake("channels last", _embed_channels_last,
                "each patch was flattened as (p, p, C) but the weight as (C, p, p): flatten both the same way, "
                "(C, p, p), or use the convolution",
                "图像块按 (p, p, C) 展平，而权重按 (C, p, p) 展平：两者要用同样的顺序 (C, p, p)，或者直接用卷积"),
        Mistake("no bias", lambda x, w, b: S.patch_embed(x, w, torch.zeros_like(b)),
                "the bias was left out: add it to every token",
                "漏掉了偏置：每个词元都要加上它"),
    ),
)

# ----------------------------------------------------------------------------- vit-3


def _cls_cases(g):
    def case(b, n, e):
        return (randn(g, b, n, e), randn(g, 1, 1, e), randn(g, 1, n + 1, e))

    return [
        Case("random", case(2, 4, 8)),
        Case("random2", case(3, 9, 16)),
        Case(t("one patch", "只有一个图像块"), case(2, 1, 8)),
        Case("float16", halves(*case(2, 4, 8)), half=True),
        Case("batch 1", case(1, 16, 8)),
        Case("empty", case(0, 4, 8)),
    ]


CLASS_TOKEN = Exercise(
    name="vit-3", func="add_class_token", params="patches, cls_token, pos_embed",
    title=t("Class token and position embeddings", "类别 token 与位置编码"),
    task=t("Put the learned class token in front of every image's patch tokens and add the position embeddings, one "
           "per token, the class token's first: the sequence the ViT's first block receives.",
           "把学到的类别 token 放在每张图像的图像块词元前面，再加上位置编码（每个词元一个，类别 token 的在最前面）："
           "这就是 ViT 第一个块收到的序列。"),
    doc=t("The ViT's input sequence: [class token, patches] + position embeddings.\n\n"
          "patches: (B, N, E); cls_token: (1, 1, E); pos_embed: (1, 1 + N, E)\n"
          "returns: (B, 1 + N, E), the class token at position 0",
          "ViT 的输入序列：[类别 token, 图像块] + 位置编码。\n\n"
          "patches: (B, N, E)；cls_token: (1, 1, E)；pos_embed: (1, 1 + N, E)\n"
          "返回：(B, 1 + N, E)，类别 token 在位置 0"),
    section=t("sections 1 and 3, “An image as a sequence of patches” and “Position embeddings”",
              "第 1 节“把图像变成图像块序列”和第 3 节“位置编码”"),
    reference=S.add_class_token, cases=_cls_cases,
    mistakes=(
        Mistake("last", lambda x, c, p: torch.cat([x, c.expand(x.shape[0], -1, -1)], dim=1) + p,
                "the class token was put last; it goes in front, at position 0 (torch.cat([cls, patches], dim=1))",
                "类别 token 被放在了最后；它应在最前面，即位置 0（torch.cat([cls, patches], dim=1)）"),
        Mistake("no position for cls", lambda x, c, p: torch.cat([c.expand(x.shape[0], -1, -1), x + p[:, 1:]], dim=1),
                "the class token got no position embedding; pos_embed has one row for it too, row 0: add pos_embed "
                "after the concatenation",
                "类别 token 没有加位置编码；pos_embed 也有它的一行（第 0 行）：应在拼接之后再加 pos_embed"),
        Mistake("added", lambda x, c, p: x + c + p[:, 1:],
                "the class token was added to every patch; it is one more token, put in front of them "
                "(torch.cat along dim=1)",
                "类别 token 被加到了每个图像块上；它是多出来的一个词元，应拼接在最前面（沿 dim=1 做 torch.cat）"),
    ),
)

# ----------------------------------------------------------------------------- vit-4


def _rollout_ref(maps):
    from ...viz import attention_rollout  # the plotting package: only when this exercise runs

    return attention_rollout(maps)


def _rollout(maps, *, identity=True, renormalize=True, left=True):
    result = None
    for a in maps:
        a = a.mean(dim=-3)
        if identity:
            a = a + torch.eye(a.shape[-1])
            if renormalize:
                a = a / a.sum(-1, keepdim=True)
        result = a if result is None else (a @ result if left else result @ a)
    return result


def _rollout_cases(g):
    return [
        Case(t("2 layers", "2 层"), ([rows(g, 2, 4, 5, 5) for _ in range(2)],)),
        Case(t("3 layers, causal maps", "3 层，因果注意力"), ([rows(g, 1, 2, 4, 4, causal=True) for _ in range(3)],)),
        Case(t("1 layer", "1 层"), ([rows(g, 2, 3, 6, 6)],)),
        Case("one token", ([rows(g, 2, 2, 1, 1) for _ in range(2)],)),
        Case("batch 1", ([rows(g, 1, 4, 17, 17) for _ in range(3)],)),
        Case("empty", ([rows(g, 0, 2, 3, 3) for _ in range(2)],)),
    ]


ROLLOUT = Exercise(
    name="vit-4", func="attention_rollout", params="maps",
    title=t("Attention rollout", "注意力 rollout"),
    task=t("Chain the attention of all layers into one matrix: per layer average the heads, add the identity for the "
           "residual connection and renormalize the rows, then multiply the layers, the last on the left: "
           "R = Â_L ... Â_1, as attnlab.viz.attention_rollout computes it.",
           "把所有层的注意力串成一个矩阵：每一层先对各个头取平均，加上单位矩阵表示残差连接，再把每行重新归一化；"
           "然后把各层相乘，后面的层在左边：R = Â_L ... Â_1，与 attnlab.viz.attention_rollout 的计算相同。"),
    doc=t("Attention rollout (Abnar & Zuidema, 2020).\n\n"
          "maps: a list with one tensor (B, H, N, N) per layer, first layer first;\n"
          "each row sums to 1\n"
          "returns: (B, N, N); R = Â_L ... Â_1 with Â = (mean over heads + I), rows\n"
          "renormalized to sum to 1",
          "注意力 rollout（Abnar 与 Zuidema，2020）。\n\n"
          "maps：列表，每层一个张量 (B, H, N, N)，第一层在前；每行之和为 1\n"
          "返回：(B, N, N)；R = Â_L ... Â_1，其中 Â = (各头的平均 + I)，\n"
          "每行重新归一化使其和为 1"),
    section=t("section 5, “What the class token looks at: attention rollout”", "第 5 节“类别 token 在看哪里：注意力 rollout”"),
    reference=_rollout_ref, cases=_rollout_cases, library="attnlab.viz.attention_rollout",
    mistakes=(
        Mistake("no identity", lambda maps: _rollout(maps, identity=False),
                "the residual connection was left out: add the identity to each layer's averaged map, then "
                "renormalize the rows",
                "漏掉了残差连接：每一层平均后的注意力要加上单位矩阵，再把每行重新归一化"),
        Mistake("order", lambda maps: _rollout(maps, left=False),
                "the layers were multiplied in the wrong order: each later layer multiplies from the left, "
                "R = Â_L ... Â_2 Â_1 (result = a @ result)",
                "各层相乘的顺序反了：后面的层从左边乘，R = Â_L ... Â_2 Â_1（result = a @ result）"),
        Mistake("not renormalized", lambda maps: _rollout(maps, renormalize=False),
                "the rows were not renormalized after adding the identity: each row of A + I sums to 2, divide it "
                "by its sum",
                "加上单位矩阵之后没有把每行重新归一化：A + I 的每一行之和为 2，要除以这一行的和"),
    ),
)

EXERCISES = [PATCHIFY, PATCH_EMBED, CLASS_TOKEN, ROLLOUT]
