"""The fast paths of attnlab's attention and decoding code, each against the path it replaced, on
this machine: one Markdown table per choice (same inputs, same process, median of interleaved
runs). The source comments keep each choice's reason; the numbers belong on the results page
"Why the fast paths" (docs/en/results/fast-paths.md and its Chinese twin), which ``--page``
rewrites between its ``<!-- fast_paths:NAME -->`` markers.

Run: ``.venv/bin/python benchmarks/fast_paths.py`` (a minute or two on 2 cores); ``--quick``
(tiny sizes, a few seconds: only a check that it runs); ``--only window-band,sort-int32``;
``--page`` writes the measured tables into both pages (``--docs DIR``: pages elsewhere).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import textwrap
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.attention.blocksparse import window_attention
from attnlab.attention.functional import scaled_dot_product_attention as sdpa
from attnlab.attention.exact import GroupedQueryAttention
from attnlab.attention.rmsnorm import RMSNorm
from common import busy_cores, cpu_model, pass_runners, time_interleaved  # benchmarks/common.py, beside this script

ROOT = Path(__file__).resolve().parent.parent
BF16 = torch.bfloat16
CJK = re.compile("[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]")  # docs/hooks.py joins a line break between two


@dataclass
class Table:
    """One choice's measurements: ``rows`` of (case, seconds per path, the chosen path's name where
    it changes from row to row, else None); ``paths[0]`` is the chosen path, the others the
    alternatives (``["chosen", "alternative"]`` when the rows name the chosen path)."""

    unit: str  # "ms" or "µs"
    paths: list[str]
    rows: list[tuple[str, list[float | None], str | None]]
    en: str  # the sentence saying what is compared
    zh: str
    note_en: str = ""
    note_zh: str = ""

    def markdown(self, lang: str = "en") -> str:
        zh = lang == "zh"
        per_row = any(chosen for _, _, chosen in self.rows)
        names = (["选用", "替代"] if zh else ["chosen", "alternative"]) if per_row else self.paths
        head = ["情形" if zh else "case"] + (["选用的路径" if zh else "chosen path"] if per_row else [])
        first = f"{names[0]} {self.unit}" + ("" if per_row else "（选用）" if zh else " (chosen)")
        head += [first] + [f"{n} {self.unit}" for n in names[1:]] + [f"{n} / {names[0]}" for n in names[1:]]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        scale = 1e3 if self.unit == "ms" else 1e6
        for case, times, chosen in self.rows:
            cells = [case] + ([chosen or ""] if per_row else [])
            cells += [sig3(t * scale) if t is not None else "—" for t in times]
            cells += [sig3(t / times[0]) + "x" if t is not None and times[0] else "—" for t in times[1:]]
            lines.append("| " + " | ".join(cells) + " |")
        text = wrapped(self.zh if zh else self.en, lang) + "\n\n" + "\n".join(lines)
        note = self.note_zh if zh else self.note_en
        return text + (f"\n\n{wrapped(note, lang)}" if note else "")


def wrapped(text: str, lang: str, width: int = 100) -> str:
    """A paragraph in lines of at most ``width`` columns: English broken at spaces, Chinese between
    two CJK characters (a CJK character two columns wide)."""
    if lang != "zh":  # not inside a code span
        kept = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", "\0"), text)
        return textwrap.fill(kept, width, break_long_words=False, break_on_hyphens=False).replace("\0", " ")
    lines, start, cut, cols = [], 0, 0, 0
    for i, c in enumerate(text):
        cols += 2 if unicodedata.east_asian_width(c) in "WF" else 1
        if cols > width and cut > start:
            lines.append(text[start:cut])
            start, cols = cut, sum(2 if unicodedata.east_asian_width(t) in "WF" else 1 for t in text[cut:i + 1])
        if i > 0 and CJK.match(text[i - 1]) and CJK.match(c):
            cut = i  # a line may end before c
    return "\n".join(lines + [text[start:]])


def sig3(v: float) -> str:
    """``v`` to 3 significant figures, without exponent (``1,230``, ``12.3``, ``0.0123``)."""
    if v == 0 or not math.isfinite(v):
        return str(v)
    digits = 2 - math.floor(math.log10(abs(v)))
    return f"{round(v, digits):,.{max(digits, 0)}f}"


def bf16_flags() -> list[str]:
    """This CPU's native bfloat16 flags (``avx512_bf16``, ``amx_bf16``) from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    return [name for name in ("avx512_bf16", "amx_bf16") if name in flags]


