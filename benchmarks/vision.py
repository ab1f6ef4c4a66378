"""Throughput of attnlab's vision models on the CPU, with timm's ViT as the reference.

What it measures
----------------
Images per second at batch 128 (``--batch``; 16 with ``--quick``), 32x32 inputs, 2 threads (``--threads``), for

* ``vit_cifar_patch4``: the CIFAR-scale ViT (patch 4 -> 64 tokens + class token, width
  192, 6 blocks, 3 heads, mlp_ratio 2.0, 10 classes, drop_path_rate 0.1). timm's
  ``VisionTransformer`` is built with exactly the same arguments; the parameter counts
  are checked equal, and timm's weights are loaded into an attnlab model in the same
  process to check that the two compute the same function.
* ``botnet_cifar`` (attnlab only; skipped with a note while it is not registered).

Passes: ``train`` = forward + cross-entropy + backward + ``SGD(momentum=0.9)`` step in
train mode (dropout / stochastic depth active); ``infer`` = eval mode under
``torch.no_grad()``. Precisions: ``fp32``, and ``bf16`` =
``torch.autocast("cpu", dtype=torch.bfloat16)`` around the forward and loss (weights and
optimizer stay float32).

Each number is the median of N timed steps after a warm-up. FLOPs are counted with
``torch.utils.flop_counter.FlopCounterMode`` on one float32 forward of the batch (plus a
formula for CPU flash attention, which the counter does not know); a training step is
counted as 3x a forward. The header prints the rate of a 2048x2048 float32 and bfloat16
matmul (512x512 where one 2048 product would take over 5 s): when bf16 is not
faster there, the CPU has no fast bf16 path (no AMX / AVX512-BF16) and bf16 autocast
can only lose.

The timm column
---------------
attnlab's venv has no timm. The script re-invokes itself with ``--backend timm`` under
``--timm-python`` (default ``/work/timm-venv/bin/python``; see ``benchmarks/timm_parity.py``
for making that venv), where it times timm's model and, interleaved with it in the same
process, attnlab's (same torch build, same weights). The ``attnlab/timm`` column is the
ratio of the two main columns (attnlab's venv vs the timm venv: the torch versions may
differ, both are printed); ``same process`` is the ratio measured inside the timm venv,
which isolates the implementations from the torch build. Without that interpreter the
timm columns read "timm not available".

Run (from the repository root)::

    .venv/bin/python benchmarks/vision.py               # full measurement
    .venv/bin/python benchmarks/vision.py --quick       # smoke run
    .venv/bin/python benchmarks/vision.py --json vision.json --timm-python /path/to/python
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from common import busy_cores, cpu_model, time_interleaved  # benchmarks/common.py, beside this script

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TIMM_PYTHON = "/work/timm-venv/bin/python"
IMG, CLASSES = 32, 10
# The CIFAR ViT, as timm VisionTransformer arguments; attnlab's vit_cifar_patch4 has the same defaults.
VIT_CIFAR = dict(img_size=32, patch_size=4, embed_dim=192, depth=6, num_heads=3, mlp_ratio=2.0, num_classes=10,
                 drop_path_rate=0.1)
PRECISIONS = ("fp32", "bf16")
SELECTED_PRECISIONS = list(PRECISIONS)  # --precisions
PASSES = ("train", "infer")
MARKER = "VISION-BENCH-JSON:"


# --------------------------------------------------------------------------- helpers
def cpu_bf16_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    found = [f for f in ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f", "avx2") if f in flags]
    return ", ".join(found) or "none of avx2/avx512f/avx512_bf16/amx"


def rate(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def matmul_gflops(dtype: torch.dtype, repeats: int, n: int = 2048) -> tuple[float, int]:
    """GFLOP/s of an ``n x n`` matmul, and the ``n`` used: a CPU without a fast path for
    ``dtype`` (bf16 without AVX512-BF16/AMX can run at well under 1 GFLOP/s) is measured
    at 512 instead, so that the header does not take minutes."""
    probe = torch.randn(512, 512).to(dtype)
    start = time.perf_counter()
    probe @ probe
    if (time.perf_counter() - start) * (n / 512) ** 3 > 5.0:
        n = 512
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    s = statistics.median(time_interleaved({"mm": lambda: a @ b}, repeats, warmup=1)["mm"])
    return 2 * n**3 / s / 1e9, n


def _cpu_flash_flops(q, k, v, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(q, k, v)


def forward_flops(model: nn.Module, x: Tensor) -> int:
    """FLOPs of one float32 eval forward (multiply-add = 2)."""
    mapping = {}
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is not None:
        mapping[op] = _cpu_flash_flops
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        model(x)
    return counter.get_total_flops()


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def make_step(model: nn.Module, pass_: str, precision: str, x: Tensor, y: Tensor) -> Callable[[], None]:
    """One timed unit of work: a training step or an inference forward."""
    amp = precision == "bf16"

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp)

    if pass_ == "infer":
        def infer() -> None:
            model.eval()
            with torch.no_grad(), autocast():
                model(x)
        return infer

    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def train() -> None:
        model.train()
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return train


def batch(size: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(size, 3, IMG, IMG, generator=gen), torch.randint(0, CLASSES, (size,), generator=gen)


def measure(builders: dict[str, Callable[[], nn.Module]], x: Tensor, y: Tensor, repeats: int,
            warmup: int) -> dict[str, dict[str, list[float]]]:
    """``{"fp32/train": {impl: seconds...}, ...}``; implementations interleaved, each
    combination with freshly built models (so training steps do not carry over)."""
    out = {}
    for precision in SELECTED_PRECISIONS:
        for pass_ in PASSES:
            fns = {impl: make_step(build(), pass_, precision, x, y) for impl, build in builders.items()}
            out[f"{precision}/{pass_}"] = time_interleaved(fns, repeats, warmup)
            cell = out[f"{precision}/{pass_}"]
            print(f"    {precision} {pass_}: " + ", ".join(
                f"{impl} {rate(x.shape[0] / statistics.median(s))} img/s" for impl, s in cell.items()
            ), file=sys.stderr, flush=True)
    return out


# --------------------------------------------------------------------------- backends
def attnlab_models() -> dict[str, Any]:
    from attnlab.models import create_model, list_models

    if "botnet_cifar" not in list_models():
        try:  # the family may exist before models/__init__ imports it
            importlib.import_module("attnlab.models.botnet")
        except ImportError:
            pass
    def vit() -> nn.Module:
        model = create_model("vit_cifar_patch4")
        cfg = model.config
        got = {k: getattr(cfg, k) for k in VIT_CIFAR}
        want = {**VIT_CIFAR, "img_size": (VIT_CIFAR["img_size"],) * 2}
        if got != want:  # the timm column is built from VIT_CIFAR: they must agree
            raise RuntimeError(f"vit_cifar_patch4's defaults changed: {got} vs {want}")
        return model

    models: dict[str, Any] = {"vit_cifar_patch4": vit}
    if "botnet_cifar" in list_models():
        models["botnet_cifar"] = lambda: create_model("botnet_cifar")
    else:
        models["botnet_cifar"] = None
    return models


def run_attnlab(args: argparse.Namespace) -> dict[str, Any]:
    """Measure attnlab's models in this process."""
    x, y = batch(args.batch)
    results: dict[str, Any] = {}
    for name, build in attnlab_models().items():
        if build is None:
            results[name] = {"skipped": "botnet_cifar is not registered yet (attnlab.models.botnet missing)"}
            continue
        torch.manual_seed(0)
        model = build()
        info = {"params": n_params(model), "flops_forward": forward_flops(model, x)}
        del model
        print(f"  attnlab {name}: {info['params']:,} parameters, {info['flops_forward'] / 1e9:.2f} GFLOP/forward",
              file=sys.stderr, flush=True)
        torch.manual_seed(0)
        info["seconds"] = {k: v["attnlab"] for k, v in measure({"attnlab": build}, x, y, args.repeats,
                                                                args.warmup).items()}
        results[name] = info
    return results


