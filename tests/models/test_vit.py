"""Vision Transformer and its layers: timm's parameter counts, shapes, positions, DropPath."""

import pytest
import torch

from attnlab.layers.drop_path import DropPath, drop_path_rates
from attnlab.layers.patch_embed import PatchEmbed
from attnlab.layers.pos_embed_2d import RelativePositionBias2d, resample_pos_embed, sincos_2d
from attnlab.models import count_parameters, create_model
from attnlab.layers.pos_embed_2d import LearnedPosEmbed2d
from attnlab.models.cct import AirbenchTokenizer


@pytest.mark.parametrize("name,params", [
    ("vit_tiny_patch16_224", 5_717_416),
    ("vit_small_patch16_224", 22_050_664),
    ("vit_base_patch16_224", 86_567_656),
    ("vit_large_patch16_224", 304_326_632),
])
def test_parameter_counts_equal_timm(name, params):
    with torch.device("meta"):
        assert count_parameters(create_model(name)) == params


def test_vit_base_has_196_plus_1_tokens_of_768():
    with torch.device("meta"):
        m = create_model("vit_base_patch16_224")
    assert m.patch_embed.num_patches == 196 and m.pos_embed.shape == (1, 197, 768)


def test_patch_embed_non_square_and_row_major():
    pe = PatchEmbed((8, 12), 4, in_chans=1, embed_dim=3)
    assert pe.grid_size == (2, 3) and pe.num_patches == 6
    with torch.no_grad():
        pe.proj.weight.zero_()
        pe.proj.weight[0, 0, 0, 0] = 1.0  # token feature 0 = the patch's top-left pixel
        pe.proj.bias.zero_()
    x = torch.arange(96, dtype=torch.float32).view(1, 1, 8, 12)
    tokens = pe(x)
    assert tokens.shape == (1, 6, 3)
    assert tokens[0, :, 0].tolist() == [0.0, 4.0, 8.0, 48.0, 52.0, 56.0]
    with pytest.raises(ValueError, match=r"image size \(8, 10\) must be divisible by the patch size \(4, 4\)"):
        pe(torch.randn(1, 1, 8, 10))
    with pytest.raises(ValueError, match=r"images must have shape \(B, 1, H, W\); got \(1, 3, 8, 12\)"):
        pe(torch.randn(1, 3, 8, 12))


def test_forward_shapes_for_each_position_scheme_and_pooling():
    x = torch.randn(2, 3, 32, 32)
    for kw in ({}, {"pos_embed": "sincos2d"}, {"pos_embed": "relative"}, {"pos_embed": "none"},
               {"global_pool": "avg", "class_token": False}, {"global_pool": "avg"}, {"pre_logits": True}):
        m = create_model("vit_cifar_patch4", depth=2, **kw)
        assert m(x).shape == (2, 10), kw
        assert m.forward_features(x).shape == (2, 64 + m.num_prefix_tokens, 192)
    m = create_model("vit_cifar_patch4", depth=1, num_classes=0)
    assert m(x).shape == (2, 192)


def test_pre_logits_is_linear_tanh():
    m = create_model("vit_cifar_patch4", depth=1, pre_logits=True).eval()
    feats = m.forward_head(m.forward_features(torch.randn(2, 3, 32, 32)), pre_logits=True)
    assert feats.abs().max() <= 1.0 and list(dict(m.pre_logits.named_children())) == ["fc", "act"]


def test_other_input_size_resizes_the_learned_grid():
    m = create_model("vit_cifar_patch4", depth=1).eval()
    x = torch.randn(1, 3, 32, 32)
    assert m(torch.randn(2, 3, 48, 40)).shape == (2, 10)
    # The same size gives exactly the stored grid.
    torch.testing.assert_close(resample_pos_embed(m.pos_embed, (8, 8), (8, 8)), m.pos_embed)
    assert m(x).shape == (1, 10)
    with pytest.raises(ValueError, match="relative position bias is built for a"):
        create_model("vit_cifar_patch4", depth=1, pos_embed="relative")(torch.randn(1, 3, 48, 48))


