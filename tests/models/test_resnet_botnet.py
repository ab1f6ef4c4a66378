"""ResNet counts and names as torchvision, BoTNet as the paper, relpos2d equals its definition."""

import copy
import math

import pytest
import torch
from torch import nn

import attnlab.models.botnet  # noqa: F401  (registers the botnet family)
import attnlab.models.resnet  # noqa: F401  (registers the resnet family)
from attnlab.attention import capture_attention
from attnlab.attention.registry import build_attention, attention_entry
from attnlab.attention.variants.relpos2d import RelPosSelfAttention2d
from attnlab.models.registry import count_parameters, create_model, model_entry
from attnlab.models.botnet import BoTBlock


def on_meta(name, **overrides):
    with torch.device("meta"):
        return create_model(name, **overrides)


# --------------------------------------------------------------------------- parameter counts
@pytest.mark.parametrize(
    "name,expected",
    [
        ("resnet18", 11_689_512),
        ("resnet34", 21_797_672),
        ("resnet50", 25_557_032),
        ("resnet101", 44_549_160),
        ("resnet18_cifar", 11_173_962),  # resnet18 - 7x7 stem + 3x3 stem - 1000-way fc + 10-way fc
    ],
)
def test_resnet_parameter_count(name, expected):
    assert count_parameters(on_meta(name)) == expected


def test_botnet50_parameter_count_is_the_papers():
    n = count_parameters(on_meta("botnet50"))
    assert n == 20_852_008
    assert abs(n - 20.8e6) / 20.8e6 < 0.02


def test_botnet50_counts_as_resnet50_with_mhsa_for_3x3_convs():
    # Each C5 3x3 conv (512*512*9) becomes q, k, v (3*512*512) plus tables of 2H-1 and
    # 2W-1 rows of D = 128: 27 rows each at 14x14, 13 at 7x7.
    expected = 25_557_032 - 3 * (512 * 512 * 9 - 3 * 512 * 512) + 128 * (2 * 27 + 2 * 2 * 13)
    assert count_parameters(on_meta("botnet50")) == expected


def test_botnet_cifar_is_small():
    assert count_parameters(on_meta("botnet_cifar")) == 3_426_698