def run_timm(args: argparse.Namespace) -> dict[str, Any]:
    """In the timm venv: timm's CIFAR ViT, interleaved with attnlab's (same weights)."""
    import timm
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    sys.path.insert(0, str(REPO / "src"))  # attnlab, if the venv does not have it installed
    from attnlab.models import create_model
    from attnlab.models.checkpoint import timm_vit_to_attnlab

    x, y = batch(args.batch)
    torch.manual_seed(0)
    ref = TimmViT(**VIT_CIFAR)

    def build_timm() -> nn.Module:
        m = TimmViT(**VIT_CIFAR)
        m.load_state_dict(ref.state_dict())
        return m

    def build_ours() -> nn.Module:
        m = create_model("vit_cifar_patch4")
        m.load_state_dict(timm_vit_to_attnlab(ref.state_dict()))
        return m

    ours = build_ours().eval()
    ref.eval()
    with torch.no_grad():
        diff = (ours(x) - ref(x)).abs().max().item()
    info = {"timm_version": timm.__version__, "torch_version": torch.__version__, "params": n_params(ref),
            "attnlab_params": n_params(ours), "flops_forward": forward_flops(ref, x), "max_abs_diff": diff}
    print(f"  timm vit_cifar_patch4: {info['params']:,} parameters, {info['flops_forward'] / 1e9:.2f} GFLOP/forward, "
          f"max |attnlab - timm| = {diff:.1e}", file=sys.stderr, flush=True)
    del ours
    samples = measure({"timm": build_timm, "attnlab": build_ours}, x, y, args.repeats, args.warmup)
    info["seconds"] = {k: v["timm"] for k, v in samples.items()}
    info["attnlab_seconds_same_process"] = {k: v["attnlab"] for k, v in samples.items()}
    return {"vit_cifar_patch4": info}


