"""DeepSeek-V3.2's sparse attention (the ``dsa`` kind): whole models through ``from_hf`` against
``transformers`` (ties among the index scores broken as it breaks them), the selection, cached
decoding, the indexer's loss and its training, refusals. Tiny random configurations built with
``transformers``, eager attention, float32."""

import pytest
import torch

from attnlab.attention import LatentAttention, build_attention, capture_attention
from attnlab.errors import InputError
from attnlab.formats import from_hf
from attnlab.models.gpt import GPT

from transformers_parity import VOCAB, greedy_equals_theirs, logits_equal_theirs

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")


# --------------------------------------------------------------------------- DeepSeek-V3.2's sparse attention
def _deepseek_v32(topk, index_heads=16, layers=2):
    """A tiny random DeepSeek-V3.2 of transformers'. With few index heads a key often scores exactly
    0 (every head's ReLU at 0: with 4 heads one key in 16), and equal scores at the k-th place are
    broken by torch.topk over every key of the call, which attnlab follows."""
    torch.manual_seed(0)
    config = transformers.DeepseekV32Config(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=12,
        v_head_dim=10, first_k_dense_replace=layers, max_position_embeddings=64, index_topk=topk, index_head_dim=16,
        index_n_heads=index_heads, eos_token_id=None, bos_token_id=None, pad_token_id=None, attn_implementation="eager")
    model = transformers.DeepseekV32ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.fixture(scope="module")
def deepseek_v32(tmp_path_factory):
    model = _deepseek_v32(topk=5)  # each query keeps 5 of up to 24 keys
    folder = tmp_path_factory.mktemp("deepseek_v32")
    model.save_pretrained(folder)
    return model, folder


def test_deepseek_v32_logits_of_a_padded_batch_equal_transformers_to_1e_5(deepseek_v32):
    ours = logits_equal_theirs(*deepseek_v32, length=24, pad_from=17)  # 5 keys kept of up to 24
    assert ours.config.attention == "dsa" and ours.blocks[0].attn.index_topk == 5


def test_deepseek_v32_greedy_generation_gives_transformers_tokens(deepseek_v32):
    greedy_equals_theirs(*deepseek_v32, new=14)


@pytest.fixture(scope="module")
def deepseek_v32_ties(tmp_path_factory):
    model = _deepseek_v32(topk=8, index_heads=4, layers=6)  # equal index scores at the 8th place are common
    folder = tmp_path_factory.mktemp("deepseek_v32_ties")
    model.save_pretrained(folder)
    return model, folder


def test_deepseek_v32_with_equal_index_scores_breaks_them_as_transformers(deepseek_v32_ties):
    theirs, folder = deepseek_v32_ties
    ours = from_hf(folder)
    ids = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # rows 0-7 see fewer keys than index_topk; the rest pick 8 of up to 20
        got, expected = ours(ids), theirs(ids).logits
        with capture_attention(ours):  # the form that forms the weights picks the same keys
            captured = ours(ids)
    assert (got - expected).abs().max().item() < 1e-5
    assert (captured - expected).abs().max().item() < 1e-5
    logits_equal_theirs(theirs, folder, length=20, pad_from=13)
    greedy_equals_theirs(theirs, folder, new=14)