def test_channel_attention_adds_its_parameters_to_every_block():
    base = count_parameters(on_meta("resnet50"))
    widths = [256] * 3 + [512] * 4 + [1024] * 6 + [2048] * 3  # output channels of the 16 bottlenecks
    se = sum(2 * c * (c // 16) + c // 16 + c for c in widths)
    cbam = se + 16 * (2 * 7 * 7 + 1)
    assert count_parameters(on_meta("resnet50", channel_attention="se")) == base + se == 28_088_024
    assert count_parameters(on_meta("resnet50", channel_attention="cbam")) == base + cbam
    basic = [64] * 2 + [128] * 2 + [256] * 2 + [512] * 2
    assert count_parameters(on_meta("resnet18", channel_attention="se")) == 11_689_512 + sum(
        2 * c * (c // 16) + c // 16 + c for c in basic
    )


def test_bad_channel_attention_name():
    with pytest.raises(ValueError, match=r"channel_attention must be None or one of 'none', 'se', 'cbam'; got 'SE'"):
        create_model("resnet18_cifar", channel_attention="SE")


def test_unknown_override_is_named():
    with pytest.raises(ValueError, match="unknown ResNetConfig field 'num_class'"):
        create_model("resnet18", num_class=10)


def test_registered_with_families_and_descriptions():
    assert model_entry("resnet50").family == "resnet"
    assert model_entry("botnet50").family == "botnet"
    assert "20.85 M" in model_entry("botnet50").description
    assert attention_entry("relpos2d").family == "grid"


# --------------------------------------------------------------------------- torchvision layout
def torchvision_keys(block, layers, num_classes=1000):
    """State-dict keys and shapes of torchvision's ResNet, written out from its layout."""
    keys = {"conv1.weight": (64, 3, 7, 7)}

    def bn(prefix, c):
        for s in ("weight", "bias", "running_mean", "running_var"):
            keys[f"{prefix}.{s}"] = (c,)
        keys[f"{prefix}.num_batches_tracked"] = ()

    bn("bn1", 64)
    inplanes, expansion = 64, 4 if block == "bottleneck" else 1
    for i, (n, planes) in enumerate(zip(layers, (64, 128, 256, 512))):
        for j in range(n):
            p = f"layer{i + 1}.{j}"
            stride = 2 if i > 0 and j == 0 else 1
            if block == "bottleneck":
                keys[f"{p}.conv1.weight"] = (planes, inplanes, 1, 1)
                keys[f"{p}.conv2.weight"] = (planes, planes, 3, 3)
                keys[f"{p}.conv3.weight"] = (planes * 4, planes, 1, 1)
                bn(f"{p}.bn1", planes), bn(f"{p}.bn2", planes), bn(f"{p}.bn3", planes * 4)
            else:
                keys[f"{p}.conv1.weight"] = (planes, inplanes, 3, 3)
                keys[f"{p}.conv2.weight"] = (planes, planes, 3, 3)
                bn(f"{p}.bn1", planes), bn(f"{p}.bn2", planes)
            if stride != 1 or inplanes != planes * expansion:
                keys[f"{p}.downsample.0.weight"] = (planes * expansion, inplanes, 1, 1)
                bn(f"{p}.downsample.1", planes * expansion)
            inplanes = planes * expansion
    keys["fc.weight"] = (num_classes, 512 * expansion)
    keys["fc.bias"] = (num_classes,)
    return keys


@pytest.mark.parametrize(
    "name,block,layers", [("resnet50", "bottleneck", (3, 4, 6, 3)), ("resnet18", "basic", (2, 2, 2, 2))]
)
def test_state_dict_has_torchvision_names_and_shapes(name, block, layers):
    sd = on_meta(name).state_dict()
    expected = torchvision_keys(block, layers)
    assert {k: tuple(v.shape) for k, v in sd.items()} == expected


def test_stride_sits_on_the_3x3_conv():
    m = on_meta("resnet50")
    for layer in (m.layer2, m.layer3, m.layer4):
        assert layer[0].conv1.stride == (1, 1) and layer[0].conv2.stride == (2, 2)
        assert layer[0].downsample[0].stride == (2, 2)


def test_equals_torchvision_resnet50_with_its_weights():
    tv = pytest.importorskip("torchvision.models")
    ref = tv.resnet50().eval()
    with torch.no_grad():
        for name, t in ref.state_dict().items():
            if "running_var" in name:
                t.uniform_(0.5, 1.5)
    ours = create_model("resnet50").eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x))


# --------------------------------------------------------------------------- shapes
def test_resnet50_shapes_at_224():
    m = create_model("resnet50").eval()
    with torch.no_grad():
        f = m.forward_features(torch.randn(1, 3, 224, 224))
        assert f.shape == (1, 2048, 7, 7)
        assert m.forward_head(f).shape == (1, 1000)
        assert m.forward_head(f, pre_logits=True).shape == (1, 2048)


def test_botnet50_shapes_and_map_sizes_at_224():
    m = create_model("botnet50").eval()
    assert [b.attn.size for b in m.layer4] == [(14, 14), (7, 7), (7, 7)]
    assert [b.attn.num_heads for b in m.layer4] == [4, 4, 4]
    assert tuple(m.layer4[0].attn.rel_height.shape) == (27, 128)
    assert tuple(m.layer4[1].attn.rel_width.shape) == (13, 128)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert m(x).shape == (1, 1000)


def test_botnet50_attention_maps_at_224():
    with torch.device("meta"):  # shapes only
        m = create_model("botnet50").eval()
        maps = m.attention_maps(torch.empty(2, 3, 224, 224))
    assert [tuple(w.shape) for w in maps] == [(2, 4, 196, 196), (2, 4, 49, 49), (2, 4, 49, 49)]


@pytest.mark.parametrize("name", ["resnet18_cifar", "botnet_cifar"])
def test_cifar_models_at_32(name):
    m = create_model(name).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert m.forward_features(x).shape == (2, 512, 4, 4)
        assert m(x).shape == (2, 10)


def test_cifar_stem_keeps_resolution():
    m = create_model("resnet18_cifar")
    assert m.conv1.kernel_size == (3, 3) and m.conv1.stride == (1, 1) and isinstance(m.maxpool, nn.Identity)
    with torch.no_grad():
        assert m.stages(1)(torch.randn(1, 3, 32, 32)).shape == (1, 64, 32, 32)


def test_stages_share_modules_and_names():
    m = create_model("resnet50").eval()
    backbone = m.stages(3)
    assert list(backbone._modules) == ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3"]
    assert backbone.layer3 is m.layer3 and backbone.conv1 is m.conv1
    assert set(backbone.state_dict()) < set(m.state_dict())
    assert m.stage_channels == (256, 512, 1024, 2048)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = m.layer3(m.layer2(m.layer1(m.forward_stem(x))))
        out = backbone(x)
    assert out.shape == (1, 1024, 4, 4)
    torch.testing.assert_close(out, expected)
    with pytest.raises(ValueError, match="n must be an integer in \\[0, 4\\]; got 5"):
        m.stages(5)


def test_wrong_input_channels():
    with pytest.raises(ValueError, match=r"x must have shape \(B, 3, H, W\); got \(2, 1, 32, 32\)"):
        create_model("resnet18_cifar")(torch.randn(2, 1, 32, 32))


def test_in_chans_option():
    m = create_model("resnet18_cifar", in_chans=1, num_classes=0).eval()
    with torch.no_grad():
        assert m(torch.randn(2, 1, 32, 32)).shape == (2, 512)


def test_botnet_trained_at_one_size_evaluates_at_another():
    m = create_model("botnet_cifar").eval()
    with torch.no_grad():
        assert m(torch.randn(2, 3, 40, 40)).shape == (2, 10) and m(torch.randn(1, 3, 64, 48)).shape == (1, 10)
        maps = m.attention_maps(torch.randn(1, 3, 40, 40))
    assert [tuple(w.shape[-2:]) for w in maps] == [(100, 100), (25, 25), (25, 25)]  # 10x10, then 5x5
    assert all(torch.allclose(w.sum(-1), torch.ones(())) for w in maps)
    with pytest.raises(ValueError, match=r"stride-2 BoT block needs an even map size; .*\(9, 9\)"):
        m(torch.randn(1, 3, 36, 36))  # 36 -> 9x9 at the strided BoT block


@pytest.mark.slow  # a few seconds each on 2 cores: botnet50 at 224 and 320
def test_botnet50_runs_at_224_and_320():
    m = create_model("botnet50").eval()
    with torch.no_grad():
        assert m(torch.randn(1, 3, 224, 224)).shape == m(torch.randn(1, 3, 320, 320)).shape == (1, 1000)


def test_botnet50_runs_at_another_size_small_batch():
    m = create_model("botnet50", widths=(8, 8, 8, 8), layers=(1, 1, 1, 1)).eval()  # botnet50's layout, narrow
    with torch.no_grad():
        assert m(torch.randn(1, 3, 224, 224)).shape == m(torch.randn(1, 3, 320, 320)).shape == (1, 1000)


def test_botnet_image_size_option():
    m = create_model("botnet_cifar", img_size=64).eval()
    assert [b.attn.size for b in m.layer4] == [(16, 16), (8, 8), (8, 8)]
    with torch.no_grad():
        assert m(torch.randn(1, 3, 64, 64)).shape == (1, 10)


def test_botnet_odd_map_before_pool_is_an_error():
    with pytest.raises(ValueError, match=r"stride-2 BoT block needs an even map size; got size=\(9, 9\)"):
        create_model("botnet_cifar", img_size=36)


def test_botnet_attention_options():
    m = create_model("botnet_cifar", attention_options={"dropout": 0.1})
    assert all(b.attn.dropout == 0.1 for b in m.layer4)
    with pytest.raises(ValueError, match="attention_options must not set 'size'"):
        create_model("botnet_cifar", attention_options={"size": 4})
    with pytest.raises(ValueError, match="unknown option 'window' of attention 'relpos2d'; options: bias, dropout"):
        create_model("botnet_cifar", attention_options={"window": 3})
    with pytest.raises(ValueError, match="unknown attention 'relpos'"):
        create_model("botnet_cifar", attention="relpos")


def test_botnet_with_a_tokens_attention_kind():
    m = create_model("botnet_cifar", attention="exact").eval()
    assert attention_entry("exact").family == "tokens"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert m(x).shape == (2, 10)
        maps = m.attention_maps(x)
    assert [tuple(w.shape) for w in maps] == [(2, 4, 64, 64), (2, 4, 16, 16), (2, 4, 16, 16)]
    torch.testing.assert_close(maps[1].sum(-1), torch.ones(2, 4, 16))


# --------------------------------------------------------------------------- attention maps
def test_botnet_attention_maps_are_distributions():
    m = create_model("botnet_cifar").eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        maps = m.attention_maps(x)
    assert [tuple(w.shape) for w in maps] == [(3, 4, 64, 64), (3, 4, 16, 16), (3, 4, 16, 16)]
    for w in maps:
        assert w.ge(0).all()
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    assert not torch.allclose(maps[0][:, 0], maps[0][:, 1])  # heads differ


def test_attention_maps_path_gives_the_forward_output():
    m = create_model("botnet_cifar").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        feats = m.layer3(m.layer2(m.layer1(m.forward_stem(x))))
        y = feats
        for block in m.layer4:
            y = block(y)
        torch.testing.assert_close(y, m.forward_features(x))
        with capture_attention(m) as maps:  # the weights come from a capture, and change nothing
            torch.testing.assert_close(m.forward_features(x), y)
        assert len(maps["layer4.0.attn"]) == 1


# --------------------------------------------------------------------------- training behaviour
@pytest.mark.parametrize("name", ["resnet18_cifar", "botnet_cifar"])
def test_eval_output_does_not_depend_on_the_batch(name):
    m = create_model(name)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        m.train()(x * 2 + 1)  # move the running statistics away from (0, 1)
        m.eval()
        alone = m(x[:1])
        mixed = m(torch.cat([x[:1], 10 * x[1:]]))
    torch.testing.assert_close(alone, mixed[:1], atol=1e-5, rtol=1e-4)


def test_train_mode_uses_batch_statistics():
    # The counterpart of the test above: in training the batch does change the output.
    m = create_model("resnet18_cifar").train()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        assert not torch.allclose(m(x)[:1], m(torch.cat([x[:1], 10 * x[1:]]))[:1], atol=1e-3)


def test_gradients_reach_every_parameter():
    m = create_model("botnet_cifar").train()
    loss = nn.functional.cross_entropy(m(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("name", ["resnet18_cifar", "botnet_cifar"])
def test_grad_checkpointing_changes_nothing(name):
    a = create_model(name).train()
    b = copy.deepcopy(a)
    b.set_grad_checkpointing()
    x = torch.randn(4, 3, 32, 32)
    for m in (a, b):
        m(x).logsumexp(-1).sum().backward()
    for (k, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, msg=k)
    # BatchNorm statistics updated once per forward, though each stage ran twice.
    sa, sb = a.state_dict(), b.state_dict()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], msg=k)
    assert int(sb["layer2.0.bn1.num_batches_tracked"]) == 1


def test_zero_init_residual_makes_blocks_identities():
    m = create_model("resnet18_cifar", zero_init_residual=True).eval()
    assert all(b.bn2.weight.count_nonzero() == 0 for layer in m.stage_list() for b in layer)
    x = torch.rand(1, 64, 8, 8)  # non-negative, as after a ReLU
    with torch.no_grad():
        torch.testing.assert_close(m.layer1(x), x)
    b = create_model("botnet_cifar", zero_init_residual=True)
    assert all(blk.bn3.weight.count_nonzero() == 0 for blk in b.layer4)


# --------------------------------------------------------------------------- relpos2d
def naive_relpos2d(m: RelPosSelfAttention2d, x):
    """Loop over pixels: logit_ij = (q_i·k_j + q_i·(r^h[y_j - y_i] + r^w[x_j - x_i])) / sqrt(D)."""
    b, c, h, w = x.shape
    n = m.num_heads
    d = c // n
    wq = m.qkv.weight[:, :, 0, 0].double()
    qkv = torch.einsum("oc,bchw->bohw", wq, x.double())
    q, k, v = qkv[:, :c], qkv[:, c : 2 * c], qkv[:, 2 * c :]
    rh, rw = m.rel_height.double(), m.rel_width.double()
    out = torch.zeros(b, c, h, w, dtype=torch.float64)
    weights = torch.zeros(b, n, h * w, h * w, dtype=torch.float64)
    for bi in range(b):
        for head in range(n):
            ch = slice(head * d, (head + 1) * d)
            for yi in range(h):
                for xi in range(w):
                    qi = q[bi, ch, yi, xi]
                    logits = torch.empty(h * w, dtype=torch.float64)
                    for yj in range(h):
                        for xj in range(w):
                            r = rh[yj - yi + h - 1] + rw[xj - xi + w - 1]
                            logits[yj * w + xj] = (qi @ k[bi, ch, yj, xj] + qi @ r) / math.sqrt(d)
                    a = torch.softmax(logits, 0)
                    weights[bi, head, yi * w + xi] = a
                    out[bi, ch, yi, xi] = v[bi, ch].reshape(d, h * w) @ a
    return out, weights


def test_relpos2d_equals_the_loop_reference():
    m = build_attention("relpos2d", 8, 2, size=(3, 4))
    x = torch.randn(2, 8, 3, 4)
    ref_out, ref_w = naive_relpos2d(m, x)
    out, w = m(x, need_weights=True)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w.double(), ref_w, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(m(x)[0].double(), ref_out, atol=1e-5, rtol=1e-5)


def test_relpos2d_position_tables_matter():
    # The same pixels shifted get different logits only through the position terms.
    m = build_attention("relpos2d", 8, 2, size=(3, 4))
    x = torch.randn(1, 8, 3, 4)
    out, _ = m(x)
    with torch.no_grad():
        m.rel_height.zero_()
        m.rel_width.zero_()
    assert not torch.allclose(out, m(x)[0], atol=1e-4)
    torch.testing.assert_close(m(x)[0].double(), naive_relpos2d(m, x)[0], atol=1e-5, rtol=1e-5)


def test_relpos2d_fused_and_explicit_paths_agree_with_gradients():
    m = build_attention("relpos2d", 16, 4, size=(5, 3))
    x = torch.randn(2, 16, 5, 3, requires_grad=True)
    g = torch.randn(2, 16, 5, 3)
    grads = []
    for need_weights in (False, True):
        m.zero_grad()
        x.grad = None
        out, weights = m(x, need_weights=need_weights)
        assert (weights is None) != need_weights
        (out * g).sum().backward()
        grads.append([out.detach(), x.grad.clone()] + [p.grad.clone() for p in m.parameters()])
    assert len(grads[0]) == 2 + 3  # qkv.weight, rel_height, rel_width
    for fused, explicit in zip(*grads):
        torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-4)


