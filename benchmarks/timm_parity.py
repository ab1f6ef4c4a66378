"""Parity of attnlab's ViT with timm's: the same checkpoint gives the same logits.

Runs in a venv that has timm *and* attnlab (attnlab's own venv has no timm)::

    python3 -m venv /work/timm-venv
    /work/timm-venv/bin/pip install torch torchvision timm safetensors pillow scikit-learn numpy
    /work/timm-venv/bin/pip install --no-deps -e .
    /work/timm-venv/bin/python benchmarks/timm_parity.py            # all rows (ViT-L included)
    /work/timm-venv/bin/python benchmarks/timm_parity.py --models vit_tiny_patch16_224 --no-extra

For each of ViT-Ti/S/B/L at 224x224: ``timm.create_model(name, pretrained=False)`` in eval
mode; its LayerNorm weights and biases, all biases and the class token are then set to
random values (timm initialises them to 1, 0 and ~1e-6, which would hide a mis-mapped key);
its ``state_dict()`` is saved to a temporary directory as ``.safetensors`` and as ``.pth``
(``torch.save``), and each file is loaded with ``attnlab.create_model(name, checkpoint=PATH)``.
Both models get the same random float32 batch ``(2, 3, 224, 224)``; the table shows the
largest absolute difference of the logits (target: <= 1e-4) and the parameter counts
(target: equal).

Extra rows (ViT-B):

* ``img_size=384``: timm's model built at 384 and given the 224 checkpoint through
  timm's ``checkpoint_filter_fn`` (bicubic resize of the position grid), against
  ``create_model(name, img_size=384, checkpoint=224 file)`` (attnlab resizes on load).
* ``384 input, dynamic``: the 224 models fed a 384x384 batch; timm with
  ``dynamic_img_size=True``, attnlab as is (it resizes the grid on the fly).
* ``global_pool="avg"``: timm's ``global_pool='avg'`` keeps its default ``class_token=True``
  (the class token is computed but not pooled; the final norm moves after pooling,
  ``fc_norm``); attnlab ``global_pool="avg", class_token=True``. And the same with
  ``class_token=False`` on both sides.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

try:
    import timm
    from timm.models.vision_transformer import checkpoint_filter_fn
except ImportError as exc:  # pragma: no cover
    raise SystemExit(f"timm is not importable ({exc}); run this with the timm venv, "
                     "e.g. /work/timm-venv/bin/python") from None

import attnlab

NAMES = ["vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224", "vit_large_patch16_224"]
TOL = 1e-4


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Random LayerNorm weights/biases, biases and class token, so wrong mappings show."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if "norm" in name and leaf == "weight":
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif leaf == "bias":
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
            elif name == "cls_token":
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def save_both(state: dict[str, torch.Tensor], folder: Path, stem: str) -> dict[str, Path]:
    state = {k: v.detach().contiguous() for k, v in state.items()}
    paths = {"safetensors": folder / f"{stem}.safetensors", "pth": folder / f"{stem}.pth"}
    save_file(state, str(paths["safetensors"]))
    torch.save(state, paths["pth"])
    return paths


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        raise AssertionError(f"logit shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    return (a - b).abs().max().item()


def compare(label: str, name: str, timm_kwargs: dict, ours_kwargs: dict, folder: Path, *, timm_img: int = 224,
            ours_img: int | None = None, input_size: int | None = None, seed: int = 0) -> list[str]:
    """One table row. The checkpoint always comes from timm's 224 model built with
    ``timm_kwargs`` (minus img_size); ``timm_img`` / ``ours_img`` are the sizes the two
    compared models are built at; ``input_size`` the batch's side."""
    start = time.perf_counter()
    torch.manual_seed(seed)
    base_kwargs = {k: v for k, v in timm_kwargs.items() if k not in ("img_size", "dynamic_img_size")}
    source = timm.create_model(name, pretrained=False, **base_kwargs).eval()
    perturb(source, seed + 1)
    state = source.state_dict()
    paths = save_both(state, folder, f"{label}")
    if timm_img != 224 or timm_kwargs.get("dynamic_img_size"):
        ref = timm.create_model(name, pretrained=False, **{**base_kwargs, **timm_kwargs}).eval()
        ref.load_state_dict(checkpoint_filter_fn(dict(state), ref))
    else:
        ref = source
    side = input_size or timm_img
    x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(seed + 2))
    with torch.no_grad():
        want = ref(x)
    diffs, counts = [], set()
    for fmt, path in paths.items():
        extra = {} if ours_img is None else {"img_size": ours_img}
        ours = attnlab.create_model(name, checkpoint=path, **ours_kwargs, **extra).eval()
        counts.add(n_params(ours))
        with torch.no_grad():
            diffs.append(diff(ours(x), want))
        del ours
    (ours_count,) = counts
    ok = ours_count == n_params(ref) and max(diffs) <= TOL
    seconds = time.perf_counter() - start
    print(f"  {label}: {max(diffs):.2e} ({seconds:.0f} s)", flush=True)
    for p in paths.values():
        p.unlink()
    return [label, f"{n_params(ref):,}", f"{ours_count:,}", f"{diffs[0]:.2e}", f"{diffs[1]:.2e}",
            f"{want.abs().max().item():.2f}", "yes" if ok else "**NO**"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=NAMES, help="timm/attnlab ViT names (default: Ti, S, B, L)")
    parser.add_argument("--no-extra", action="store_true", help="skip the img_size / global_pool rows")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"timm {timm.__version__}, torch {torch.__version__}, attnlab {attnlab.__version__}, "
          f"{torch.get_num_threads()} threads; batch (2, 3, S, S) float32, eval mode", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for i, name in enumerate(args.models):
            rows.append(compare(name, name, {}, {}, folder, seed=10 * i))
        if not args.no_extra:
            b = "vit_base_patch16_224"
            rows.append(compare(f"{b}, img_size=384 (224 checkpoint)", b, {"img_size": 384}, {}, folder,
                                timm_img=384, ours_img=384, seed=100))
            rows.append(compare(f"{b}, 384 input, dynamic (224 model)", b, {"dynamic_img_size": True}, {}, folder,
                                input_size=384, seed=110))
            rows.append(compare(f'{b}, global_pool="avg" (class token)', b, {"global_pool": "avg"},
                                {"global_pool": "avg", "class_token": True}, folder, seed=120))
            rows.append(compare(f'{b}, global_pool="avg", class_token=False', b,
                                {"global_pool": "avg", "class_token": False},
                                {"global_pool": "avg", "class_token": False}, folder, seed=130))
    headers = ["model", "timm params", "attnlab params", "max abs diff (safetensors)", "max abs diff (pth)",
               "max abs logit", f"params equal, diff <= {TOL:g}"]
    print()
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join("---" for _ in headers) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if any(r[-1] != "yes" for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