def test_resample_keeps_class_token_and_interpolates_smoothly():
    grid = torch.linspace(0, 1, 4).view(1, 4, 1).expand(4, 4, 1)  # values rise along the columns
    pos = torch.cat([torch.full((1, 1, 1), 7.0), grid.reshape(1, 16, 1)], dim=1)
    out = resample_pos_embed(pos, (8, 8), (4, 4))
    assert out.shape == (1, 65, 1) and out[0, 0, 0] == 7.0
    cols = out[0, 1:, 0].view(8, 8)
    assert torch.all(cols[:, 1:] >= cols[:, :-1] - 1e-6)  # still monotone along the columns
    torch.testing.assert_close(cols[0], cols[5])  # and constant along the rows
    with pytest.raises(ValueError, match="cannot infer a square grid from 15"):
        resample_pos_embed(pos[:, :16], (8, 8))


def test_sincos_2d_table():
    t = sincos_2d((3, 4), 8)
    assert t.shape == (12, 8)
    # Row-major order: tokens in one row share the row half of the code, not the column half.
    torch.testing.assert_close(t[0, 4:], t[1, 4:])
    assert not torch.allclose(t[0, :4], t[1, :4])
    with pytest.raises(ValueError, match="divisible by 4"):
        sincos_2d((2, 2), 6)


def test_relative_position_bias_depends_only_on_offset():
    rpb = RelativePositionBias2d((3, 3), num_heads=2, class_token=True)
    bias = rpb()[0]  # (heads, 10, 10)
    assert bias.shape == (2, 10, 10)
    # Token (0,0)->(1,1) and (1,1)->(2,2): the same offset, the same bias. Patch k is index k+1.
    torch.testing.assert_close(bias[:, 1, 5], bias[:, 5, 9])
    assert not torch.allclose(bias[:, 1, 5], bias[:, 5, 1])
    assert rpb.table.shape == (5 * 5 + 3, 2)


def test_drop_path_is_identity_in_eval_and_drops_samples_in_training():
    dp = DropPath(0.5)
    x = torch.ones(1000, 3)
    assert torch.equal(dp.eval()(x), x)
    y = dp.train()(x)
    kept = (y[:, 0] != 0)
    assert 350 < int(kept.sum()) < 650
    assert torch.all(y[kept] == 2.0) and torch.all(y[~kept] == 0)
    assert drop_path_rates(0.1, 3) == pytest.approx([0.0, 0.05, 0.1])


def test_vit_is_deterministic_in_eval_with_drop_path():
    m = create_model("vit_cifar_patch4", depth=2, drop_path_rate=0.5, drop_rate=0.2).eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(m(x), m(x))
    m.train()
    assert not torch.allclose(m(x), m(x))


def test_gradient_checkpointing_matches():
    a = create_model("vit_cifar_patch4", depth=2, drop_path_rate=0.0)
    b = create_model("vit_cifar_patch4", depth=2, drop_path_rate=0.0)
    b.load_state_dict(a.state_dict())
    b.set_grad_checkpointing(True)
    x = torch.randn(2, 3, 32, 32)
    for m in (a, b):
        m(x).square().sum().backward()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-6, rtol=1e-5, msg=n)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="global_pool='token' needs class_token=True"):
        create_model("vit_cifar_patch4", class_token=False)
    with pytest.raises(ValueError, match="unknown attention 'exakt'.*did you mean exact"):
        create_model("vit_cifar_patch4", attention="exakt")
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads"):
        create_model("vit_cifar_patch4", num_heads=5)


def test_hybrid_vit_tokens_are_resnet_feature_positions():
    m = create_model("vit_hybrid_cifar")
    assert m.patch_embed.grid_size == (8, 8)  # 32x32 -> ResNet stages 1-2 (16x16) -> 2x2 patches
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert "patch_embed.backbone.layer2.1.conv2.weight" in m.state_dict()
    with torch.device("meta"):
        big = create_model("vit_hybrid_r50_base_224")
    assert big.patch_embed.grid_size == (14, 14) and big.pos_embed.shape == (1, 197, 768)
    with pytest.raises(ValueError, match=r"image size \(38, 36\) must be divisible by the patch size \(4, 4\)"):
        m(torch.randn(1, 3, 38, 36))


def test_hybrid_vit_trained_at_32_evaluates_at_40():
    m = create_model("vit_hybrid_cifar").eval()
    with torch.no_grad():
        small, large = m(torch.randn(2, 3, 32, 32)), m(torch.randn(2, 3, 40, 40))
    assert small.shape == large.shape == (2, 10)
    assert m.patch_embed.grid_for(40, 40) == (10, 10) and m.patch_embed.grid_size == (8, 8)