def test_the_selection_matters_and_keeping_every_key_is_latent_attention():
    from attnlab.attention import IndexedSparseAttention

    torch.manual_seed(0)
    options = dict(kv_rank=16, q_rank=24, rope_dim=4, rope=True, index_heads=2)
    sparse = IndexedSparseAttention(32, 4, index_topk=3, **options).eval()
    every = IndexedSparseAttention(32, 4, index_topk=64, **options).eval()
    every.load_state_dict(sparse.state_dict())
    latent = LatentAttention(32, 4, **{k: v for k, v in options.items() if k != "index_heads"}).eval()
    latent.load_state_dict({k: v for k, v in sparse.state_dict().items() if not k.startswith("indexer.")})
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        dense, _ = latent(x, is_causal=True)
        kept, _ = every(x, is_causal=True)
        few, weights = sparse(x, is_causal=True, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(kept, dense, atol=1e-6, rtol=0)
    assert (few - dense).abs().max() > 1e-3
    assert ((weights > 0).sum(-1) <= 3).all() and ((weights > 0).sum(-1)[..., 3:] == 3).all()


def test_dsa_cached_decoding_equals_recomputation():
    torch.manual_seed(0)
    model = GPT(vocab_size=50, max_len=64, embed_dim=32, depth=2, num_heads=4, pos_embed="rope", norm="rmsnorm",
                mlp="swiglu", attention="dsa",
                attention_options={"kv_rank": 16, "q_rank": 24, "rope_dim": 4, "index_topk": 4}).eval()
    ids = torch.randint(0, 50, (2, 6))
    out = model.generate(ids, 12)
    assert torch.equal(out, model.generate(ids, 12, use_cache=False))
    assert model.blocks[0].attn.cache_bytes(1, 10, torch.float32) == (16 + 4 + 8) * 10 * 4


@pytest.mark.parametrize("padded", [0, 8])
def test_dsa_decode_step_attends_to_the_gathered_best_latents_as_forward_does(padded):
    """The lean step gathers the index_topk best latents instead of masking the rest: equal to
    forward with the cache, on a row left-padded so far that fewer real keys than index_topk remain."""
    from attnlab.attention import IndexedSparseAttention

    torch.manual_seed(0)
    attn = IndexedSparseAttention(32, 4, kv_rank=16, q_rank=24, rope_dim=4, rope=True, index_topk=3).eval()
    x = torch.randn(2, 12, 32)
    pad = torch.zeros(2, 12, dtype=torch.bool)
    pad[1, :padded] = True
    lean, plain = attn.new_cache(2, 12), attn.new_cache(2, 12)
    with torch.no_grad():
        for cache in (lean, plain):
            attn(x[:, :9], is_causal=True, key_padding_mask=pad[:, :9], cache=cache)
        for t in range(9, 12):
            step = attn.decode_step(x[:, t], lean, key_padding_mask=pad[:, : t + 1])
            full = attn(x[:, t : t + 1], is_causal=True, key_padding_mask=pad[:, : t + 1], cache=plain)[0][:, 0]
            torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)


def _index_kl_by_hand(attn, x):
    """DeepSeek-V3.2's indexer loss written out for one unbatched causal sequence: for each query,
    the heads' attention over its selected keys summed and renormalised, and the KL divergence
    from it to the softmax of the indexer's scores over the same keys."""
    q, stored, positions, c = attn._stored(x, None, None)
    n = x.shape[1]
    blocked = torch.ones(n, n, dtype=torch.bool).triu(1)[None, None]
    r = attn.kv_rank + attn.rope_dim
    mask, index = attn._selected(x, positions, stored[..., r:], blocked)
    k, _ = attn._keys_values(c, stored[..., attn.kv_rank: r])
    total = 0.0
    for t in range(n):
        keep = ~mask[0, 0, t]
        logits = (q[0, :, t, None] @ k[0, :, keep].transpose(-1, -2))[:, 0] * attn.scale  # (H, kept)
        p = logits.softmax(-1).sum(0)
        p = p / p.sum()
        log_q = index[0, t, keep].log_softmax(-1)
        total = total + (p * (p.log() - log_q)).sum()
    return total / n