def call_timm(args: argparse.Namespace) -> dict[str, Any] | str:
    """Re-invoke this script under the timm venv; its JSON or why there is none."""
    python = Path(args.timm_python)
    if not python.exists():
        return f"timm not available ({python} not found)"
    cmd = [str(python), str(Path(__file__).resolve()), "--backend", "timm", "--threads", str(args.threads),
           "--batch", str(args.batch), "--repeats", str(args.repeats), "--warmup", str(args.warmup),
           "--precisions", ",".join(SELECTED_PRECISIONS)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    print(f"timm backend: {' '.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=env, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    if proc.returncode != 0 or not lines:
        return f"timm not available (backend exited with {proc.returncode})"
    return json.loads(lines[-1][len(MARKER):])


# --------------------------------------------------------------------------- report
def markdown(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def report(args: argparse.Namespace, machine: dict[str, Any], ours: dict[str, Any],
           theirs: dict[str, Any] | str) -> str:
    out = [
        f"Machine: {machine['cpu']} ({machine['cpu_flags']}); torch {machine['torch']} (attnlab venv)"
        + (f", torch {theirs['vit_cifar_patch4']['torch_version']} + timm {theirs['vit_cifar_patch4']['timm_version']}"
           f" (timm venv)" if isinstance(theirs, dict) else "")
        + f"; {machine['threads']} threads; batch {args.batch}, {IMG}x{IMG}; median of {args.repeats} after "
          f"{args.warmup} warm-up"
        + ("" if machine["busy_cores_at_start"] is None else
           f"; {machine['busy_cores_at_start']:.1f} of {os.cpu_count()} cores busy with other work at the start"),
        "Matmul: float32 {:.1f} GFLOP/s ({n}x{n}), bfloat16 {:.1f} GFLOP/s ({m}x{m}); bf16/fp32 = {:.2f}".format(
            machine["matmul_fp32"][0], machine["matmul_bf16"][0], machine["matmul_bf16"][0] / machine["matmul_fp32"][0],
            n=machine["matmul_fp32"][1], m=machine["matmul_bf16"][1]),
    ]
    for name, info in ours.items():
        if "skipped" in info:
            out.append(f"{name}: skipped: {info['skipped']}")
            continue
        line = (f"{name}: attnlab {info['params']:,} parameters, {info['flops_forward'] / 1e9:.2f} GFLOP per forward "
                f"of the batch ({info['flops_forward'] / args.batch / 1e6:.0f} MFLOP per image)")
        t = theirs.get(name) if isinstance(theirs, dict) else None
        if t:
            same = "equal" if t["params"] == info["params"] == t["attnlab_params"] else "**DIFFERENT**"
            line += (f"; timm {t['params']:,} parameters ({same}), {t['flops_forward'] / 1e9:.2f} GFLOP per forward; "
                     f"max |logit difference| with timm's weights {t['max_abs_diff']:.1e}")
        out.append(line)
    headers = ["model", "precision", "pass", "attnlab img/s", "timm img/s", "attnlab/timm",
               "attnlab/timm, same process", "achieved GFLOP/s"]
    rows = []
    for name, info in ours.items():
        if "skipped" in info:
            rows.append([name, "-", "-", "skipped (not registered)", "-", "-", "-", "-"])
            continue
        for key, secs in info["seconds"].items():
            precision, pass_ = key.split("/")
            s = statistics.median(secs)
            flops = info["flops_forward"] * (3 if pass_ == "train" else 1)
            row = [name, precision, pass_, rate(args.batch / s)]
            t = theirs.get(name) if isinstance(theirs, dict) else None
            if t:
                ts = statistics.median(t["seconds"][key])
                ts_ours = statistics.median(t["attnlab_seconds_same_process"][key])
                row += [rate(args.batch / ts), f"{ts / s:.2f}", f"{ts / ts_ours:.2f}"]
            elif isinstance(theirs, str) and name == "vit_cifar_patch4":
                row += [theirs, "-", "-"]
            else:
                row += ["- (attnlab only)", "-", "-"]
            row.append(f"{flops / s / 1e9:.1f}")
            rows.append(row)
    out += ["", markdown(headers, rows)]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: batch 16, 1 warm-up, 2 timed steps")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--batch", type=int, default=None, help="images per step (default 128; --quick 16)")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per cell (default 10; --quick 2)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps per cell (default 3; --quick 1)")
    parser.add_argument("--timm-python", default=DEFAULT_TIMM_PYTHON,
                        help=f"python of a venv with timm, for the timm column (default {DEFAULT_TIMM_PYTHON})")
    parser.add_argument("--no-timm", action="store_true", help="skip the timm column")
    parser.add_argument("--json", type=Path, help="also write all samples here")
    parser.add_argument("--precisions", default="fp32,bf16",
                        help="comma-separated subset of fp32,bf16 (bf16 is very slow on CPUs without AVX512-BF16/AMX)")
    parser.add_argument("--backend", choices=["attnlab", "timm"], default="attnlab", help=argparse.SUPPRESS)
    args = parser.parse_args()
    chosen = [p for p in args.precisions.split(",") if p]
    if not chosen or any(p not in PRECISIONS for p in chosen):
        parser.error(f"--precisions must be a comma-separated subset of {','.join(PRECISIONS)}; got {args.precisions!r}")
    SELECTED_PRECISIONS[:] = chosen
    args.batch = args.batch or (16 if args.quick else 128)
    args.repeats = args.repeats or (2 if args.quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    torch.set_num_threads(args.threads)

    if args.backend == "timm":  # worker: JSON on stdout, progress on stderr
        print(MARKER + json.dumps(run_timm(args)), flush=True)
        return

    import attnlab

    machine = {"busy_cores_at_start": busy_cores(), "cpu": cpu_model(), "cpu_flags": cpu_bf16_flags(),
               "torch": torch.__version__,
               "attnlab": attnlab.__version__, "threads": torch.get_num_threads(),
               "matmul_fp32": matmul_gflops(torch.float32, 3 if args.quick else 10),
               "matmul_bf16": matmul_gflops(torch.bfloat16, 3 if args.quick else 10)}
    print(f"attnlab backend (torch {torch.__version__}, {machine['threads']} threads)", file=sys.stderr, flush=True)
    ours = run_attnlab(args)
    theirs = "timm not available (--no-timm)" if args.no_timm else call_timm(args)
    if isinstance(theirs, dict):
        t, o = theirs["vit_cifar_patch4"], ours["vit_cifar_patch4"]
        if not t["params"] == t["attnlab_params"] == o["params"]:
            print(f"WARNING: parameter counts differ: timm {t['params']}, attnlab {o['params']}", file=sys.stderr)
    print()
    print(report(args, machine, ours, theirs))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "attnlab": ours, "timm": theirs,
                                         "batch": args.batch, "repeats": args.repeats, "warmup": args.warmup},
                                        indent=1, default=str))


if __name__ == "__main__":
    main()
