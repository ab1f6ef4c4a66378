"""attnlab's ViT against real timm outputs, without timm installed.

The fixtures in ``tests/fixtures`` were written by timm itself (see
``tests/fixtures/make_timm_fixtures.py``, run in a separate venv that has timm): a
small ViT's state dict in timm's exact key layout, with every LayerNorm parameter, bias,
class token and position grid randomised, plus a fixed input and timm's outputs for it.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from attnlab.models import create_model
from attnlab.models.checkpoint import attnlab_vit_to_timm, load_checkpoint, read_state_dict, timm_vit_to_attnlab
from attnlab.models.vit import VisionTransformer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TOL = 1e-4

# fixture name -> (timm constructor kwargs as recorded by the generator, attnlab overrides)
CASES = {
    "timm_vit_tiny32": (
        dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=5),
        dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=5),
    ),
    "timm_vit_tiny32_avg": (
        dict(img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=3, mlp_ratio=2.0, num_classes=5,
             global_pool="avg"),
        dict(img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=3, mlp_ratio=2.0, num_classes=5,
             global_pool="avg", class_token=True),
    ),
    "timm_vit_tiny32_avg_nocls": (
        dict(img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=3, mlp_ratio=2.0, num_classes=5,
             global_pool="avg", class_token=False),
        dict(img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=3, mlp_ratio=2.0, num_classes=5,
             global_pool="avg", class_token=False),
    ),
}
MAIN = "timm_vit_tiny32"


def ckpt(name: str = MAIN) -> Path:
    return FIXTURES / f"{name}.safetensors"


def io(name: str = MAIN) -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURES / f"{name}_io.safetensors"))


def upsample2(x: torch.Tensor) -> torch.Tensor:
    """As in the generator: each pixel repeated 2x2."""
    return x.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)


def build(name: str = MAIN, checkpoint: Path | None = None, **extra) -> VisionTransformer:
    overrides = {**CASES[name][1], **extra}
    path = ckpt(name) if checkpoint is None else checkpoint
    return create_model("vit_tiny_patch16_224", checkpoint=path, **overrides).eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


@pytest.mark.parametrize("name", list(CASES))
def test_fixture_matches_its_config(name):
    with safe_open(str(ckpt(name)), "pt") as f:
        recorded = json.loads(f.metadata()["timm_kwargs"])
    assert recorded == CASES[name][0]


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_timm(name):
    model = build(name)
    ref = io(name)
    with torch.no_grad():
        logits = model(ref["input"])
        feats = model.forward_head(model.forward_features(ref["input"]), pre_logits=True)
    assert max_diff(logits, ref["logits"]) <= TOL
    assert max_diff(feats, ref["features"]) <= TOL
    # The fixture is discriminating: the logits are far from a fresh model's.
    fresh = create_model("vit_tiny_patch16_224", **CASES[name][1]).eval()
    with torch.no_grad():
        assert max_diff(fresh(ref["input"]), ref["logits"]) > 0.1


@pytest.mark.parametrize("name", list(CASES))
def test_key_layout_round_trip(name):
    timm_state = load_file(str(ckpt(name)))
    model = build(name)
    exported = attnlab_vit_to_timm(model.state_dict())
    # attnlab -> timm: exactly timm's key list, and the same tensors.
    assert sorted(exported) == sorted(timm_state)
    for k, v in timm_state.items():
        assert torch.equal(exported[k], v), k
    # timm -> attnlab: exactly the model's key list, and back again to timm's.
    imported = timm_vit_to_attnlab(timm_state)
    assert sorted(imported) == sorted(model.state_dict())
    back = attnlab_vit_to_timm(imported)
    assert sorted(back) == sorted(timm_state)
    assert all(torch.equal(back[k], timm_state[k]) for k in timm_state)


def test_exported_checkpoint_reloads(tmp_path):
    model = build()
    path = tmp_path / "export.safetensors"
    save_file({k: v.contiguous() for k, v in attnlab_vit_to_timm(model.state_dict()).items()}, str(path))
    again = build(checkpoint=path)
    ref = io()
    with torch.no_grad():
        assert torch.equal(again(ref["input"]), model(ref["input"]))


@pytest.mark.parametrize("wrapper", [None, "state_dict", "model"])
def test_pth_copy_loads_the_same(tmp_path, wrapper):
    state = load_file(str(ckpt()))
    path = tmp_path / "copy.pth"
    torch.save(state if wrapper is None else {wrapper: state, "epoch": 3}, path)
    ref = io()
    a, b = build(), build(checkpoint=path)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    with torch.no_grad():
        assert max_diff(b(ref["input"]), ref["logits"]) <= TOL


@pytest.mark.parametrize("removed", ["blocks.1.norm2.bias", "norm.weight", "cls_token", "blocks.0.attn.qkv.bias"])
def test_missing_key_is_refused(tmp_path, removed):
    state = load_file(str(ckpt()))
    del state[removed]
    path = tmp_path / "missing.safetensors"
    save_file(state, str(path))
    # The message names the key as the checkpoint (timm) names it.
    pattern = removed.replace(".", r"\.")
    with pytest.raises(ValueError, match=rf"missing keys: .*{pattern}"):
        build(checkpoint=path)


@pytest.mark.parametrize("extra", ["blocks.0.ls1.gamma", "reg_token", "blocks.2.norm1.weight"])
def test_unexpected_key_is_refused(tmp_path, extra):
    state = load_file(str(ckpt()))
    state[extra] = torch.ones(48)
    path = tmp_path / "extra.safetensors"
    save_file(state, str(path))
    with pytest.raises(ValueError, match=rf"unexpected keys: .*{extra.replace('.', chr(92) + '.')}"):
        build(checkpoint=path)


def test_wrong_width_is_refused():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a width mismatch is an error, not a new-head warning
        with pytest.raises(ValueError, match=r"shape mismatches: .*head\.weight.*pos_embed"):
            build(embed_dim=96)


def test_headless_model_loads_a_classifier_checkpoint():
    model = build(num_classes=0)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 48)


def test_class_token_mismatch_names_the_key():
    with pytest.raises(ValueError, match=r"unexpected keys: cls_token"):
        build(class_token=False, global_pool="avg")


class _Payload:
    """Unpickling this creates the file ``path`` (a stand-in for arbitrary code)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_malicious_pth_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    state = load_file(str(ckpt()))
    state["evil"] = _Payload(marker)
    torch.save(state, path)
    assert not marker.exists()
    with pytest.raises(ValueError, match="evil.pth was refused: it holds an object of .*unpickling it could run code"):
        build(checkpoint=path)
    with pytest.raises(ValueError) as info:
        read_state_dict(path)
    assert "weights_only" not in str(info.value)  # never a hint to load it unsafely
    assert not marker.exists()
    # The payload is real: an unsafe load would have run it.
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_other_num_classes_gets_a_fresh_head():
    ref = io()
    timm_state = load_file(str(ckpt()))
    with pytest.warns(UserWarning, match="head"):
        model = build(num_classes=7)
    assert model.head.weight.shape == (7, 48)
    assert torch.equal(model.head.bias, torch.zeros(7))  # attnlab's fresh init, not the checkpoint's
    assert model.head.weight.std() < 0.05
    own = attnlab_vit_to_timm(model.state_dict())
    for k, v in timm_state.items():
        if not k.startswith("head."):
            assert torch.equal(own[k], v), k
    with torch.no_grad():
        feats = model.forward_head(model.forward_features(ref["input"]), pre_logits=True)
        assert model(ref["input"]).shape == (2, 7)
    assert max_diff(feats, ref["features"]) <= TOL


