"""Exercises of the tutorial *Language models* (docs/en/tutorials/language-models.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...attention import RotaryEmbedding, alibi_bias, alibi_slopes, scaled_dot_product_attention
from ...generation.processors import Temperature, TopK, TopP
from .. import solutions as S
from ._common import Case, Exercise, Mistake, halves, randn, t

# ----------------------------------------------------------------------------- lm-1


def _rope_ref(x, positions, base=10000.0):
    return RotaryEmbedding(x.shape[-1], theta=base)(x, x, positions)[0]


def _rope(x, positions, base=10000.0, *, interleaved=False, sign=1.0, exponent_2i=True, use_positions=True):
    d = x.shape[-1]
    steps = torch.arange(0, d, 2, dtype=torch.float32) if exponent_2i else torch.arange(d // 2, dtype=torch.float32)
    omega = 1.0 / base ** (steps / d)
    pos = positions if use_positions else torch.arange(x.shape[-2])
    angle = pos[:, None].float() * omega[None, :]
    cos, sin = angle.cos().to(x.dtype), (sign * angle.sin()).to(x.dtype)
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
        return out.flatten(-2)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def _rope_cases(g):
    return [
        Case("random", (randn(g, 2, 2, 5, 8), torch.arange(5), 10000.0)),
        Case(t("positions 100 to 105", "位置 100 到 105"), (randn(g, 1, 2, 6, 8), torch.arange(100, 106), 10000.0)),
        Case("one token", (randn(g, 1, 1, 1, 4), torch.tensor([7]), 10000.0)),
        Case(t("base 500000 (Llama 3)", "base 500000（Llama 3）"), (randn(g, 1, 2, 4, 16), torch.arange(4), 500000.0)),
        Case("float16", (randn(g, 2, 2, 3, 8).half(), torch.arange(3), 10000.0), half=True),
        Case(t("head size 2", "头的大小为 2"), (randn(g, 1, 1, 4, 2), torch.arange(4), 10000.0)),
        Case("empty", (randn(g, 0, 2, 3, 8), torch.arange(3), 10000.0)),
    ]


ROPE = Exercise(
    name="lm-1", func="rope", params="x, positions, base=10000.0",
    title=t("Rotary position embeddings", "旋转位置编码（RoPE）"),
    task=t("Rotate the queries (or keys) of every head by their positions, as attnlab (and Llama) does: the pair "
           "(x_i, x_{i+D/2}), one feature from each half of the head, turns by the angle "
           "position · base^(-2i/D).",
           "按位置旋转每个头的查询（或键），做法与 attnlab（以及 Llama）相同：由头的前后两半各取一个特征组成的一对 "
           "(x_i, x_{i+D/2})，旋转的角度为 position · base^(-2i/D)。"),
    doc=t("Rotary position embedding, the two halves of the head paired.\n\n"
          "x: (B, H, L, D), D even; positions: (L,) int64; base: float\n"
          "returns: (B, H, L, D); for i < D/2, with a = positions * base**(-2i/D):\n"
          "out[..., i] = x_i cos a - x_{i+D/2} sin a,\n"
          "out[..., i + D/2] = x_i sin a + x_{i+D/2} cos a",
          "旋转位置编码，头的前后两半配对。\n\n"
          "x: (B, H, L, D)，D 为偶数；positions: (L,) int64；base: float\n"
          "返回：(B, H, L, D)；对 i < D/2，记 a = positions * base**(-2i/D)：\n"
          "out[..., i] = x_i cos a - x_{i+D/2} sin a，\n"
          "out[..., i + D/2] = x_i sin a + x_{i+D/2} cos a"),
    section=t("section 2, “Rotary position embeddings (RoPE)”", "第 2 节“旋转位置编码（RoPE）”"),
    reference=_rope_ref, cases=_rope_cases, library="attnlab.attention.RotaryEmbedding", atol=1e-4,
    mistakes=(
        Mistake("interleaved", lambda x, p, b=10000.0: _rope(x, p, b, interleaved=True),
                "the pairs were neighbours (x_0, x_1), (x_2, x_3), ... as in the RoFormer paper; attnlab pairs the "
                "two halves of the head, (x_i, x_{i+D/2}), as GPT-NeoX and Llama do",
                "配对用的是相邻特征 (x_0, x_1)、(x_2, x_3)……（RoFormer 论文的写法）；attnlab 把头的前后两半配对，"
                "即 (x_i, x_{i+D/2})，与 GPT-NeoX 和 Llama 相同"),
        Mistake("direction", lambda x, p, b=10000.0: _rope(x, p, b, sign=-1.0),
                "the rotation went the other way: x'_i = x_i cos a - x_{i+D/2} sin a, "
                "x'_{i+D/2} = x_i sin a + x_{i+D/2} cos a",
                "旋转方向反了：x'_i = x_i cos a - x_{i+D/2} sin a，x'_{i+D/2} = x_i sin a + x_{i+D/2} cos a"),
        Mistake("exponent", lambda x, p, b=10000.0: _rope(x, p, b, exponent_2i=False),
                "the frequencies were base^(-i/D); pair i turns at base^(-2i/D), torch.arange(0, D, 2) / D",
                "频率用成了 base^(-i/D)；第 i 对的频率是 base^(-2i/D)，即 torch.arange(0, D, 2) / D"),
        Mistake("positions", lambda x, p, b=10000.0: _rope(x, p, b, use_positions=False),
                "the positions given were not used (0 ... L - 1 instead): with a cache the new tokens sit at later "
                "positions",
                "没有使用传入的 positions（用的是 0 ... L - 1）：有缓存时，新词元的位置在后面"),
    ),
)

# ----------------------------------------------------------------------------- lm-2


def _alibi_ref(num_heads, length):
    pos = torch.arange(length)
    return alibi_bias(alibi_slopes(num_heads), pos, pos)[0]


def _alibi(num_heads, length, *, from_zero=False, sign=-1.0, plain=False):
    if plain or from_zero:
        hs = range(num_heads) if from_zero else range(1, num_heads + 1)
        slopes = torch.tensor([2 ** (-8 * h / num_heads) for h in hs])
    else:
        slopes = alibi_slopes(num_heads)
    pos = torch.arange(length)
    return sign * slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs()


ALIBI = Exercise(
    name="lm-2", func="alibi", params="num_heads, length",
    title=t("ALiBi", "ALiBi：带线性偏置的注意力"),
    task=t("Build ALiBi's bias for every head: -slope_h · |i - j| for query i and key j, with the paper's slopes, "
           "2^(-8h/H) for h = 1 ... H when H is a power of two; for other H, the slopes of the power of two below, "
           "then every other slope of twice as many.",
           "为每个头构造 ALiBi 的偏置：查询 i、键 j 处为 -slope_h · |i - j|，斜率按论文取：H 是 2 的幂时为 "
           "2^(-8h/H)，h = 1 ... H；否则先取比 H 小的最大的 2 的幂对应的斜率，再从两倍个数的斜率中隔一个取一个补足。"),
    doc=t("ALiBi's additive bias.\n\n"
          "num_heads: int; length: int\n"
          "returns: (num_heads, length, length) float32, [h, i, j] = -slope_h * |i - j|",
          "ALiBi 的加性偏置。\n\n"
          "num_heads: int；length: int\n"
          "返回：(num_heads, length, length) float32，[h, i, j] = -slope_h * |i - j|"),
    section=t("section 3, “ALiBi”", "第 3 节“ALiBi”"),
    reference=_alibi_ref, library="attnlab.attention.alibi_bias",
    cases=lambda g: [
        Case(t("4 heads", "4 个头"), (4, 5)),
        Case(t("8 heads", "8 个头"), (8, 3)),
        Case(t("6 heads (not a power of two)", "6 个头（不是 2 的幂）"), (6, 4)),
        Case(t("one head", "1 个头"), (1, 3)),
        Case(t("12 heads", "12 个头"), (12, 2)),
        Case(t("length 0", "长度为 0"), (2, 0)),
    ],
    mistakes=(
        Mistake("from zero", lambda h, n: _alibi(h, n, from_zero=True),
                "the slopes started at 2^0 = 1; they are 2^(-8h/H) for h = 1 ... H, the first 2^(-8/H)",
                "斜率从 2^0 = 1 开始了；应为 2^(-8h/H)，h = 1 ... H，第一个是 2^(-8/H)"),
        Mistake("sign", lambda h, n: _alibi(h, n, sign=1.0),
                "the bias was positive; ALiBi subtracts slope · distance, a penalty for far keys",
                "偏置是正的；ALiBi 减去的是 slope · 距离，对远处的键施加惩罚"),
        Mistake("plain geometric", lambda h, n: _alibi(h, n, plain=True),
                "for a head count that is not a power of two the slopes are not 2^(-8h/H): take the 2^floor(log2 H) "
                "slopes of the power of two below, then every other slope of twice that many",
                "头数不是 2 的幂时，斜率不是 2^(-8h/H)：先取 2^floor(log2 H) 个头对应的斜率，再从两倍个数的斜率中"
                "隔一个取一个补足"),
    ),
)

# ----------------------------------------------------------------------------- lm-3


REPEAT_KV = Exercise(
    name="lm-3", func="repeat_kv", params="x, n_rep",
    title=t("Repeat the key/value heads", "复制键/值头"),
    task=t("In grouped-query attention n_rep query heads share one key/value head. Repeat each key/value head "
           "n_rep times, next to each other, so that query heads 0 ... n_rep - 1 meet key/value head 0.",
           "在分组查询注意力中，n_rep 个查询头共享一个键/值头。把每个键/值头连续复制 n_rep 次，"
           "使查询头 0 ... n_rep - 1 对应键/值头 0。"),
    doc=t("The key/value heads repeated for the query heads (grouped-query attention).\n\n"
          "x: (B, Hkv, L, D); n_rep: int\n"
          "returns: (B, Hkv * n_rep, L, D); head h of the output is head h // n_rep of x",
          "为查询头复制键/值头（分组查询注意力）。\n\n"
          "x: (B, Hkv, L, D)；n_rep: int\n"
          "返回：(B, Hkv * n_rep, L, D)；输出的第 h 个头是 x 的第 h // n_rep 个头"),
    section=t("section 4, “Grouped-query and multi-query attention”", "第 4 节“分组查询注意力与多查询注意力”"),
    reference=S.repeat_kv, library="attnlab.attention.GroupedQueryAttention",
    cases=lambda g: [
        Case("random", (randn(g, 2, 2, 3, 4), 4)),
        Case(t("multi-query: one key/value head", "多查询：只有一个键/值头"), (randn(g, 1, 1, 5, 8), 8)),
        Case(t("n_rep = 1", "n_rep = 1"), (randn(g, 2, 3, 4, 4), 1)),
        Case("float16", (randn(g, 2, 2, 3, 4).half(), 2), half=True),
        Case("batch 1", (randn(g, 1, 4, 6, 8), 3)),
        Case("empty", (randn(g, 0, 2, 3, 4), 2)),
    ],
    mistakes=(
        Mistake("tiled", lambda x, n: x.repeat(1, n, 1, 1),
                "the heads were tiled (0, 1, 0, 1, ...); each head is repeated next to itself (0, 0, 1, 1, ...): "
                "repeat_interleave(n_rep, dim=1)",
                "各个头被整体平铺了（0, 1, 0, 1, ……）；每个头应连续复制（0, 0, 1, 1, ……）：repeat_interleave(n_rep, dim=1)"),
        Mistake("positions", lambda x, n: x.repeat_interleave(n, dim=2),
                "the positions were repeated (dim=2); the heads are axis 1",
                "复制的是位置（dim=2）；头在第 1 维"),
    ),
)

# ----------------------------------------------------------------------------- lm-4


def _cache_ref(cache_k, cache_v, q, k, v):
    keys, values = torch.cat([cache_k, k], dim=2), torch.cat([cache_v, v], dim=2)
    out, _ = scaled_dot_product_attention(q, keys, values, is_causal=True)
    return out, keys, values


def _cache(cache_k, cache_v, q, k, v, *, prepend=False, mask="bottom-right", attend_first=False):
    if prepend:
        keys, values = torch.cat([k, cache_k], dim=2), torch.cat([v, cache_v], dim=2)
    else:
        keys, values = torch.cat([cache_k, k], dim=2), torch.cat([cache_v, v], dim=2)
    if attend_first:
        out = F.scaled_dot_product_attention(q, cache_k, cache_v)
    elif mask == "top-left":
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
    elif mask == "none":
        out = F.scaled_dot_product_attention(q, keys, values)
    else:
        out = scaled_dot_product_attention(q, keys, values, is_causal=True)[0]
    return out, keys, values


def _cache_cases(g):
    def case(b, h, cached, new, d):
        return (randn(g, b, h, cached, d), randn(g, b, h, cached, d), randn(g, b, h, new, d), randn(g, b, h, new, d),
                randn(g, b, h, new, d))

    return [
        Case(t("one new token after 3 cached", "缓存 3 个之后的一个新词元"), case(2, 2, 3, 1, 4)),
        Case(t("2 new tokens after 4 cached", "缓存 4 个之后的 2 个新词元"), case(1, 2, 4, 2, 8)),
        Case(t("an empty cache, a prompt of 3 tokens", "空缓存，3 个词元的提示词"), case(2, 1, 0, 3, 4)),
        Case("float16", halves(*case(1, 2, 5, 1, 4)), half=True),
        Case("batch 1", case(1, 4, 6, 2, 8)),
        Case("empty", case(0, 2, 3, 1, 4)),
    ]


CACHE_STEP = Exercise(
    name="lm-4", func="cache_step", params="cache_k, cache_v, q, k, v",
    title=t("One step with a key/value cache", "使用键值缓存的一步"),
    task=t("Append the new keys and values to the cache along the positions, then let the new queries attend over "
           "the whole cache with attnlab's causal mask, aligned bottom-right: the new queries see every cached key "
           "and the new keys up to their own position. Return the output and the grown cache.",
           "把新的键和值沿位置方向追加到缓存中，然后让新的查询用 attnlab 的因果掩码（右下角对齐）对整个缓存做注意力："
           "新查询能看到所有缓存的键，以及新键中直到它自己位置的那些。返回输出和变长后的缓存。"),
    doc=t("One decoding step of attention with a key/value cache.\n\n"
          "cache_k, cache_v: (B, H, T, D), the T cached positions (T may be 0)\n"
          "q, k, v: (B, H, Lq, D), the Lq new positions\n"
          "returns: output (B, H, Lq, D), cache_k and cache_v (B, H, T + Lq, D);\n"
          "new query i sees the keys 0 ... T + i",
          "使用键值缓存的一步注意力解码。\n\n"
          "cache_k, cache_v: (B, H, T, D)，缓存的 T 个位置（T 可以为 0）\n"
          "q, k, v: (B, H, Lq, D)，Lq 个新位置\n"
          "返回：output (B, H, Lq, D)，以及 cache_k 和 cache_v (B, H, T + Lq, D)；\n"
          "第 i 个新查询能看到键 0 ... T + i"),
    section=t("sections 1 and 5, “Causal masks: why a language model needs one” and “The key/value cache and its "
              "memory”",
              "第 1 节“因果掩码：语言模型为什么需要它”和第 5 节“键值缓存及其内存”"),
    reference=_cache_ref, cases=_cache_cases, outputs=("output", "cache_k", "cache_v"),
    library="attnlab.attention.scaled_dot_product_attention",
    mistakes=(
        Mistake("top-left", lambda *a: _cache(*a, mask="top-left"),
                "the causal mask was aligned top-left (torch's is_causal), so the new queries missed the cached keys; "
                "attnlab's is aligned bottom-right: new query i sees keys 0 ... T + i",
                "因果掩码按左上角对齐了（torch 的 is_causal），新查询就看不到缓存的键；attnlab 的掩码按右下角对齐："
                "第 i 个新查询能看到键 0 ... T + i"),
        Mistake("attend first", lambda *a: _cache(*a, attend_first=True),
                "the queries attended over the cache before the new keys and values were appended; append first, "
                "then attend (a token sees itself)",
                "在追加新的键和值之前就做了注意力；应先追加，再做注意力（词元要能看到它自己）"),
        Mistake("prepended", lambda *a: _cache(*a, prepend=True),
                "the new keys and values were put in front of the cache; append them at the end, "
                "torch.cat([cache_k, k], dim=2)",
                "新的键和值被放在了缓存的前面；应追加到末尾：torch.cat([cache_k, k], dim=2)"),
        Mistake("no mask", lambda *a: _cache(*a, mask="none"),
                "no causal mask: a new query also saw the new keys after it",
                "没有因果掩码：新查询也看到了它之后的新键"),
    ),
)

# ----------------------------------------------------------------------------- lm-5


TUTORIAL_LOGITS = torch.tensor([[3.0, 2.5, 2.0, 1.0, 0.5, 0.0]])


def _top_p(logits, p, *, keep_crossing=True, sort=True, probs=False):
    if sort:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
    else:
        sorted_logits, order = logits, torch.arange(logits.shape[-1]).expand_as(logits)
    pr = sorted_logits.softmax(-1)
    drop = (pr.cumsum(-1) - pr >= p) if keep_crossing else (pr.cumsum(-1) >= p)
    drop = drop.scatter(-1, order, drop)
    out = logits.masked_fill(drop, float("-inf"))
    return out.softmax(-1) if probs else out


def _shuffled(g, logits):
    return logits[:, torch.randperm(logits.shape[-1], generator=g)]


TOP_P = Exercise(
    name="lm-5", func="top_p_filter", params="logits, p",
    title=t("Top-p (nucleus) filtering", "Top-p（核采样）过滤"),
    task=t("Keep the smallest set of most probable tokens whose probability reaches p, the nucleus (the token that "
           "crosses p is kept), and set every other logit to -inf, as generate(top_p=p) does before it samples.",
           "保留概率之和达到 p 的最小的一组最可能的词元，即“核”（越过 p 的那个词元也保留），其余 logits 都设为 -inf；"
           "generate(top_p=p) 在采样之前就是这样做的。"),
    doc=t("Top-p filtering of the logits.\n\n"
          "logits: (B, V); p: float in (0, 1)\n"
          "returns: (B, V): the logits of the nucleus unchanged, -inf elsewhere; a token\n"
          "is kept when the probability of the tokens ranked above it is below p",
          "对 logits 做 top-p 过滤。\n\n"
          "logits: (B, V)；p: float，取值在 (0, 1)\n"
          "返回：(B, V)：核中的 logits 保持不变，其余为 -inf；当排在一个词元前面的词元的\n"
          "概率之和小于 p 时，这个词元被保留"),
    section=t("section 6, “Sampling: choosing the next token”", "第 6 节“采样：选择下一个 token”"),
    reference=lambda logits, p: TopP(p)(None, logits), library="attnlab.generation.processors.TopP",
    cases=lambda g: [
        Case(t("the tutorial's six logits, p = 0.7", "教程里的 6 个 logits，p = 0.7"), (TUTORIAL_LOGITS.clone(), 0.7)),
        Case("random", (2 * randn(g, 3, 10), 0.9)),
        Case(t("p = 0.01: only the most probable token", "p = 0.01：只剩最可能的词元"), (randn(g, 2, 8), 0.01)),
        Case(t("the tutorial's logits, shuffled, p = 0.8", "打乱顺序的教程 logits，p = 0.8"),
             (_shuffled(g, TUTORIAL_LOGITS), 0.8)),
        Case("batch 1", (randn(g, 1, 12), 0.5)),
        Case("empty", (randn(g, 0, 5), 0.9)),
    ],
    mistakes=(
        Mistake("crossing dropped", lambda lo, p: _top_p(lo, p, keep_crossing=False),
                "the token that crosses p was dropped; it is kept: drop a token when the probability ranked above "
                "it, cumsum - probs, reaches p",
                "越过 p 的那个词元被去掉了；它应该保留：当排在一个词元前面的概率之和（cumsum - probs）达到 p 时才去掉它"),
        Mistake("not sorted", lambda lo, p: _top_p(lo, p, sort=False),
                "the probabilities were summed in the vocabulary's order; sort them, most probable first, then map "
                "the decision back (scatter with the sort's order)",
                "按词表顺序累加了概率；应先按概率从大到小排序，再把结果映射回原来的位置（用排序的下标做 scatter）"),
        Mistake("probabilities", lambda lo, p: _top_p(lo, p, probs=True),
                "probabilities were returned; return the logits, with -inf outside the nucleus",
                "返回的是概率；应返回 logits，核之外的位置为 -inf"),
    ),
)

# ----------------------------------------------------------------------------- lm-6


def _probs_ref(logits, temperature, top_k):
    return TopK(top_k)(None, Temperature(temperature)(None, logits)).softmax(-1)


def _probs(logits, temperature, top_k, *, multiply=False, renormalize=True, largest=True):
    scaled = logits * temperature if multiply else logits / temperature
    kept = torch.zeros_like(scaled, dtype=torch.bool).scatter_(-1, scaled.topk(top_k, dim=-1, largest=largest).indices,
                                                               True)
    if renormalize:
        return scaled.masked_fill(~kept, float("-inf")).softmax(-1)
    return scaled.softmax(-1).masked_fill(~kept, 0.0)


SAMPLING_PROBS = Exercise(
    name="lm-6", func="sampling_probs", params="logits, temperature, top_k",
    title=t("Temperature and top-k", "温度与 top-k"),
    task=t("Compute the distribution generate(temperature=T, top_k=k) samples from: divide the logits by the "
           "temperature, keep the k largest, and take the softmax over those, the others getting probability 0.",
           "计算 generate(temperature=T, top_k=k) 采样时用的概率分布：把 logits 除以温度，只保留最大的 k 个，"
           "在它们上面做 softmax，其余词元的概率为 0。"),
    doc=t("The probabilities of sampling with a temperature and top-k.\n\n"
          "logits: (B, V); temperature: float > 0; top_k: int, 1 <= top_k <= V\n"
          "returns: (B, V); each row sums to 1, zero outside its top_k tokens",
          "带温度和 top-k 的采样概率。\n\n"
          "logits: (B, V)；temperature: float > 0；top_k: int，1 <= top_k <= V\n"
          "返回：(B, V)；每行之和为 1，top_k 之外的词元概率为 0"),
    section=t("section 6, “Sampling: choosing the next token”", "第 6 节“采样：选择下一个 token”"),
    reference=_probs_ref, library="attnlab.generation.processors.TopK",
    cases=lambda g: [
        Case(t("the tutorial's logits, T = 1, top_k = 3", "教程里的 logits，T = 1，top_k = 3"),
             (TUTORIAL_LOGITS.clone(), 1.0, 3)),
        Case("random", (2 * randn(g, 3, 10), 0.5, 4)),
        Case(t("T = 2, top_k = V: no filter", "T = 2，top_k = V：不过滤"), (randn(g, 2, 6), 2.0, 6)),
        Case(t("top_k = 1: greedy", "top_k = 1：贪心"), (randn(g, 2, 7), 1.0, 1)),
        Case("batch 1", (randn(g, 1, 12), 0.8, 5)),
        Case("empty", (randn(g, 0, 5), 1.0, 2)),
    ],
    mistakes=(
        Mistake("multiplied", lambda lo, T, k: _probs(lo, T, k, multiply=True),
                "the logits were multiplied by the temperature; they are divided by it (T < 1 sharpens, T > 1 "
                "flattens)",
                "logits 乘以了温度；应该除以温度（T < 1 使分布更尖锐，T > 1 使分布更平坦）"),
        Mistake("not renormalized", lambda lo, T, k: _probs(lo, T, k, renormalize=False),
                "the softmax ran over all the tokens and the others were zeroed, so a row no longer sums to 1; set "
                "the other logits to -inf first, then take the softmax",
                "先在所有词元上做了 softmax 再把其余的置零，每行之和就不再是 1；应先把其余的 logits 设为 -inf，再做 softmax"),
        Mistake("smallest", lambda lo, T, k: _probs(lo, T, k, largest=False),
                "the top_k least probable tokens were kept; keep the most probable ones",
                "保留的是最不可能的 top_k 个词元；应保留最可能的"),
    ),
)

EXERCISES = [ROPE, ALIBI, REPEAT_KV, CACHE_STEP, TOP_P, SAMPLING_PROBS]