def test_relpos2d_returns_the_output_and_no_weights_by_default():
    m = build_attention("relpos2d", 8, 2, size=4)
    out, none = m(torch.randn(1, 8, 4, 4))
    assert isinstance(out, torch.Tensor) and out.shape == (1, 8, 4, 4) and none is None
    out, w = m(torch.randn(1, 8, 4, 4), need_weights=True)
    assert w.shape == (1, 2, 16, 16)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 16))


def test_relpos2d_other_input_sizes_resize_the_tables():
    m = build_attention("relpos2d", 8, 2, size=(3, 4))
    out, w = m(torch.randn(2, 8, 4, 3), need_weights=True)
    assert out.shape == (2, 8, 4, 3) and w.shape == (2, 2, 12, 12)
    rh, rw = m.tables((3, 4))  # its own size: the learned rows, unchanged
    assert torch.equal(rh[0, 2], m.rel_height[4]) and torch.equal(rw[3, 0], m.rel_width[0])
    rh5, _ = m.tables((5, 4))  # 9 offsets from 5: the extremes stay the extremes, the middle the middle
    assert torch.allclose(rh5[0, 4], m.rel_height[4]) and torch.allclose(rh5[4, 0], m.rel_height[0])
    assert torch.allclose(rh5[2, 2], m.rel_height[2])
    with pytest.raises(ValueError, match=r"x must have shape \(B, 8, H, W\) .*got \(2, 6, 3, 4\)"):
        m(torch.randn(2, 6, 3, 4))