def repeats(args: argparse.Namespace, default: int) -> int:
    return args.repeats or (3 if args.quick else default)


def medians(fns: dict[str, Callable[[], object]], args: argparse.Namespace, default_repeats: int,
            inner: int = 1, warmup: int = 1) -> dict[str, float]:
    """Seconds a call of each function: the median of interleaved rounds, each round ``inner``
    calls of each (tiny operators are timed in blocks)."""
    if args.quick:
        inner = max(1, inner // 10)

    def block(fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(inner):
                fn()
        return run

    samples = time_interleaved({k: block(f) for k, f in fns.items()}, repeats(args, default_repeats), warmup)
    return {k: statistics.median(v) / inner for k, v in samples.items()}


# ---------------------------------------------------------------------------------------------- the choices
def short_bf16_rows(args: argparse.Namespace) -> Table:
    total, scale, flags = (2048 if args.quick else 16384), 32 ** -0.5, bf16_flags()

    def case(lk: int) -> tuple[str, list[float | None], str]:
        q, k, v = (torch.randn(total // lk, 4, lk, 32, dtype=BF16) for _ in range(3))
        fwd = {"flash": lambda: F.scaled_dot_product_attention(q, k, v),
               "explicit": lambda: torch.softmax(torch.matmul(q * scale, k.transpose(-2, -1)), -1,
                                                 dtype=torch.float32).to(BF16) @ v}
        t = medians(pass_runners(fwd, "fwd+bwd", [q, k, v], []), args, 7)
        chosen = "explicit" if lk < 128 and flags else "flash"
        return f"L={lk}, B={total // lk}", [t[chosen], t["flash" if chosen == "explicit" else "explicit"]], chosen

    has_en = f"has {' and '.join(flags)}" if flags else "has neither"
    has_zh = f"有 {'、'.join(flags)}" if flags else "两者都没有"
    return Table("ms", ["chosen", "alternative"], [case(lk) for lk in (64, 128, 256)],
                 f"Forward + backward of bfloat16 attention on (B, 4, L, 32) with B·L = {total:,}: torch's fused "
                 "kernel (`F.scaled_dot_product_attention`, flash) against the explicit path ((q·scale) kᵀ, a "
                 "float32 softmax cast back to bfloat16, @ v). attnlab takes the explicit path below 128 keys only "
                 f"on CPUs with avx512_bf16 or amx_bf16; this CPU {has_en}.",
                 f"bfloat16 注意力在 (B, 4, L, 32)、B·L = {total:,} 上的前向加反向：torch 的融合核"
                 "（`F.scaled_dot_product_attention`，flash）对显式路径（(q·scale) kᵀ，softmax 在 float32 中计算后"
                 "转回 bfloat16，再乘 v）。只有在有 avx512_bf16 或 amx_bf16 的 CPU 上，attnlab 才在少于 128 个 key 时"
                 f"走显式路径；这台 CPU {has_zh}。")


def sdpa_unequal_head_sizes(args: argparse.Namespace) -> Table:
    n = 256 if args.quick else 2048
    q, k, v = torch.randn(1, 8, n, 64), torch.randn(1, 8, n, 64), torch.randn(1, 8, n, 128)
    fns = {"attnlab (q, k padded)": lambda: sdpa(q, k, v, is_causal=True)[0],
           "torch (math path)": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)}
    with torch.no_grad():
        t = medians(fns, args, 7)
    return Table("ms", list(fns), [(f"n={n:,}", list(t.values()), None)],
                 f"Causal float32 forward, batch 1, 8 heads, queries and keys of 64 and values of 128, n = {n:,}: "
                 "attnlab's `scaled_dot_product_attention`, which pads q and k with zeros to 128 for torch's fused "
                 "kernel and slices, against `F.scaled_dot_product_attention` given the two head sizes, which falls "
                 "back to torch's math path (it forms the (n, n) weights).",
                 f"因果、float32 前向，批大小 1，8 个头，query 和 key 为 64 维、value 为 128 维，n = {n:,}：attnlab 的 "
                 "`scaled_dot_product_attention` 把 q 和 k 用零补到 128 维后交给 torch 的融合核再切片，对照直接把两种"
                 "头维度交给 `F.scaled_dot_product_attention`——它会退回 torch 的 math 路径（构造 (n, n) 的权重）。")


def bf16_softmax(args: argparse.Namespace) -> Table:
    total, size = (256 * 1024, "256 K") if args.quick else (4 * 1024 * 1024, "4 M")

    def case(keys: int) -> tuple[str, list[float | None], str]:
        x = torch.randn(total // keys, keys, dtype=BF16)
        fwd = {"bfloat16": lambda: torch.softmax(x, -1, dtype=BF16),
               "float32": lambda: torch.softmax(x, -1, dtype=torch.float32).to(BF16)}  # as the explicit path
        t = medians(pass_runners(fwd, "fwd+bwd", [x], []), args, 10)
        chosen = "bfloat16" if keys >= 32 else "float32"
        return f"{keys} keys", [t[chosen], t["float32" if chosen == "bfloat16" else "bfloat16"]], chosen

    return Table("ms", ["chosen", "alternative"], [case(keys) for keys in (24, 64, 96)],
                 f"Forward + backward of a softmax over {size} bfloat16 logits: `torch.softmax(x, -1, dtype=bfloat16)` "
                 "(bfloat16) against `torch.softmax(x, -1, dtype=float32).to(bfloat16)` (float32); the explicit path "
                 "takes the first on the CPU for rows of 32 keys or more.",
                 f"对 {size} 个 bfloat16 logit 做 softmax 的前向加反向：`torch.softmax(x, -1, dtype=bfloat16)`"
                 "（bfloat16）对 `torch.softmax(x, -1, dtype=float32).to(bfloat16)`（float32）；在 CPU 上，"
                 "显式路径只在每行至少 32 个 key 时用前者。")


def window_band(args: argparse.Namespace) -> Table:
    n, window = (256, 64) if args.quick else (2048, 256)
    q, k, v = (torch.randn(2, 8, n, 32) for _ in range(3))
    i = torch.arange(n)
    blocked = (i[None, :] > i[:, None]) | (i[:, None] - i[None, :] >= window)  # True = blocked
    fwd = {"band": lambda: window_attention(q, k, v, window, causal=True),
           "dense mask": lambda: sdpa(q, k, v, attn_mask=blocked)[0],
           "full causal": lambda: sdpa(q, k, v, is_causal=True)[0]}
    t = medians(pass_runners(fwd, "fwd+bwd", [q, k, v], []), args, 7)
    return Table("ms", list(fwd), [(f"n={n:,}, window {window}", list(t.values()), None)],
                 f"Forward + backward of one sliding-window causal attention, float32, batch 2, 8 heads of 32, "
                 f"n = {n:,}, window {window}: `window_attention` (the band) against attnlab's "
                 "`scaled_dot_product_attention` with a dense bool band mask (made once, outside the timing), and "
                 "full causal attention (`is_causal=True`, no window).",
                 f"一个滑动窗口因果注意力的前向加反向，float32，批大小 2，8 个 32 维的头，n = {n:,}，窗口 {window}："
                 "`window_attention`（带状计算）对 attnlab 的 `scaled_dot_product_attention` 加一个稠密的 bool 带状"
                 "掩码（在计时之外只构造一次），以及不加窗口的完整因果注意力（`is_causal=True`）。")


def decode_attend(args: argparse.Namespace) -> Table:
    def case(batch: int, lk: int) -> tuple[str, list[float | None], None]:
        q, k, v = torch.randn(batch, 2, 4, 32), torch.randn(batch, 2, lk, 32), torch.randn(batch, 2, lk, 32)
        fns = {"fused": lambda: F.scaled_dot_product_attention(q, k, v),
               "matmul": lambda: torch.softmax((q @ k.transpose(-2, -1)) * 32 ** -0.5, -1) @ v}
        with torch.no_grad():
            return f"B={batch}, L={lk}", list(medians(fns, args, 15, inner=200).values()), None

    return Table("µs", ["fused", "matmul"], [case(b, lk) for b in (1, 8) for lk in (16, 64, 272)],
                 "One decoding step's attention, float32: the 4 queries of each of 2 key/value heads as rows "
                 "(q (B, 2, 4, 32)) over L cached keys of 32: `F.scaled_dot_product_attention` (fused) against "
                 "softmax(q kᵀ · scale) v with matmul.",
                 "解码一步的注意力，float32：2 个 key/value 头各带 4 个 query，排成行（q 为 (B, 2, 4, 32)），"
                 "对 L 个缓存的 32 维 key：`F.scaled_dot_product_attention`（fused）对用 matmul 写出的 "
                 "softmax(q kᵀ · scale) v。")


def decode_step_vs_forward(args: argparse.Namespace) -> Table:
    layer = GroupedQueryAttention(256, 8, num_kv_heads=2, rope=True).eval()
    steps, prompt_len = 32, 32

    def case(batch: int) -> tuple[str, list[float | None], None]:
        prompt, xs = torch.randn(batch, prompt_len, 256), torch.randn(steps, batch, 256)

        def prefilled():
            cache = layer.new_cache()
            layer(prompt, is_causal=True, cache=cache)
            return cache

        def blocks(step: Callable) -> Callable[[], None]:  # each run: 32 steps from a fresh prefilled cache
            pool = [prefilled() for _ in range(repeats(args, 15) + 1)]  # + 1 for the warm-up, made untimed

            def run() -> None:
                cache = pool.pop()
                for x in xs:
                    step(x, cache)
            return run

        with torch.no_grad():
            fns = {"decode_step": blocks(lambda x, cache: layer.decode_step(x, cache)),
                   "forward": blocks(lambda x, cache: layer(x[:, None], is_causal=True, cache=cache))}
            t = medians(fns, args, 15)
        return f"B={batch}", [s / steps for s in t.values()], None

    return Table("µs", ["decode_step", "forward"], [case(b) for b in (1, 8)],
                 f"A step of one token through `GroupedQueryAttention(256, 8, num_kv_heads=2, rope=True)`, eval, "
                 f"no grad, float32, a cache prefilled with {prompt_len} tokens: `layer.decode_step(x, cache)` on "
                 "(B, 256) against `layer(x[:, None], is_causal=True, cache=cache)`; time a step, from blocks of "
                 f"{steps} steps each from a fresh cache.",
                 f"一个 token 经过 `GroupedQueryAttention(256, 8, num_kv_heads=2, rope=True)` 的一步，eval 模式、"
                 f"不求梯度、float32，缓存先用 {prompt_len} 个 token 填好：`layer.decode_step(x, cache)`（x 为 "
                 "(B, 256)）对 `layer(x[:, None], is_causal=True, cache=cache)`；表中是每步的时间，取自每次从新缓存"
                 f"开始的 {steps} 步。")


def qk_norm_joined(args: argparse.Namespace) -> Table:
    q_norm, k_norm = RMSNorm(48), RMSNorm(48)
    with torch.no_grad():
        for norm in (q_norm, k_norm):
            norm.weight.normal_(1.0, 0.1)
        joined = torch.cat([q_norm.weight.expand(8, 48), k_norm.weight.expand(2, 48)])  # (10, 48)

    def case(batch: int) -> tuple[str, list[float | None], None]:
        x = torch.randn(batch, 10, 48)
        fns = {"one norm": lambda: F.rms_norm(x, (48,), None, q_norm.eps) * joined,
               "two norms + cat": lambda: torch.cat([q_norm(x[:, :8]), k_norm(x[:, 8:])], dim=1)}
        with torch.no_grad():
            return f"B={batch}", list(medians(fns, args, 15, inner=500).values()), None

    return Table("µs", ["one norm", "two norms + cat"], [case(b) for b in (1, 8)],
                 "QK-norm of a decoding step, float32, 8 query heads and 2 key heads of 48: one `F.rms_norm` over "
                 "(B, 10, 48) without a weight times the joined (10, 48) weight, against two `RMSNorm(48)` modules "
                 "on (B, 8, 48) and (B, 2, 48) and `torch.cat`.",
                 "解码一步的 QK-norm，float32，8 个 query 头和 2 个 key 头，每个 48 维：对 (B, 10, 48) 做一次不带权重"
                 "的 `F.rms_norm`，再乘合并后的 (10, 48) 权重，对照两个 `RMSNorm(48)` 模块分别作用于 (B, 8, 48) 和 "
                 "(B, 2, 48) 后再 `torch.cat`。")


def rotary_roll(args: argparse.Namespace) -> Table:
    angles = torch.rand(32) * 2 * math.pi
    cos, sin = (torch.cat([f(angles)] * 2).view(1, 1, 64) for f in (torch.cos, torch.sin))
    signed_sin = torch.cat([-sin[..., :32], sin[..., 32:]], dim=-1)

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def case(batch: int) -> tuple[str, list[float | None], None]:
        x = torch.randn(batch, 10, 64)
        fns = {"roll": lambda: x * cos + x.roll(32, -1) * signed_sin,
               "rotate_half": lambda: x * cos + rotate_half(x) * sin}
        return f"B={batch}", list(medians(fns, args, 15, inner=500).values()), None

    return Table("µs", ["roll", "rotate_half"], [case(b) for b in (1, 8)],
                 "Rotary positions of a decoding step's 10 query and key heads of 64, float32: x · cos + "
                 "x.roll(32) · signed sin (the first half of sin negated) against x · cos + rotate_half(x) · sin, "
                 "rotate_half as chunk, neg and cat.",
                 "解码一步中 10 个 64 维 query 和 key 头的旋转位置编码，float32：x · cos + x.roll(32) · signed sin"
                 "（sin 的前一半取负）对 x · cos + rotate_half(x) · sin，其中 rotate_half 由 chunk、取负和 cat 组成。")


def two_d_product(args: argparse.Namespace) -> Table:
    weight, bias = torch.randn(768, 256) * 0.05, torch.randn(768)

    def case(batch: int) -> tuple[str, list[float | None], None]:
        x = torch.randn(batch, 256)
        fns = {"addmm": lambda: torch.addmm(bias, x, weight.t()),
               "F.linear": lambda: F.linear(x, weight, bias),
               "reshape, @, view": lambda: (x.reshape(batch, 1, 256) @ weight.t() + bias).view(batch, 768)}
        return f"B={batch}", list(medians(fns, args, 15, inner=500).values()), None

    return Table("µs", ["addmm", "F.linear", "reshape, @, view"], [case(b) for b in (1, 8)],
                 "A decoding step's (B, 256) rows through a 256 x 768 weight with a bias, float32: "
                 "`torch.addmm(bias, x, weight.t())` against `F.linear(x, weight, bias)` and "
                 "`(x.reshape(B, 1, 256) @ weight.t() + bias).view(B, 768)`.",
                 "解码一步的 (B, 256) 行乘 256 x 768 的权重再加偏置，float32：`torch.addmm(bias, x, weight.t())` 对 "
                 "`F.linear(x, weight, bias)` 和 `(x.reshape(B, 1, 256) @ weight.t() + bias).view(B, 768)`。")


def rms_norm_kernel(args: argparse.Namespace) -> Table:
    weight, eps = torch.randn(256) * 0.1 + 1, 1e-6

    def case(batch: int, n: int) -> tuple[str, list[float | None], None]:
        x = torch.randn(batch, n, 256)
        fns = {"F.rms_norm": lambda: F.rms_norm(x, (256,), weight, eps),
               "written out": lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight}
        inner = 200 if batch * n <= 64 else 10
        return f"B·L={batch * n:,} ({batch}x{n})", list(medians(fns, args, 15, inner=inner).values()), None

    return Table("µs", ["F.rms_norm", "written out"], [case(1, 64), case(8, 512)],
                 "RMSNorm of float32 (B, L, 256) with a weight: `F.rms_norm` (one kernel) against "
                 "`x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w`.",
                 "带权重的 RMSNorm，输入为 float32 的 (B, L, 256)：`F.rms_norm`（一个核）对 "
                 "`x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w`。")


def step_norm(args: argparse.Namespace) -> Table:
    weight = torch.randn(256) * 0.1 + 1
    size, eps = torch.tensor(256.0), torch.tensor(1e-6)

    def case(batch: int) -> tuple[str, list[float | None], None]:
        x = torch.randn(batch, 256)
        fns = {"operators": lambda: x * x.pow(2).sum(-1, keepdim=True).div_(size).add_(eps).rsqrt_() * weight,
               "F.rms_norm": lambda: F.rms_norm(x, (256,), weight, 1e-6)}
        return f"B={batch}", list(medians(fns, args, 15, inner=500).values()), None

    return Table("µs", ["operators", "F.rms_norm"], [case(b) for b in (1, 8)],
                 "A decoding step's RMSNorm of float32 (B, 256): "
                 "`x * x.pow(2).sum(-1, keepdim=True).div_(size).add_(eps).rsqrt_() * weight` with `size` and `eps` "
                 "as 0-d tensors, against `F.rms_norm(x, (256,), weight, eps)`.",
                 "解码一步对 float32 的 (B, 256) 做 RMSNorm："
                 "`x * x.pow(2).sum(-1, keepdim=True).div_(size).add_(eps).rsqrt_() * weight`（`size` 和 `eps` 是 0 维"
                 "张量）对 `F.rms_norm(x, (256,), weight, eps)`。")


def sort_int32(args: argparse.Namespace) -> Table:
    n = 200_000 if args.quick else 2_097_152
    keys = torch.randint(0, 2049, (n,), dtype=torch.int32)  # (block, stream) keys: 256 blocks x 8 streams
    wide = keys.long()
    fns = {"int32": lambda: torch.sort(keys), "int64": lambda: torch.sort(wide)}
    t = medians(fns, args, 10)
    return Table("ms", list(fns), [(f"{n:,} keys", list(t.values()), None)],
                 f"`torch.sort` of {n:,} random keys from 0 to 2,048 (as many as 256 key blocks x 8 streams of "
                 "block-sparse attention's layout give), values and indices: int32 keys against the same as int64.",
                 f"对 {n:,} 个 0 到 2,048 之间的随机 key 做 `torch.sort`（值和下标都要；这个范围与块稀疏注意力的布局中"
                 "256 个 key 块 x 8 路相当）：int32 的 key 对同样的 int64 key。")


def adamw_step(args: argparse.Namespace) -> Table:
    base = nn.Sequential(*(nn.Linear(256, 256) for _ in range(16)))  # 1,052,672 parameters in 32 tensors
    fns, failed = {}, []
    for name, options in (("fused", {"fused": True}), ("foreach", {"foreach": True}), ("default", {"foreach": False})):
        model = copy.deepcopy(base)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        try:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **options)
            opt.step()
        except (RuntimeError, TypeError, ValueError) as e:
            failed.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
            continue
        fns[name] = opt.step
    t, params = medians(fns, args, 15), sum(p.numel() for p in base.parameters())
    kinds = ["fused", "foreach", "default"]
    return Table("ms", kinds, [(f"{params:,} parameters", [t.get(k) for k in kinds], None)],
                 f"One AdamW step over 16 `nn.Linear(256, 256)` ({params:,} parameters in 32 tensors, gradients "
                 "set), float32: `fused=True` against `foreach=True` and the default (`foreach=False`).",
                 f"对 16 个 `nn.Linear(256, 256)`（{params:,} 个参数，32 个张量，梯度已给出）做一步 AdamW，float32："
                 "`fused=True` 对 `foreach=True` 和默认（`foreach=False`）。",
                 "Not supported by this torch build: " + "; ".join(failed) if failed else "",
                 "这个 torch 构建不支持：" + "；".join(failed) if failed else "")


def int8_rows(args: argparse.Namespace) -> Table:
    paths = ["int8, bfloat16 x", "int8, float32 x", "float32 mm", "bfloat16 mm"]
    w, x = torch.randn(576, 1536) * 0.02, torch.randn(1, 1536)
    scale = w.abs().amax(dim=1) / 127
    rows = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    xb, wb = x.to(BF16), w.to(BF16)
    pack = getattr(torch, "_weight_int8pack_mm", None)
    fns = {paths[0]: lambda: pack(xb, rows, scale.to(BF16)), paths[1]: lambda: pack(x, rows, scale),
           paths[2]: lambda: torch.mm(x, w.t()), paths[3]: lambda: torch.mm(xb, wb.t())}
    failed = []
    for name in paths:
        try:
            fns[name]()
        except (RuntimeError, TypeError, NotImplementedError) as e:
            why = "this torch has no torch._weight_int8pack_mm" if pack is None and name.startswith("int8") else \
                f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
            failed.append(f"{name}: {why}")
            del fns[name]
    t = medians(fns, args, 15, inner=50)
    return Table("µs", paths, [("1 x 1536 @ (576 x 1536)ᵀ", [t.get(k) for k in paths], None)],
                 "One row (1, 1536) through a 576 x 1536 weight: `torch._weight_int8pack_mm` with the weight as int8 "
                 "rows (round(w / scale), a scale per output row in x's dtype) and x in bfloat16, against the same "
                 "with x in float32, and `torch.mm` with the weight in float32 and in bfloat16.",
                 "一行 (1, 1536) 乘 576 x 1536 的权重：`torch._weight_int8pack_mm`，权重按输出行存成 int8"
                 "（round(w / scale)，每行一个与 x 同 dtype 的 scale），x 为 bfloat16；对照 x 为 float32 的同一算子，"
                 "以及权重为 float32 和 bfloat16 时的 `torch.mm`。",
                 "Failed here: " + "; ".join(failed) if failed else "",
                 "在这里失败：" + "；".join(failed) if failed else "")


def explicit_scale_order(args: argparse.Namespace) -> Table:
    q, scale = torch.randn(1, 8, 512, 64), 64 ** -0.5

    def case(lk: int) -> tuple[str, list[float | None], str]:
        kt = torch.randn(1, 8, lk, 64).transpose(-2, -1)
        fns = {"scale q": lambda: torch.matmul(q * scale, kt), "scale logits": lambda: torch.matmul(q, kt) * scale}
        t = medians(fns, args, 15, inner=5)
        chosen = "scale q" if 64 <= lk else "scale logits"  # the smaller of q (Lq, D) and the logits (Lq, Lk)
        return f"Lk={lk}", [t[chosen], t["scale logits" if chosen == "scale q" else "scale q"]], chosen

    return Table("ms", ["chosen", "alternative"], [case(lk) for lk in (512, 32)],
                 "The explicit path's logits, float32 forward, q (1, 8, 512, 64): (q · scale) kᵀ (scale q) against "
                 "(q kᵀ) · scale (scale logits); the path scales the smaller of q (Lq, D) and the logits (Lq, Lk).",
                 "显式路径的 logit，float32 前向，q 为 (1, 8, 512, 64)：(q · scale) kᵀ（scale q）对 (q kᵀ) · scale"
                 "（scale logits）；这条路径把 scale 乘在 q (Lq, D) 和 logit (Lq, Lk) 中较小的那个上。")


CHOICES: dict[str, Callable[[argparse.Namespace], Table]] = {
    "short-bf16-rows": short_bf16_rows,
    "sdpa-unequal-head-sizes": sdpa_unequal_head_sizes,
    "bf16-softmax": bf16_softmax,
    "window-band": window_band,
    "decode-attend": decode_attend,
    "decode-step-vs-forward": decode_step_vs_forward,
    "qk-norm-joined": qk_norm_joined,
    "rotary-roll": rotary_roll,
    "two-d-product": two_d_product,
    "rms-norm-kernel": rms_norm_kernel,
    "step-norm": step_norm,
    "sort-int32": sort_int32,
    "adamw-step": adamw_step,
    "int8-rows": int8_rows,
    "explicit-scale-order": explicit_scale_order,
}


# ---------------------------------------------------------------------------------------------- the pages
def measured_line(lang: str, command: str) -> str:
    """Where, when and how the tables were measured, in ``lang``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    flags, threads = bf16_flags(), torch.get_num_threads()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    today = datetime.date.today().isoformat()
    if lang == "zh":
        has = f"有 {'、'.join(flags)}" if flags else "无 avx512_bf16、amx_bf16"
        return (f"测量于 {cpu_model()} 的 {cores} 个核（{has}），{threads} 个线程，torch {torch.__version__}，"
                f"{today}，提交 {commit}：`{command}`")
    has = f"with {', '.join(flags)}" if flags else "without avx512_bf16 or amx_bf16"
    return (f"Measured on {cores} cores of {cpu_model()} ({has}), {threads} thread{'' if threads == 1 else 's'}, "
            f"torch {torch.__version__}, {today}, commit {commit}: `{command}`")


def write_pages(docs: Path, tables: dict[str, Table], command: str) -> None:
    """Each measured table into both pages, between ``<!-- fast_paths:NAME -->`` and
    ``<!-- /fast_paths:NAME -->`` (whatever lay there replaced); each page written atomically."""
    for lang in ("en", "zh"):
        path = docs / lang / "results" / "fast-paths.md"
        text, line = path.read_text(encoding="utf-8"), measured_line(lang, command)
        for name, table in tables.items():
            mark = re.escape(name)
            pair = re.compile(rf"(<!-- fast_paths:{mark} -->\n).*?(\n<!-- /fast_paths:{mark} -->)", re.S)
            body = f"\n{line}\n\n{table.markdown(lang)}\n"
            text, found = pair.subn(lambda m: m.group(1) + body + m.group(2), text)
            if found != 1:
                print(f"warning: {path}: {found} marker pairs for {name}, expected 1 (left as it was)", file=sys.stderr)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes and 3 repeats: only checks that it runs")
    parser.add_argument("--only", default="", help=f"comma-separated choices, of: {', '.join(CHOICES)}")
    parser.add_argument("--repeats", type=int, default=0, help="timed rounds per case (default: each choice's own)")
    parser.add_argument("--page", action="store_true", help="write the tables into the results pages")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs",
                        help="the folder holding en/results/fast-paths.md and zh/results/fast-paths.md (default docs/)")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(CHOICES)
    unknown = [n for n in names if n not in CHOICES]
    if unknown:
        parser.error(f"unknown choice(s) {', '.join(unknown)}; choose from {', '.join(CHOICES)}")
    if args.page and args.quick and args.docs.resolve() == (ROOT / "docs").resolve():
        parser.error("--quick tables do not go on the results pages (give --docs a copy of them to try --page)")
    busy = busy_cores()
    flags = bf16_flags()
    print(f"machine: {cpu_model()} | torch {torch.__version__} | threads {torch.get_num_threads()} | "
          f"cores busy before start: {'?' if busy is None else f'{busy:.1f}'} | "
          f"bfloat16 flags: {', '.join(flags) if flags else 'none (no avx512_bf16, no amx_bf16)'}\n")
    tables = {}
    for name in names:
        torch.manual_seed(0)
        tables[name] = CHOICES[name](args)
        print(f"### {name}\n\n{tables[name].markdown()}\n", flush=True)
    if args.page:
        command = " ".join(["python benchmarks/fast_paths.py", *map(shlex.quote, _without_docs(sys.argv[1:]))])
        threads_env = os.environ.get("OMP_NUM_THREADS")
        write_pages(args.docs, tables, (f"OMP_NUM_THREADS={threads_env} " if threads_env else "") + command)


def _without_docs(argv: list[str]) -> list[str]:
    """The command line without ``--docs DIR`` / ``--docs=DIR`` (where the pages are is not how they were measured)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--docs":
            skip = True
        elif not a.startswith("--docs="):
            out.append(a)
    return out


if __name__ == "__main__":
    main()
