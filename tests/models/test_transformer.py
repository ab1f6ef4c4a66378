"""The Transformer equals torch.nn.Transformer, counts the paper's parameters, caches exactly."""

import pytest
import torch
from torch import nn

from attnlab.layers import TransformerEncoderLayer
from attnlab.models import Seq2SeqTransformer, Transformer, count_parameters, create_model

D, H, FF = 32, 4, 64


def torch_pair(norm_first=False, activation="relu"):
    ref = nn.Transformer(D, H, 2, 2, FF, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first)
    ref.encoder.enable_nested_tensor = False
    with torch.no_grad():  # perturb norms and biases so that every mapping matters
        for name, p in ref.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return ref, Transformer.from_torch(ref)


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (False, "gelu"), (True, "relu")])
def test_equals_torch_transformer_with_masks_and_gradients(norm_first, activation):
    ref, ours = torch_pair(norm_first, activation)
    src = torch.randn(3, 9, D, requires_grad=True)
    tgt = torch.randn(3, 6, D, requires_grad=True)
    src_pad = torch.zeros(3, 9, dtype=torch.bool)
    src_pad[1, 5:] = True
    tgt_pad = torch.zeros(3, 6, dtype=torch.bool)
    tgt_pad[2, 4:] = True
    causal = nn.Transformer.generate_square_subsequent_mask(6)  # float: -inf above the diagonal
    r = ref(src, tgt, tgt_mask=causal.isinf(), src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad)
    o = ours(src, tgt, src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad)
    keep = ~tgt_pad  # torch's fast paths may leave garbage at padded query positions
    torch.testing.assert_close(o[keep], r[keep], atol=1e-5, rtol=0)
    w = torch.randn_like(r) * keep.unsqueeze(-1)
    (r * w).sum().backward()
    r_grads = src.grad.clone(), tgt.grad.clone()
    src.grad = tgt.grad = None
    (o * w).sum().backward()
    torch.testing.assert_close(src.grad, r_grads[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(tgt.grad, r_grads[1], atol=1e-5, rtol=0)
    # The explicit float mask, as torch takes it, gives the same result as is_causal.
    o2 = ours(src, tgt, tgt_mask=causal, tgt_is_causal=False, src_key_padding_mask=src_pad,
              tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad)
    torch.testing.assert_close(o2[keep], o[keep], atol=1e-6, rtol=0)


def test_encoder_layer_equals_torch_in_eval():
    ref = nn.TransformerEncoderLayer(D, H, FF, dropout=0.1, batch_first=True).eval()
    ours = Transformer.from_torch(nn.Transformer(D, H, 1, 1, FF, batch_first=True)).encoder.layers[0]
    ours.load_state_dict({
        k.replace("linear1.", "ff.fc1.").replace("linear2.", "ff.fc2.").replace("in_proj_weight", "in_proj.weight")
        .replace("in_proj_bias", "in_proj.bias"): v for k, v in ref.state_dict().items()
    })
    ours.eval()
    x = torch.randn(2, 7, D)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=0)


def test_base_model_has_the_papers_63_1_million_parameters():
    with torch.device("meta"):
        base = create_model("transformer_base")
        with_final_norms = create_model("transformer_base", final_norm=True)
        ref = nn.Transformer(512, 8, 6, 6, 2048, batch_first=True)
    assert round(count_parameters(base) / 1e6, 1) == 63.1
    # torch.nn.Transformer always has final norms; with them the counts agree exactly.
    assert count_parameters(with_final_norms) == count_parameters(ref) + 37000 * 512
    assert base.generator.weight is base.tgt_embed.weight is base.src_embed.weight


def test_separate_untied_embeddings():
    m = create_model("transformer_tiny", src_vocab_size=50, tgt_vocab_size=40, share_embeddings=False, tie_output=False)
    assert m.src_embed is not m.tgt_embed and m.generator.weight is not m.tgt_embed.weight
    assert m(torch.randint(3, 50, (2, 5)), torch.randint(3, 40, (2, 4))).shape == (2, 4, 40)


@pytest.mark.parametrize("overrides", [
    {}, {"pos_embed": "learned"}, {"norm": "batchnorm", "norm_first": False}, {"norm_first": False},
    {"pos_embed": "rope"}, {"pos_embed": "alibi"},  # positions inside the self-attention, offset by the cache
])
def test_decoder_cache_equals_full_decoding(overrides):
    m = create_model("transformer_tiny", **overrides).eval()
    src = torch.randint(3, 1000, (3, 8))
    src[1, 5:] = 0
    tgt = torch.randint(3, 1000, (3, 7))
    with torch.no_grad():
        full = m(src, tgt)
        memory, pad = m.encode(src)
        cache = m.new_cache()
        steps = [m.decode(tgt[:, :3], memory, pad, cache=cache)]
        steps += [m.decode(tgt[:, i : i + 1], memory, pad, cache=cache) for i in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=0)


def test_padding_does_not_change_real_positions():
    m = create_model("transformer_tiny", drop_rate=0.0).eval()
    src = torch.randint(3, 1000, (1, 6))
    tgt = torch.randint(3, 1000, (1, 4))
    padded_src = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], 1)
    padded_tgt = torch.cat([tgt, torch.zeros(1, 2, dtype=torch.long)], 1)
    with torch.no_grad():
        torch.testing.assert_close(m(padded_src, padded_tgt)[:, :4], m(src, tgt), atol=1e-5, rtol=0)