def test_dsa_indexer_loss_is_deepseeks_kl_and_trains_the_indexer_alone():
    """The loss kept for the trainer equals the KL written out by hand; the forward's output does
    not depend on it; its gradient reaches the indexer's weights and nothing else (the indexer
    reads detached inputs), so the other weights' gradients are those of the task's loss alone;
    index_loss=0 keeps none, and evaluation keeps none."""
    from attnlab.attention import IndexedSparseAttention

    torch.manual_seed(0)
    options = dict(kv_rank=16, q_rank=24, rope_dim=4, rope=True, index_heads=2, index_topk=4)
    attn = IndexedSparseAttention(32, 4, **options, index_loss=0.5).train()
    plain = IndexedSparseAttention(32, 4, **options, index_loss=0.0).train()
    plain.load_state_dict(attn.state_dict())
    x = torch.randn(1, 10, 32)
    out, _ = attn(x, is_causal=True)
    aux = attn.take_aux_loss()
    assert attn.take_aux_loss() is None  # taken once
    torch.testing.assert_close(aux, 0.5 * _index_kl_by_hand(attn, x), atol=1e-6, rtol=1e-5)
    (out.square().sum() + aux).backward()
    out_plain, _ = plain(x, is_causal=True)
    assert plain.take_aux_loss() is None
    torch.testing.assert_close(out, out_plain, atol=0, rtol=0)
    out_plain.square().sum().backward()
    for (name, p), q in zip(attn.named_parameters(), plain.parameters()):
        if name.startswith("indexer."):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
            assert q.grad is None or not q.grad.any(), name  # (zeros: the cache's slice beside the latent)
        else:
            torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5, msg=name)
    attn.eval()
    with torch.no_grad():
        attn(x, is_causal=True)
    assert attn.take_aux_loss() is None


def test_dsa_indexer_learns_the_attentions_choice_through_the_trainer():
    """A decoder with sparse attention trained by the engine: the trainer adds the indexer's loss,
    the indexer's weights move (with index_loss=0 they stay as drawn), and the indexer's KL on a
    fixed batch ends well below that of an indexer left as drawn beside the same kind of training."""
    from attnlab.engine.trainer import TrainConfig, Trainer

    class Windows:
        def __init__(self, ids):
            self.ids = ids

        def __len__(self):
            return len(self.ids)

        def get_batch(self, idx):
            rows = self.ids[torch.as_tensor(idx)]
            return rows[:, :-1], rows[:, 1:]

    torch.manual_seed(0)
    pattern = torch.arange(40) % 7  # text that repeats: attention has something to find
    ids = torch.stack([(pattern + i) % 7 for i in range(16)])

    def trained(weight):
        torch.manual_seed(0)
        model = GPT(vocab_size=8, max_len=64, embed_dim=32, depth=1, num_heads=4, pos_embed="rope", norm="rmsnorm",
                    mlp="swiglu", attention="dsa", attention_options={"kv_rank": 16, "q_rank": 24, "rope_dim": 4,
                                                                      "index_topk": 6, "index_loss": weight})
        start = {k: v.clone() for k, v in model.state_dict().items() if ".indexer." in k}
        attn = model.blocks[0].attn

        Trainer(model, Windows(ids), TrainConfig(steps=60, batch_size=8, lr=3e-3, weight_decay=0.0, warmup_steps=0, progress=False,
                                                 tensorboard=False, log_every=1000), log=lambda line: None).fit()
        moved = max((model.state_dict()[k] - v).abs().max().item() for k, v in start.items())
        attn.index_loss = 1.0  # to read the KL of the indexer as it ended
        model(ids[:4, :-1])
        return moved, attn.take_aux_loss().item()

    moved, kl = trained(1.0)
    moved_untrained, kl_untrained = trained(0.0)
    assert moved > 1e-3 and moved_untrained == 0.0
    assert kl < 0.5 * kl_untrained, (kl, kl_untrained)


@pytest.mark.parametrize("value", [-1.0, float("nan"), "much"])
def test_dsa_index_loss_refuses_what_is_not_a_weight(value):
    with pytest.raises(InputError, match="index_loss must be a finite number >= 0"):
        build_attention("dsa", 32, 4, index_loss=value)


@pytest.mark.parametrize("options,message", [
    ({"rope": True, "rope_dim": 8, "index_head_dim": 4}, "index_head_dim .4. must hold the rotary part"),
    ({"index_topk": 0}, "index_topk must be an integer >= 1"),
])
def test_dsa_refuses_impossible_sizes_in_one_line(options, message):
    with pytest.raises(InputError, match=message):
        build_attention("dsa", 32, 4, **options)
