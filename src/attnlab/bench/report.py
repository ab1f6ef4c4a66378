"""The attention benchmark's report: Markdown tables and PNG plots from ``results.json``.

:func:`write_report` writes ``table.md``, ``time.png`` and ``memory.png`` into the output
folder; :func:`markdown` returns the tables as text. Every number comes from the
measured records; the theory columns (complexities, what each kind can express) are the
papers' and are labelled as such.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import InputError
from ..io import atomic_write_bytes, read_json_mapping
from ..report.html import value_text
from ..report.markdown import markdown_to_html
from ..report.page import Html, Image, Note, Part, Section, Table, render_html
from .machine import machine_label
from .scaling import VARIANTS, crossover, fit_exponent

__all__ = ["write_report", "markdown", "THEORY", "allocator_verdict", "is_bench_dir", "write_bench_report"]

# variant -> (mechanism, compute (theory), memory (theory), expressiveness (theory))
THEORY: dict[str, tuple[str, str, str, str]] = {
    "exact": ("Full attention, fused kernel", "O(n²d)", "O(nd): weights never stored",
              "every pair of tokens, exact softmax"),
    "exact_weights": ("Full attention, weights formed", "O(n²d)", "O(n²)",
                      "every pair, exact; the weights can be looked at"),
    "exact_causal": ("Full attention, fused kernel, causal", "O(n²d / 2)", "O(nd)",
                     "every earlier token, exact softmax: the reference of the causal kinds"),
    "local": ("Local (sliding window w)", "O(nwd)", "O(nw)",
              "tokens within w only; farther ones only through depth"),
    "sparse": ("Sparse (BigBird blocks)", "O(n(w+g+r)bd)", "O(n(w+g+r)b)",
               "window + global + random blocks; global tokens see all"),
    "linear": ("Linear (elu+1 kernel)", "O(nd²)", "O(nd)", "a positive kernel in place of softmax: blunter, rank ≤ d"),
    "performer": ("Performer (FAVOR+, m features)", "O(nmd)", "O(nm + nd)",
                  "unbiased random-feature estimate of softmax; noisy for large logits"),
    "linformer": ("Linformer (k projections)", "O(nkd)", "O(nk)", "rank ≤ k; fixed maximum length; not causal"),
    "nystrom": ("Nyström (m landmarks)", "O(nmd + m³)", "O(nm)", "rank-m approximation of softmax; not causal"),
    "topk": ("Top-k (k best keys per query; k = 1: hard)", "O(n²d)", "O(n²)",
             "softmax over each query's k best scores: sparse by content; no saving"),
    "lsh": ("LSH (Reformer: hashed buckets, chunks c)", "O(ncd + n log n)", "O(nc)",
            "keys chosen by content (shared with queries); misses what hashes elsewhere"),
    "latent": ("Latent (DeepSeek's MLA, a latent of r)", "O(n²d + nrd)", "O(nd); its cache r numbers a token",
               "full attention through one latent of keys and values shared by the heads"),
    "sinks": ("Sinks (gpt-oss: a sink logit a head)", "O(n²d)", "O(nd): fused kernel, the sink one key more",
              "full attention that may also attend to nothing"),
    "differential": ("Differential (two softmax maps subtracted)", "O(n²d)", "O(nd): fused kernel",
                     "a difference of two maps cancels the attention they share"),
    "gated_delta": ("Gated delta rule (Gated DeltaNet, chunks c)", "O(nd² + ncd)", "O(nd); a d x d state a head",
                    "a decaying associative memory written by the delta rule; causal only"),
    "dsa": ("DeepSeek sparse attention (an indexer's top k)", "O(n²d_i + nkd)",
            "O(nk): the indexer a chunk of queries at a time",
            "each query attends to the k keys its indexer picks"),
    "nsa": ("Native sparse attention (compressed, selected, window)", "O(n²d/b + n(sb + w)d)",
            "O(n(s + w)): blocked", "block summaries, the best blocks in full and a window, gated; causal only"),
}
PASS_NAMES = {"fwd": "forward", "fwd_bwd": "forward + backward"}


def _fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "—"
    return f"{ms / 1e3:.2f} s" if ms >= 1e3 else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"


def _fmt_mb(mb: float | None) -> str:
    if mb is None:
        return "—"
    return f"{mb / 1024:.1f} GB" if mb >= 1024 else f"{mb:.0f} MB" if mb >= 10 else f"{mb:.1f} MB"


def _exp(x: float | None) -> str:
    return "—" if x is None else f"n^{x:.2f}"


def _point(recs: list[dict[str, Any]], variant: str, n: int, pass_: str) -> dict[str, Any] | None:
    return next((r for r in recs if r["variant"] == variant and r["n"] == n and r["pass"] == pass_), None)


def _quality(data: dict[str, Any], task: str, kind: str) -> float | None:
    r = next((r for r in data.get("quality", []) if r["task"] == task and r["kind"] == kind), None)
    return None if r is None else r["accuracy"]


def _scaling_tables(data: dict[str, Any]) -> list[str]:
    recs = data.get("scaling", [])
    if not recs:
        return []
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in recs)]
    lengths = sorted({r["n"] for r in recs})
    big = lengths[-1]
    lo = 2048 if big > 2048 else lengths[0]
    lines = [f"### The tutorials' table, measured (n = {lengths[0]:,} to {big:,}; exponents fitted for "
             f"{lo:,} ≤ n ≤ {big:,})", "",
             "| mechanism | compute complexity: theory, measured (fwd / fwd+bwd), time at n = " + f"{big:,}"
             + " | memory: theory, measured, peak at n = " + f"{big:,}" + " (fwd / fwd+bwd)"
             + " | expressiveness: theory; needle accuracy, MR accuracy |",
             "| --- | --- | --- | --- |"]
    for v in variants:
        mech, comp, mem, expr = THEORY.get(v, (v, "", "", ""))
        te = [fit_exponent(recs, v, p, "ms", lo, big) for p in ("fwd", "fwd_bwd")]
        me = [fit_exponent(recs, v, p, "peak_mb", lo, big) for p in ("fwd", "fwd_bwd")]
        tb = [(_point(recs, v, big, p) or {}).get("ms") for p in ("fwd", "fwd_bwd")]
        mb = [(_point(recs, v, big, p) or {}).get("peak_mb") for p in ("fwd", "fwd_bwd")]
        kind = VARIANTS[v].kind
        measured_as = v not in ("exact_weights", "exact_causal")  # the quality tasks ran the kind as it is named
        needle = _quality(data, "needle", kind) if measured_as else None
        mr = _quality(data, "mr", kind) if measured_as else None
        acc = " · ".join(x for x in (
            None if needle is None else f"needle {100 * needle:.1f}%", None if mr is None else f"MR {100 * mr:.1f}%") if x)
        lines.append(f"| {mech} | {comp}; {_exp(te[0])} / {_exp(te[1])}; {_fmt_ms(tb[0])} / {_fmt_ms(tb[1])} "
                     f"| {mem}; {_exp(me[0])} / {_exp(me[1])}; {_fmt_mb(mb[0])} / {_fmt_mb(mb[1])} "
                     f"| {expr}; {acc or '—'} |")
    lines.append("")
    for pass_ in ("fwd", "fwd_bwd"):
        if not any(r["pass"] == pass_ for r in recs):
            continue
        for key, title, fmt in (("ms", "time", _fmt_ms), ("peak_mb", "peak memory", _fmt_mb)):
            lines += [f"#### {PASS_NAMES[pass_]}: {title}", "",
                      "| variant | settings | " + " | ".join(f"{n:,}" for n in lengths) + " |",
                      "| --- | --- | " + " | ".join("---:" for _ in lengths) + " |"]
            for v in variants:
                cells = []
                for n in lengths:
                    r = _point(recs, v, n, pass_)
                    cells.append("skipped" if r is not None and r.get(key) is None and r.get("skipped")
                                 else fmt(None if r is None else r.get(key)))
                lines.append(f"| {v} | {VARIANTS[v].note} | " + " | ".join(cells) + " |")
            lines.append("")
    skipped = [r for r in recs if r.get("skipped")]
    for r in skipped:
        lines.append(f"- skipped: {r['variant']} at n = {r['n']:,}, {PASS_NAMES[r['pass']]}: {r['skipped']}")
    if skipped:
        lines.append("")
    for pass_ in ("fwd", "fwd_bwd"):
        c = crossover(recs, "linear", "exact", pass_)
        if c["relation"] == "between":
            lines.append(f"- Crossover, {PASS_NAMES[pass_]}: linear attention is faster than the fused exact kernel "
                         f"from n ≈ {c['n']:,.0f} (interpolated between the measured lengths).")
        elif c["relation"] == "below":
            lines.append(f"- Crossover, {PASS_NAMES[pass_]}: linear attention is faster at every measured length "
                         f"(from n = {c['n']:,}).")
        elif c["relation"] == "above":
            lines.append(f"- Crossover, {PASS_NAMES[pass_]}: linear attention is slower at every measured length "
                         f"(up to n = {c['n']:,}).")
    ref = _point(recs, "exact_weights", big, "fwd")
    if ref and ref.get("peak_mb"):
        ratios = []
        for v in variants:
            if v.startswith("exact"):
                continue
            r = _point(recs, v, big, "fwd_bwd") or _point(recs, v, big, "fwd")
            if r and r.get("peak_mb"):
                ratios.append(f"{v} 1/{ref['peak_mb'] / max(r['peak_mb'], 1e-9):,.0f}")
        lines.append(f"- Peak memory at n = {big:,} (forward + backward) as a fraction of exact attention's with "
                     f"its weights formed (forward only, {_fmt_mb(ref['peak_mb'])}): " + ", ".join(ratios) + ".")
    return lines + [""]


def _studies_tables(data: dict[str, Any]) -> list[str]:
    recs = data.get("studies", [])
    if not recs:
        return []
    lines: list[str] = []
    titles = {"heads": "Heads at width 256 (MR)", "pos_encoding": "Position encoding (MR)",
              "attn_dropout": "Attention dropout (MR)"}
    for study, title in titles.items():
        rows = [r for r in recs if r["study"] == study]
        if not rows:
            continue
        lines += [f"### {title}", "", f"| {study} | test accuracy | ms per training step |", "| --- | ---: | ---: |"]
        lines += [f"| {r['value']} | {100 * r['accuracy']:.2f}% | {r['ms_per_step']:.0f} |" for r in rows]
        lines.append("")
    rows = {r["value"]: r for r in recs if r["study"] == "checkpointing"}
    if rows:
        any_row = next(iter(rows.values()))
        lines += [f"### Gradient checkpointing: {any_row['model']}, batch {any_row['batch']}, "
                  f"{any_row['image_size']}x{any_row['image_size']}, one training step", "",
                  "| checkpointing | peak memory | step time |", "| --- | ---: | ---: |"]
        for value in (False, True):
            r = rows.get(value)
            if r:
                lines.append(f"| {'on' if value else 'off'} | {_fmt_mb(r.get('peak_mb'))} | {_fmt_ms(r.get('ms'))} |")
        off, on = rows.get(False), rows.get(True)
        if off and on and off.get("ms") and on.get("ms"):
            lines.append("")
            lines.append(f"Checkpointing: {off['peak_mb'] / on['peak_mb']:.2f}x less peak memory for "
                         f"{on['ms'] / off['ms']:.2f}x the step time.")
        lines.append("")
    return lines


def _quality_table(data: dict[str, Any]) -> list[str]:
    recs = data.get("quality", [])
    needle = [r for r in recs if r["task"] == "needle"]
    mr = {r["kind"]: r for r in recs if r["task"] == "mr"}
    if not recs:
        return []
    lines = []
    if needle:
        r0 = needle[0]
        mr_steps = next(iter(mr.values())).get("steps") if mr else None
        lines += [f"### Quality after a fixed budget: needle (n = {r0['n']:,}, {r0['steps']} steps of "
                  f"{r0['batch_size']}, chance {100 * r0['chance']:.0f}%)"
                  + (f" and MR ({mr_steps} steps)" if mr_steps else ""), "",
                  "| kind | needle accuracy | needle in the first quarter | elsewhere | needle training time "
                  "| MR accuracy | MR options |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for r in needle:
            m = mr.get(r["kind"])
            opts = "" if m is None else ", ".join(f"{k}={v}" for k, v in m["options"].items())
            mr_acc = "—" if m is None else f"{100 * m['accuracy']:.2f}%"
            lines.append(f"| {r['kind']} | {100 * r['accuracy']:.1f}% | {100 * r['near_accuracy']:.1f}% | "
                         f"{100 * r['far_accuracy']:.1f}% | {r['train_seconds']:.0f} s | {mr_acc} | {opts} |")
        lines.append("")
    return lines


def _fidelity_table(data: dict[str, Any]) -> list[str]:
    recs = data.get("fidelity", [])
    if not recs:
        return []
    r0 = recs[0]
    lines = [f"### Error against exact attention on a trained model's queries, keys and values (MR classifier, "
             f"{r0['layers']} layers, {r0['sentences']:,} test sentences)", "",
             "| kind | settings | relative error of the output (mean over layers) | per layer | reference "
             "| kept: the exact weight (top-k), the keys' and values' energy (latent) |",
             "| --- | --- | ---: | --- | --- | ---: |"]
    for r in recs:
        opts = ", ".join(f"{k}={v}" for k, v in r["options"].items())
        layers = " / ".join(f"{e:.3f}" for e in r["error_per_layer"])
        kept = f"{100 * r['kept_mass']:.1f}%" if "kept_mass" in r else \
            f"{100 * r['kept_energy']:.1f}%" if "kept_energy" in r else ""
        lines.append(f"| {r['label']} | {opts} | {r['error']:.3f} | {layers} | {r['reference']} | {kept} |")
    return lines + [""]


def _allocator_table(data: dict[str, Any]) -> list[str]:
    recs = [r for r in data.get("allocator", []) if r.get("ms")]
    if not recs:
        return []
    lengths = sorted({r["n"] for r in recs})
    lo, hi = lengths[0], lengths[-1]
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in recs)]

    def of(heap: str) -> list[dict[str, Any]]:
        return [r for r in recs if r.get("heap") == heap]

    def at(heap: str, v: str, n: int, key: str) -> Any:
        return (_point(of(heap), v, n, "fwd") or {}).get(key)

    def faults(heap: str, v: str) -> str:
        counts = [at(heap, v, n, "faults_per_call") for n in (lo, hi)]
        return " / ".join("—" if c is None else f"{c:,.0f}" for c in counts)

    lines = [f"### Why a linear-cost kind's time grows faster than n: work, page faults, caches (forward, "
             f"n = {lo:,} to {hi:,})", "",
             "Each point measured twice, one after the other: with glibc's default allocation (a freed block over "
             "its mmap threshold, at most 32 MiB, goes back to the system and comes back as fresh pages, faulted in "
             "and zeroed) and with freed memory kept in the process. The work is counted, not timed: the same on "
             "every machine.", "",
             "| variant | time exponent, default / kept | time at n = " + f"{hi:,}" + ", default / kept "
             "| page faults a call at n = " + f"{lo:,} / {hi:,}" + ", default; kept "
             "| multiply-adds exponent | bytes-written exponent | what grows faster than n |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for v in variants:
        te = [fit_exponent(of(h), v, "fwd", "ms", lo, hi) for h in ("default", "kept")]
        work = [fit_exponent(of("default"), v, "fwd", k, lo, hi) for k in ("flops", "bytes_written")]
        lines.append(f"| {v} | {_exp(te[0])} / {_exp(te[1])} | {_fmt_ms(at('default', v, hi, 'ms'))} / "
                     f"{_fmt_ms(at('kept', v, hi, 'ms'))} | {faults('default', v)}; {faults('kept', v)} "
                     f"| {_exp(work[0])} | {_exp(work[1])} | {allocator_verdict(*te, *work)} |")
    return lines + [""]


def allocator_verdict(time_default: float | None, time_kept: float | None, flops: float | None,
                      written: float | None) -> str:
    """Which of the causes the allocator part separates makes a kind's time grow faster than
    ``n`` (exponents fitted over the same lengths; 0.05 of an exponent is taken as noise):
    the work itself (multiply-adds or bytes written growing faster than n), page faults (the
    exponent falls when freed memory is kept), or what is left once both are ruled out, the
    caches (the same work a token costs more once the data outgrows them)."""
    if None in (time_default, time_kept, flops, written):
        return "—"
    causes = []
    if max(flops, written) > 1.05:  # type: ignore[operator]
        causes.append(f"the work (n^{max(flops, written):.2f})")  # type: ignore[type-var]
    if time_default - time_kept > 0.05:  # type: ignore[operator]
        causes.append("page faults: fresh pages each call")
    if time_kept > max(1.05, max(flops, written) + 0.05):  # type: ignore[operator, type-var]
        causes.append("caches and memory traffic")
    return "; ".join(causes) or "nothing: linear"


def markdown(data: dict[str, Any]) -> str:
    m = data.get("machine", {})
    head = [f"Machine: {machine_label(m)}, {m.get('cores', '?')} cores, device {m.get('device', '?')}; "
            "float32, batch 1, 8 heads of 64."
            + (" QUICK RUN: the figures mean nothing." if data.get("quick") else ""), ""]
    return "\n".join(head + _scaling_tables(data) + _quality_table(data) + _fidelity_table(data)
                     + _studies_tables(data) + _allocator_table(data))


def _plots(data: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in data.get("scaling", []) if r.get("ms") is not None]
    if not recs:
        return []
    written = []
    for key, name, label in (("ms", "time.png", "time (ms)"), ("peak_mb", "memory.png", "peak memory (MB)")):
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
        for ax, pass_ in zip(axes, ("fwd", "fwd_bwd")):
            for v in VARIANTS:
                pts = sorted((r["n"], r[key]) for r in recs if r["variant"] == v and r["pass"] == pass_ and r[key] > 0)
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=v, linestyle="--" if v.startswith("exact") else "-")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length n")
            ax.set_title(PASS_NAMES[pass_])
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel(label)
        axes[1].legend(fontsize=8)
        fig.suptitle(f"attention {label.split(' (')[0]} against length (batch 1, 8 heads of 64, float32)")
        fig.tight_layout()
        path = out / name
        tmp = out / f".{name}.tmp.png"
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        tmp.replace(path)
        written.append(path)
    return written


def write_report(data: dict[str, Any], out: str | Path) -> list[Path]:
    """Write ``table.md`` and the plots into ``out``; returns the paths written."""
    out = Path(out)
    atomic_write_bytes(out / "table.md", markdown(data).encode())
    return [out / "table.md", *_plots(data, out)]


# ----------------------------------------------------------------------------- the page


def is_bench_dir(folder: str | Path) -> bool:
    """An ``attnlab bench attention`` output folder: its ``results.json``, no ``config.yaml``."""
    folder = Path(folder)
    if (folder / "config.yaml").is_file() or not (folder / "results.json").is_file():
        return False
    try:
        data = json.loads((folder / "results.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and any(k in data for k in ("scaling", "quality", "fidelity", "studies"))


def write_bench_report(out_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``out_dir/report.html`` (or ``out``) from the benchmark's ``results.json``,
    ``table.md`` (its Markdown tables, as HTML tables) and ``time.png``/``memory.png``."""

    out_dir = Path(out_dir)
    if not (out_dir / "results.json").is_file():
        raise InputError(f"out_dir must be an 'attnlab bench attention' output folder with results.json; "
                         f"{out_dir} has none")
    data = read_json_mapping(out_dir / "results.json")
    table = out_dir / "table.md"
    text = table.read_text(encoding="utf-8") if table.is_file() else markdown(data)
    machine = data.get("machine", {})
    about: list[Part] = [Table([(k, value_text(k, v)) for k, v in machine.items()], ("machine", "value"))]
    if data.get("quick"):
        about.insert(0, Note("A quick run (tiny sizes and budgets): it shows that the benchmark runs; "
                             "the figures mean nothing."))
    plots: list[Part] = [Image(out_dir / name, caption) for name, caption in
                         (("time.png", "time against sequence length"),
                          ("memory.png", "peak memory against sequence length")) if (out_dir / name).is_file()]
    sections = [
        Section("Machine", about),
        Section("Tables", [Html(markdown_to_html(text))]),
        Section("Plots", plots or [Note("No time.png or memory.png: the scaling part has not run.")]),
    ]
    subtitle = (f"{out_dir.resolve()}, report written {time.strftime('%Y-%m-%d %H:%M:%S')} "
                f"by attnlab {__version__}.")
    path = Path(out) if out is not None else out_dir / "report.html"
    atomic_write_bytes(path, render_html("attnlab bench attention", sections, subtitle).encode())
    return path