def test_token_batchnorm_transformer_trains_with_padding():
    m = create_model("transformer_tiny", norm="batchnorm")
    src = torch.randint(3, 1000, (4, 8))
    src[0, 4:] = 0
    tgt = torch.randint(3, 1000, (4, 6))
    tgt[1, 3:] = 0
    loss = m(src, tgt).logsumexp(-1).mean()
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    a = create_model("transformer_tiny", drop_rate=0.0)
    b = create_model("transformer_tiny", drop_rate=0.0)
    b.load_state_dict(a.state_dict())
    b.set_grad_checkpointing(True)
    src, tgt = torch.randint(3, 1000, (2, 6)), torch.randint(3, 1000, (2, 5))
    for m in (a, b):
        m(src, tgt).square().mean().backward()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-6, rtol=1e-5, msg=n)


def test_encoder_layer_accepts_batchnorm_by_name():
    layer = TransformerEncoderLayer(D, H, mlp_ratio=FF / D, norm="batchnorm")
    assert type(layer.norm1).__name__ == "TokenBatchNorm"


def test_seq2seq_rejects_bad_config():
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads"):
        Seq2SeqTransformer(embed_dim=30, num_heads=4)
    with pytest.raises(ValueError, match="share_embeddings"):
        Seq2SeqTransformer(src_vocab_size=10, tgt_vocab_size=12)
    with pytest.raises(ValueError, match="unknown TransformerConfig field 'embeddim'; did you mean embed_dim"):
        create_model("transformer_tiny", embeddim=64)
    with pytest.raises(ValueError, match="TransformerConfig field 'd_model' is now called 'embed_dim'"):
        create_model("transformer_tiny", d_model=64)  # torch.nn.Transformer's name: the models take timm's


def test_decode_last_only_is_the_last_row_of_full_decoding():
    m = create_model("transformer_tiny").eval()
    src, tgt = torch.randint(3, 1000, (2, 6)), torch.randint(3, 1000, (2, 5))
    with torch.no_grad():
        memory, pad = m.encode(src)
        torch.testing.assert_close(m.decode(tgt, memory, pad, last_only=True), m.decode(tgt, memory, pad)[:, -1:])


# ---------------------------------------------------------------------------- a cache of another decoder


def test_decoder_cache_with_wrong_layer_count():
    from attnlab.attention.cache import ModelCache
    from attnlab.models import create_model

    m = create_model("transformer_tiny").eval()
    memory, pad = m.encode(torch.randint(3, 100, (1, 4)))
    with pytest.raises(ValueError, match="cache has 3 layers but the decoder has 2"):
        m.decode(torch.ones(1, 1, dtype=torch.long), memory, pad, cache=ModelCache.empty(3))