def test_token_batchnorm_and_post_norm_blocks():
    torch.manual_seed(0)
    bn = create_model("vit_digits_patch2", depth=2, norm="batchnorm", norm_first=False)
    from attnlab.layers.norms import TokenBatchNorm

    assert all(isinstance(b.norm1, TokenBatchNorm) and not b.norm_first for b in bn.blocks)
    x = torch.randn(4, 1, 8, 8)
    assert bn(x).shape == (4, 10)
    bn.eval()
    one, batch = bn(x[:1]), bn(x)[:1]  # eval: running statistics, so an image does not depend on its batch
    torch.testing.assert_close(one, batch)
    ln = create_model("vit_digits_patch2", depth=2)
    assert [n for n, _ in ln.named_parameters()] == [n for n, _ in bn.named_parameters()]  # timm's names either way
    with pytest.raises(ValueError, match="norm must be one of"):
        create_model("vit_digits_patch2", norm="groupnorm")


def test_cct_conv_tokenizer_and_sequence_pooling():
    torch.manual_seed(0)
    m = create_model("cct_cifar", depth=1).eval()
    assert m.patch_embed.grid_for(32, 32) == (8, 8) and m.cls_token is None and m.config.global_pool == "seq"
    x = torch.randn(3, 3, 32, 32)
    assert m(x).shape == (3, 10) and m(torch.randn(1, 3, 48, 48)).shape == (1, 10)  # any size dividing by 4
    tokens = torch.randn(2, 5, 128)
    scores = m.attn_pool(tokens).softmax(1)  # sequence pooling: a convex combination of the tokens
    pooled = (scores * tokens).sum(1)
    with torch.no_grad():
        expected = m.head(m.forward_head(tokens, pre_logits=True))
        torch.testing.assert_close(m.head(pooled), expected)
        torch.testing.assert_close(m.forward_head(tokens.flip(1), pre_logits=True), pooled)  # order-free
    assert create_model("cct_cifar", tokenizer_layers=3).patch_embed.grid_for(32, 32) == (4, 4)
    with pytest.raises(ValueError, match="global_pool must be 'token', 'avg' or 'seq'"):
        create_model("vit_digits_patch2", global_pool="max")