def test_relpos2d_bad_construction():
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads; got embed_dim=10, num_heads=4"):
        build_attention("relpos2d", 10, 4, size=4)
    with pytest.raises(ValueError, match=r"size must be a positive integer or a pair \(H, W\) of them \(an option of attention 'relpos2d'\); got \(3, 0\)"):
        build_attention("relpos2d", 8, 2, size=(3, 0))
    with pytest.raises(ValueError, match="unknown option 'window' of attention 'relpos2d'"):
        build_attention("relpos2d", 8, 2, size=4, window=3)
    with pytest.raises(TypeError, match="size"):
        build_attention("relpos2d", 8, 2)


def test_relpos2d_has_no_biases_by_default():
    m = build_attention("relpos2d", 8, 2, size=3)
    assert sorted(n for n, _ in m.named_parameters()) == ["qkv.weight", "rel_height", "rel_width"]
    assert m.state_dict().keys() == {"qkv.weight", "rel_height", "rel_width"}


def test_relpos2d_dropout_only_in_training():
    m = build_attention("relpos2d", 8, 2, size=3, dropout=0.5)
    x = torch.randn(2, 8, 3, 3)
    m.eval()
    torch.testing.assert_close(m(x)[0], m(x, need_weights=True)[0])
    m.train()
    assert not torch.allclose(m(x)[0], m.eval()(x)[0])


@pytest.mark.parametrize("place,stages,blocks", [
    ("last_stage", {"layer4"}, 2), ("last_block", {"layer4"}, 1), ("last_two_stages", {"layer3", "layer4"}, 3),
])
def test_botnet_mhsa_placement(place, stages, blocks):
    torch.manual_seed(0)
    model = create_model("botnet_cifar", layers=(1, 1, 1, 2), widths=(16, 16, 32, 16), stem_width=16,
                         mhsa_in=place).eval()
    found = {name.split(".")[0] for name, m in model.named_modules() if isinstance(m, BoTBlock)}
    assert found == stages and len(model.bot_blocks()) == blocks
    if place == "last_block":
        assert not isinstance(model.layer4[0], BoTBlock) and isinstance(model.layer4[1], BoTBlock)
    x = torch.randn(2, 3, 32, 32)
    maps = model.attention_maps(x)
    assert len(maps) == blocks and all(torch.allclose(m.sum(-1), torch.ones(())) for m in maps)
    assert model(x).shape == (2, 10)


def test_botnet_mhsa_placement_is_checked():
    with pytest.raises(ValueError, match="mhsa_in must be one of .*'last_block'.*got 'everywhere'"):
        create_model("botnet_cifar", mhsa_in="everywhere")
