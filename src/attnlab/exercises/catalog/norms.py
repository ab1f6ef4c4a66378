"""Exercises of the tutorial *BatchNorm and LayerNorm in attention* (docs/en/tutorials/norms.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...attention import RMSNorm
from ...layers import LayerNorm, TokenBatchNorm
from .. import solutions as S
from ._common import Case, Exercise, Mistake, halves, randn, t


def _features(g, *shape):
    """Tokens whose features sit at different offsets and scales, as in the tutorial."""
    e = shape[-1]
    return randn(g, *shape) * torch.linspace(0.5, 3.0, e) + torch.arange(e, dtype=torch.float32)


def _affine(g, e):
    return 1 + 0.3 * randn(g, e), 0.3 * randn(g, e)


# ----------------------------------------------------------------------------- norms-1


def _layer_norm_ref(x, weight, bias, eps=1e-5):
    norm = LayerNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight.copy_(weight)
        norm.bias.copy_(bias)
        return norm(x)


def _ln(x, weight, bias, eps, *, unbiased=False, dims=(-1,), eps_outside=False, affine=True):
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, unbiased=unbiased, keepdim=True)
    y = (x - mean) / (var.sqrt() + eps if eps_outside else torch.sqrt(var + eps))
    return y * weight + bias if affine else y


def _layer_norm_cases(g):
    constant = _features(g, 2, 3, 6)
    constant[0, 1] = 2.5
    return [
        Case("random", (_features(g, 2, 5, 8), *_affine(g, 8), 1e-5)),
        Case("random2", (_features(g, 3, 16), *_affine(g, 16), 1e-5)),
        Case("one token", (_features(g, 1, 1, 8), *_affine(g, 8), 1e-5)),
        Case(t("a large eps (0.1)", "较大的 eps（0.1）"), (0.3 * randn(g, 2, 3, 4), *_affine(g, 4), 0.1)),
        Case(t("a token whose features are all equal", "某个词元的所有特征都相等"), (constant, *_affine(g, 6), 1e-5)),
        Case("float16", halves(_features(g, 2, 4, 8), *_affine(g, 8)) + (1e-5,), half=True),
        Case("batch 1", (_features(g, 1, 6, 32), *_affine(g, 32), 1e-5)),
        Case("empty", (_features(g, 0, 4, 8), *_affine(g, 8), 1e-5)),
    ]


LAYER_NORM = Exercise(
    name="norms-1", func="layer_norm", params="x, weight, bias, eps=1e-5",
    title=t("LayerNorm by hand", "手写 LayerNorm"),
    task=t("Normalize every token over its E features, (x - mean) / sqrt(var + eps), then scale by weight and shift "
           "by bias: what attnlab's LayerNorm (torch's nn.LayerNorm) computes.",
           "对每个词元在它的 E 个特征上做归一化：(x - mean) / sqrt(var + eps)，再乘以 weight、加上 bias，"
           "也就是 attnlab 的 LayerNorm（即 torch 的 nn.LayerNorm）所做的计算。"),
    doc=t("LayerNorm over the last axis.\n\n"
          "x: (..., E); weight, bias: (E,); eps: float\n"
          "returns: (..., E); every token has mean 0 and variance 1 over its E features\n"
          "before weight and bias",
          "在最后一个维度上做 LayerNorm。\n\n"
          "x: (..., E)；weight, bias: (E,)；eps: float\n"
          "返回：(..., E)；乘 weight、加 bias 之前，每个词元的 E 个特征均值为 0、方差为 1"),
    section=t("section 1, “Two norms, two axes”", "第 1 节“两种归一化，两个方向”"),
    reference=_layer_norm_ref, cases=_layer_norm_cases, library="attnlab.layers.LayerNorm",
    mistakes=(
        Mistake("unbiased", lambda x, w, b, eps=1e-5: _ln(x, w, b, eps, unbiased=True),
                "the variance was the unbiased one (torch's var() divides by E - 1 by default); LayerNorm divides by "
                "E: var(dim=-1, unbiased=False)",
                "用了无偏方差（torch 的 var() 默认除以 E - 1）；LayerNorm 除以 E：var(dim=-1, unbiased=False)"),
        Mistake("batch axes", lambda x, w, b, eps=1e-5: _ln(x, w, b, eps, dims=tuple(range(x.dim() - 1))),
                "the statistics were taken over the batch and the positions, BatchNorm's axes; LayerNorm takes them "
                "over the E features of each token (dim=-1)",
                "统计量是在批量和位置上求的，那是 BatchNorm 的方向；LayerNorm 应在每个词元的 E 个特征上求（dim=-1）"),
        Mistake("eps outside", lambda x, w, b, eps=1e-5: _ln(x, w, b, eps, eps_outside=True),
                "eps was added to the standard deviation; it goes inside the square root: sqrt(var + eps)",
                "eps 加在了标准差上；它应该在平方根里面：sqrt(var + eps)"),
        Mistake("no affine", lambda x, w, b, eps=1e-5: _ln(x, w, b, eps, affine=False),
                "weight and bias were not applied: multiply by weight, then add bias",
                "没有用上 weight 和 bias：归一化之后要乘以 weight，再加上 bias"),
    ),
)

# ----------------------------------------------------------------------------- norms-2


def _token_bn_ref(x, padding_mask, weight, bias, eps=1e-5):
    norm = TokenBatchNorm(x.shape[-1], eps=eps).train()
    with torch.no_grad():
        norm.weight.copy_(weight)
        norm.bias.copy_(bias)
        return norm(x, padding_mask=padding_mask)


def _bn(x, pad, weight, bias, eps, *, count_padding=False, unbiased=False, zero_padding=True):
    real = x.reshape(-1, x.shape[-1]) if count_padding else x[~pad]
    mean, var = real.mean(0), real.var(0, unbiased=unbiased)
    out = (x - mean) / torch.sqrt(var + eps) * weight + bias
    return out.masked_fill(pad[..., None], 0.0) if zero_padding else out


def _bn1d(x, pad, weight, bias, eps=1e-5):
    """nn.BatchNorm1d(E) applied to (B, L, E): axis 1, the positions, taken as the channels."""
    return F.batch_norm(x, None, None, weight, bias, training=True, eps=eps)


def _padded(g, b, n, e, lengths):
    x = _features(g, b, n, e)
    pad = torch.tensor(lengths)[:, None] <= torch.arange(n)
    x[pad] = 100.0  # garbage in the padded slots
    return x, pad


def _token_bn_cases(g):
    return [
        Case(t("L = E, with padding", "L = E，带填充"), (*_padded(g, 3, 8, 8, [8, 5, 7]), *_affine(g, 8), 1e-5)),
        Case("padding", (*_padded(g, 4, 6, 8, [4, 6, 3, 6]), *_affine(g, 8), 1e-5)),
        Case("no padding", (*_padded(g, 3, 5, 4, [5, 5, 5]), *_affine(g, 4), 1e-5)),
        Case("float16", halves(*_padded(g, 4, 5, 6, [5, 2, 5, 4]), *_affine(g, 6)) + (1e-5,), half=True),
        Case("batch 1", (*_padded(g, 1, 7, 8, [5]), *_affine(g, 8), 1e-5)),
    ]


TOKEN_BATCH_NORM = Exercise(
    name="norms-2", func="token_batch_norm", params="x, padding_mask, weight, bias, eps=1e-5",
    title=t("BatchNorm over tokens, padding left out", "在词元上做 BatchNorm，不统计填充"),
    task=t("Normalize each of the E features over all the real tokens of the batch (batch and positions together, "
           "the padded tokens left out of the mean and the variance), scale and shift it, and give the padded tokens "
           "an output of zero: attnlab's TokenBatchNorm in training mode.",
           "对 E 个特征中的每一个，在整个批量的所有真实词元上（批量和位置一起，填充位置不参与均值和方差）做归一化，"
           "再乘以 weight、加上 bias；填充位置的输出为零。这就是 attnlab 的 TokenBatchNorm 在训练模式下的计算。"),
    doc=t("BatchNorm for tokens, in training mode, with padding left out.\n\n"
          "x: (B, L, E); padding_mask: (B, L) bool, True = padding\n"
          "weight, bias: (E,); eps: float\n"
          "returns: (B, L, E); each feature normalized over the real tokens of the\n"
          "whole batch (biased variance); zeros at the padded tokens",
          "词元上的 BatchNorm（训练模式），填充不参与统计。\n\n"
          "x: (B, L, E)；padding_mask: (B, L) bool，True = 填充\n"
          "weight, bias: (E,)；eps: float\n"
          "返回：(B, L, E)；每个特征在整个批量的真实词元上归一化（有偏方差）；填充位置输出为零"),
    section=t("sections 2 and 3, “The common mistake” and “Padding stays out of the statistics”",
              "第 2 节“常见错误”和第 3 节“填充位置不参与统计”"),
    reference=_token_bn_ref, cases=_token_bn_cases, library="attnlab.layers.TokenBatchNorm",
    mistakes=(
        Mistake("batchnorm1d", _bn1d,
                "each position was normalized (axis 1, as nn.BatchNorm1d(E) does on a (B, L, E) tensor) instead of "
                "each feature over the batch and the positions; work on the real tokens x[~padding_mask], (N, E)",
                "归一化的是每个位置（第 1 维，nn.BatchNorm1d(E) 直接作用在 (B, L, E) 上就会这样），而不是每个特征在"
                "批量和位置上；应在真实词元 x[~padding_mask]（形状 (N, E)）上计算"),
        Mistake("padding counted", lambda x, p, w, b, eps=1e-5: _bn(x, p, w, b, eps, count_padding=True),
                "the padded tokens were counted in the mean and the variance; take them over x[~padding_mask] only",
                "填充位置也被算进了均值和方差；只应在 x[~padding_mask] 上计算"),
        Mistake("unbiased", lambda x, p, w, b, eps=1e-5: _bn(x, p, w, b, eps, unbiased=True),
                "the variance was the unbiased one (dividing by N - 1); BatchNorm normalizes with the biased variance, "
                "var(unbiased=False)",
                "用了无偏方差（除以 N - 1）；BatchNorm 归一化时用有偏方差：var(unbiased=False)"),
        Mistake("padding output", lambda x, p, w, b, eps=1e-5: _bn(x, p, w, b, eps, zero_padding=False),
                "the padded tokens were normalized too; their output must be zero (masked_fill with the padding mask)",
                "填充位置也被归一化了；它们的输出应为零（用填充掩码做 masked_fill）"),
    ),
)

# ----------------------------------------------------------------------------- norms-3


def _rms_ref(x, weight, eps=1e-6):
    norm = RMSNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight.copy_(weight)
        return norm(x)


def _rms(x, weight, eps, *, center=False, total=False, eps_outside=False, scale=True):
    if center:
        x = x - x.mean(-1, keepdim=True)
    ms = x.pow(2).sum(-1, keepdim=True) if total else x.pow(2).mean(-1, keepdim=True)
    y = x / (ms.sqrt() + eps if eps_outside else torch.sqrt(ms + eps))
    return y * weight if scale else y


def _rms_cases(g):
    return [
        Case("random", (_features(g, 2, 5, 8), _affine(g, 8)[0], 1e-6)),
        Case("random2", (randn(g, 3, 16), _affine(g, 16)[0], 1e-6)),
        Case("one token", (randn(g, 1, 1, 8), _affine(g, 8)[0], 1e-6)),
        Case(t("a large eps (0.1)", "较大的 eps（0.1）"), (0.3 * randn(g, 2, 3, 4), _affine(g, 4)[0], 0.1)),
        Case("float16", halves(_features(g, 2, 4, 8), _affine(g, 8)[0]) + (1e-6,), half=True),
        Case("batch 1", (randn(g, 1, 6, 32), _affine(g, 32)[0], 1e-6)),
        Case("empty", (randn(g, 0, 4, 8), _affine(g, 8)[0], 1e-6)),
    ]


RMS_NORM = Exercise(
    name="norms-3", func="rms_norm", params="x, weight, eps=1e-6",
    title=t("RMSNorm", "RMSNorm（均方根归一化）"),
    task=t("Divide every token by the root mean square of its features, sqrt(mean(x²) + eps), and scale by weight: "
           "the norm of Llama, Qwen and Gemma (build_norm(\"rmsnorm\", E) in attnlab). Nothing is subtracted and "
           "there is no bias.",
           "把每个词元除以它的特征的均方根 sqrt(mean(x²) + eps)，再乘以 weight：这是 Llama、Qwen、Gemma 用的归一化"
           "（attnlab 中的 build_norm(\"rmsnorm\", E)）。它不减均值，也没有 bias。"),
    doc=t("RMSNorm over the last axis.\n\n"
          "x: (..., E); weight: (E,); eps: float\n"
          "returns: (..., E) = x / sqrt(mean(x**2 over E) + eps) * weight",
          "在最后一个维度上做 RMSNorm。\n\n"
          "x: (..., E)；weight: (E,)；eps: float\n"
          "返回：(..., E) = x / sqrt(mean(x**2，对 E 求) + eps) * weight"),
    section=t("section 5, “Where the norm goes” (build_norm; RMSNorm is the third name it knows)",
              "第 5 节“归一化放在哪儿”（build_norm；RMSNorm 是它认识的第三个名字）"),
    reference=_rms_ref, cases=_rms_cases, library="attnlab.attention.RMSNorm",
    mistakes=(
        Mistake("centred", lambda x, w, eps=1e-6: _rms(x, w, eps, center=True),
                "the mean was subtracted first, which makes it a LayerNorm without bias; RMSNorm only divides by the "
                "root mean square",
                "先减去了均值，这就成了没有 bias 的 LayerNorm；RMSNorm 只除以均方根"),
        Mistake("sum", lambda x, w, eps=1e-6: _rms(x, w, eps, total=True),
                "the root of the sum of squares was used; RMSNorm takes the root of their mean: x.pow(2).mean(-1)",
                "用的是平方和的平方根；RMSNorm 用的是平方的均值的平方根：x.pow(2).mean(-1)"),
        Mistake("eps outside", lambda x, w, eps=1e-6: _rms(x, w, eps, eps_outside=True),
                "eps was added to the root; it goes inside: sqrt(mean(x²) + eps)",
                "eps 加在了平方根外面；它应该在里面：sqrt(mean(x²) + eps)"),
        Mistake("no weight", lambda x, w, eps=1e-6: _rms(x, w, eps, scale=False),
                "weight was not applied: multiply the normalized x by weight",
                "没有乘 weight：归一化之后要乘以 weight"),
    ),
)

# ----------------------------------------------------------------------------- norms-4


def _module(g, module):
    """``module`` with random parameters from ``g`` (a norm's weight around 1)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(0.5 * randn(g, *p.shape) + (1.0 if name == "weight" and p.dim() == 1 else 0.0))
    return module.eval()


def _sublayer_cases(g):
    def parts(e, norm=None):
        return _module(g, nn.Linear(e, e)), _module(g, norm if norm is not None else LayerNorm(e))

    return [
        Case(t("post-norm (norm_first=False)", "post-norm（norm_first=False）"), (randn(g, 2, 5, 8), *parts(8), False)),
        Case(t("pre-norm (norm_first=True)", "pre-norm（norm_first=True）"), (randn(g, 2, 5, 8), *parts(8), True)),
        Case("one token", (randn(g, 1, 1, 8), *parts(8), True)),
        Case(t("RMSNorm, post-norm", "RMSNorm，post-norm"), (randn(g, 3, 4, 8), *parts(8, RMSNorm(8)), False)),
        Case("batch 1", (randn(g, 1, 6, 16), *parts(16), False)),
        Case("empty", (randn(g, 0, 4, 8), *parts(8), True)),
    ]


SUBLAYER = Exercise(
    name="norms-4", func="sublayer", params="x, f, norm, norm_first",
    title=t("Pre-norm and post-norm", "pre-norm 与 post-norm"),
    task=t("Wrap a branch f (attention or the feed-forward network) in its residual sum and its norm: post-norm, "
           "norm(x + f(x)), when norm_first is False (the 2017 Transformer), pre-norm, x + f(norm(x)), when it is True "
           "(most recent models).",
           "给一个分支 f（注意力或前馈网络）加上残差和归一化：norm_first 为 False 时是 post-norm，即 norm(x + f(x))"
           "（2017 年的 Transformer）；为 True 时是 pre-norm，即 x + f(norm(x))（如今的大多数模型）。"),
    doc=t("One residual sub-layer of a Transformer block.\n\n"
          "x: (B, L, E); f: a module (B, L, E) -> (B, L, E); norm: a norm module\n"
          "norm_first: bool; True = pre-norm, False = post-norm\n"
          "returns: (B, L, E)",
          "Transformer 块中的一个残差子层。\n\n"
          "x: (B, L, E)；f：一个模块，(B, L, E) -> (B, L, E)；norm：一个归一化模块\n"
          "norm_first: bool；True = pre-norm，False = post-norm\n"
          "返回：(B, L, E)"),
    section=t("section 5, “Where the norm goes: post-norm and pre-norm”", "第 5 节“归一化放在哪儿：post-norm 与 pre-norm”"),
    reference=S.sublayer, cases=_sublayer_cases,
    mistakes=(
        Mistake("swapped", lambda x, f, n, first: S.sublayer(x, f, n, not first),
                "pre-norm and post-norm were swapped: norm_first=True is pre-norm, x + f(norm(x)); False is "
                "post-norm, norm(x + f(x))",
                "pre-norm 和 post-norm 弄反了：norm_first=True 是 pre-norm，即 x + f(norm(x))；False 是 post-norm，"
                "即 norm(x + f(x))"),
        Mistake("no residual", lambda x, f, n, first: f(n(x)) if first else n(f(x)),
                "the residual sum was left out: add x back (x + f(norm(x)), or norm(x + f(x)))",
                "漏掉了残差：要把 x 加回来（x + f(norm(x))，或 norm(x + f(x))）"),
        Mistake("branch norm", lambda x, f, n, first: x + f(n(x)) if first else x + n(f(x)),
                "post-norm normalizes the sum, norm(x + f(x)), not the branch alone, x + norm(f(x))",
                "post-norm 归一化的是和 norm(x + f(x))，而不是只归一化分支 x + norm(f(x))"),
    ),
)

EXERCISES = [LAYER_NORM, TOKEN_BATCH_NORM, RMS_NORM, SUBLAYER]