def test_shifted_patch_tokenization_and_locality_self_attention():
    from attnlab.attention import build_attention
    from attnlab.layers.patch_embed import ShiftedImages

    x = torch.arange(16.0).view(1, 1, 4, 4)
    out = ShiftedImages(1)(x)
    assert out.shape == (1, 5, 4, 4) and torch.equal(out[:, 0], x[:, 0])
    assert out[0, 1, 1, 0] == 0 and out[0, 1, 1, 1] == x[0, 0, 0, 0]  # shifted down-right: the top-left pixel moves
    m = create_model("vit_digits_patch2", depth=1, patch_embed="shifted", attention="lsa")
    assert m.patch_embed.proj.weight.shape[1] == 5 and m(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    lsa = build_attention("lsa", 16, 2).eval()
    tokens = torch.randn(2, 5, 16)
    q, k, v = (p(tokens).view(2, 5, 2, 8).transpose(1, 2) for p in (lsa.q_proj, lsa.k_proj, lsa.v_proj))
    logits = (q @ k.transpose(-1, -2)) * lsa.log_scale.exp()
    logits = logits.masked_fill(torch.eye(5, dtype=torch.bool), float("-inf"))  # no attention to oneself
    expected = lsa.o_proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(lsa(tokens)[0], expected)
    assert torch.isclose(lsa.log_scale.exp(), torch.tensor(8**-0.5))  # starts at the usual scale
    assert torch.isfinite(lsa(torch.randn(1, 1, 16))[0]).all()  # one token: it keeps itself
    with pytest.raises(ValueError, match="patch_embed must be 'linear' or 'shifted'"):
        create_model("vit_digits_patch2", patch_embed="conv")


def test_learned_2d_positions_are_row_and_column_halves():
    pos = LearnedPosEmbed2d((3, 4), 8)
    table = pos((3, 4)).reshape(3, 4, 8)
    assert torch.equal(table[1, 0, :4], table[1, 3, :4])  # same row, same first half
    assert torch.equal(table[0, 2, 4:], table[2, 2, 4:])  # same column, same second half
    assert pos((6, 4)).shape == (1, 24, 8)  # another grid: each table interpolated
    with pytest.raises(ValueError, match="embed_dim 7 is odd"):
        LearnedPosEmbed2d((2, 2), 7)
    model = create_model("vit_cifar_patch4", embed_dim=32, depth=1, num_heads=2, pos_embed="learned2d").eval()
    assert model.pos_embed is None and model.pos_embed2d.rows.shape == (8, 16)
    assert model(torch.randn(2, 3, 32, 32)).shape == model(torch.randn(2, 3, 40, 40)).shape == (2, 10)
    with pytest.raises(ValueError, match="pos_embed must be one of learned, learned2d"):
        create_model("vit_cifar_patch4", pos_embed="2d")


def test_cct_airbench_tokenizer():
    model = create_model("cct_cifar", tokenizer="airbench", tokenizer_width=16, embed_dim=32, depth=1,
                         num_heads=2).eval()
    assert isinstance(model.patch_embed.backbone, AirbenchTokenizer)
    assert model.patch_embed.grid_size == (7, 7)  # 32 -> 31 (2x2 stem) -> 15 -> 7
    assert model.forward_features(torch.randn(2, 3, 32, 32)).shape == (2, 49, 32)
    assert model.forward_features(torch.randn(2, 3, 40, 40)).shape == (2, 81, 32)  # 39 -> 19 -> 9: positions follow
    with pytest.raises(ValueError, match=r"image size \(4, 4\) gives a \(0, 0\) feature map"):
        model(torch.randn(1, 3, 4, 4))
    with pytest.raises(ValueError, match="tokenizer must be one of 'cct', 'airbench'; got 'resnet'"):
        create_model("cct_cifar", tokenizer="resnet")


def test_mimetic_init_makes_query_key_near_identity_and_value_output_near_minus_identity():
    from attnlab.layers import mimetic_init_

    torch.manual_seed(0)
    d, heads = 64, 4
    k = d // heads
    w_in, w_out = torch.empty(3 * d, d), torch.empty(d, d)
    mimetic_init_(w_in, w_out, heads)
    for h in range(heads):  # each head: the rank-k part of 0.7 Z + 0.7 I
        qk = w_in[h * k:(h + 1) * k].T @ w_in[d + h * k:d + (h + 1) * k]
        off = qk - torch.diag(qk.diag())
        assert qk.diag().mean() > 0.2 and qk.diag().mean() > 3 * off.abs().mean()
    vo = w_in[2 * d:].T @ w_out.T  # full rank: exactly 0.4 Z - 0.4 I
    assert vo.diag().mean() == pytest.approx(-0.4, abs=0.05)
    # a token's query meets its own key far above the others': attention starts near-local
    x = torch.randn(16, d)
    logits = (x @ w_in[:k].T) @ (x @ w_in[d:d + k].T).T / k ** 0.5
    assert logits.diag().mean() > logits.mean() + 2
    with pytest.raises(ValueError, match="num_heads must divide the width 64; got 5"):
        mimetic_init_(w_in, w_out, 5)
    with pytest.raises(ValueError, match=r"in_proj_weight \(3d, d\).*got \(64, 64\)"):
        mimetic_init_(w_out, w_out, heads)


def test_vit_attn_init_option():
    torch.manual_seed(0)
    plain = create_model("vit_cifar_patch4", embed_dim=64, depth=2, num_heads=4)
    torch.manual_seed(0)
    mimetic = create_model("vit_cifar_patch4", embed_dim=64, depth=2, num_heads=4, attn_init="mimetic")
    for model, sign in ((plain, 0), (mimetic, -1)):
        attn = model.blocks[1].attn
        w_in, w_out = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]), attn.o_proj.weight
        vo_diag = (w_in[128:].T @ w_out.T).diag().mean().item()
        assert (vo_diag < -0.3) if sign else abs(vo_diag) < 0.05
    assert mimetic(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="attn_init must be 'default' or 'mimetic'; got 'xavier'"):
        create_model("vit_cifar_patch4", attn_init="xavier")