def test_same_num_classes_loads_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build()


@pytest.mark.parametrize("name", list(CASES))
def test_load_at_img_size_64_resizes_position_grid(name):
    timm_state = load_file(str(ckpt(name)))
    prefix = 1 if CASES[name][1].get("class_token", True) else 0
    model = build(name, img_size=64)
    e = CASES[name][1]["embed_dim"]
    assert model.patch_embed.grid_size == (8, 8)
    assert model.pos_embed.shape == (1, prefix + 64, e)
    assert timm_state["pos_embed"].shape == (1, prefix + 16, e)
    if prefix:
        assert torch.equal(model.pos_embed[:, :1], timm_state["pos_embed"][:, :1])  # class token position
        assert torch.equal(model.cls_token, timm_state["cls_token"])
    ref = io(name)
    with torch.no_grad():
        # timm with img_size=64, loading through its checkpoint_filter_fn (bicubic resize)
        assert max_diff(model(upsample2(ref["input"])), ref["logits_64"]) <= TOL


@pytest.mark.parametrize("name", list(CASES))
def test_larger_input_resizes_on_the_fly_like_timm_dynamic(name):
    model = build(name)
    ref = io(name)
    with torch.no_grad():
        assert max_diff(model(upsample2(ref["input"])), ref["logits_dynamic_64"]) <= TOL


def test_load_checkpoint_directly():
    model = VisionTransformer(**CASES[MAIN][1]).eval()
    assert load_checkpoint(model, ckpt()) is model
    ref = io()
    with torch.no_grad():
        assert max_diff(model(ref["input"]), ref["logits"]) <= TOL


def test_corrupt_safetensors_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="could not read .*bad.safetensors as safetensors"):
        build(checkpoint=bad)