def test_local_relative_bias_starts_as_a_distance_penalty_halving_per_head():
    bias = RelativePositionBias2d((4, 4), num_heads=3, class_token=False, init="local")()[0]  # (3, 16, 16)
    # token (1,1) is index 5: itself 0, its right neighbour -1, (3,3) -hypot(2,2); each head half the last
    torch.testing.assert_close(bias[:, 5, 5], torch.zeros(3))
    torch.testing.assert_close(bias[:, 5, 6], torch.tensor([-1.0, -0.5, -0.25]))
    torch.testing.assert_close(bias[0, 5, 15], torch.tensor(-(8 ** 0.5)))
    probs = bias.softmax(-1)
    assert probs[0, 5, [1, 4, 6, 9]].sum() > probs[2, 5, [1, 4, 6, 9]].sum()  # the first head is the most local
    with_cls = RelativePositionBias2d((4, 4), num_heads=3, init="local")()[0]
    torch.testing.assert_close(with_cls[:, 6, 7], bias[:, 5, 6])
    with pytest.raises(ValueError, match="init must be 'normal' or 'local'; got 'conv'"):
        RelativePositionBias2d((4, 4), num_heads=3, init="conv")
    with pytest.raises(ValueError, match="rel_pos_init applies to pos_embed='relative'; got pos_embed='learned'"):
        create_model("vit_cifar_patch4", rel_pos_init="local")
    model = create_model("vit_cifar_patch4", embed_dim=64, depth=2, num_heads=4, pos_embed="relative",
                         rel_pos_init="local")
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("name, options", [
    ("vit_sketch_cifar", {}), ("vit_cifar_patch4", {}), ("sentiment_transformer_tiny", {"vocab_size": 50}),
    ("transformer_tiny", {"src_vocab_size": 50, "tgt_vocab_size": 50}),
])
def test_attention_options_that_the_model_sets_itself_are_one_clear_error(name, options):
    from attnlab.errors import InputError

    with pytest.raises(InputError, match="attention_options must not set 'dropout': the model sets it from "
                                         "attn_drop_rate, so set that"):
        create_model(name, attention_options={"dropout": 0.2}, **options)


@pytest.mark.parametrize("norm_first", [True, False])
def test_vit_block_is_the_transformer_encoder_layer_under_timms_names(norm_first):
    """One encoder block: with the same weights, a ViT block and a GELU encoder layer give the
    same tokens, dropout and drop path included; each keeps its own state_dict keys."""
    from attnlab.layers import EncoderBlock, TransformerEncoderLayer
    from attnlab.models.vit import Block

    rates = dict(mlp_ratio=2.0, drop_rate=0.1, attn_drop_rate=0.2, drop_path_rate=0.3, norm_first=norm_first)
    vit_block = Block(32, 4, **rates)
    layer = TransformerEncoderLayer(32, 4, activation="gelu", norm_eps=1e-6, **rates)
    assert isinstance(vit_block, EncoderBlock) and isinstance(layer, EncoderBlock)
    assert list(vit_block.state_dict()) == [
        "norm1.weight", "norm1.bias", *(f"attn.{p}_proj.{w}" for p in "qkvo" for w in ("weight", "bias")),
        "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight",
        "mlp.fc2.bias"]  # timm's, with the attention's projections apart (Llama's names)
    assert list(layer.state_dict()) == [
        *(f"self_attn.{p}_proj.{w}" for p in "qkvo" for w in ("weight", "bias")),
        "ff.fc1.weight", "ff.fc1.bias", "ff.fc2.weight", "ff.fc2.bias", "norm1.weight", "norm1.bias",
        "norm2.weight", "norm2.bias"]  # torch's, with attnlab's projections and ff
    layer.load_state_dict({k.replace("attn.", "self_attn.").replace("mlp.", "ff."): v
                           for k, v in vit_block.state_dict().items()})
    x = torch.randn(3, 5, 32)
    for mode in (False, True):
        outs = []
        for m in (vit_block, layer):
            torch.manual_seed(1)
            outs.append(m.train(mode)(x))
        assert torch.equal(outs[0], outs[1])


# ---------------------------------------------------------------------------- an option out of range


def test_a_model_option_out_of_range_in_python_names_the_config_field():
    from attnlab import create_model

    with pytest.raises(ValueError, match=r"ViTConfig.drop_rate must be >= 0.0 and < 1.0; got 2"):
        create_model("vit_digits_patch2", drop_rate=2)
