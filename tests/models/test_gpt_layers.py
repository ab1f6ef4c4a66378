"""Per-layer attention as a list: ``GPTConfig.layers`` holds one entry per layer (a kind's name,
or its kind, options, window and positions), or a pattern repeated to the depth, so that a hybrid
of any number of kinds is one key; ``layer_types``, ``window_pattern`` and ``nope_layers`` (the
families' knobs) become the same plan."""

import pytest
import torch

from attnlab.models import create_model
from attnlab.models.gpt_config import GPTConfig

TINY = dict(vocab_size=64, embed_dim=32, num_heads=4, max_len=64, pos_embed="rope")


def test_a_hybrid_of_three_kinds_is_one_key_and_decodes_with_each_kinds_cache():
    torch.manual_seed(0)
    m = create_model("gpt_tiny", depth=3, sliding_window=8, **TINY,
                     layers=["gated_delta", "exact", {"attention": "differential", "sliding": False}]).eval()
    kinds = [type(b.attn).__name__ for b in m.blocks]
    assert kinds == ["GatedDeltaNet", "GroupedQueryAttention", "DifferentialAttention"], kinds
    assert m.blocks[1].attn.sliding_window == 8 and m.blocks[2].attn.sliding_window is None
    assert [p.positions for p in m.config.layer_plan()] == [False, True, True]
    ids = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        cached = m.generate(ids, max_new_tokens=6)
        assert torch.equal(cached, m.generate(ids, max_new_tokens=6, use_cache=False))


def test_a_pattern_is_repeated_to_the_depth():
    cfg = GPTConfig(depth=6, **TINY, layers=["gated_delta", "gated_delta", "exact"])
    assert cfg.attention_kinds() == ["gated_delta", "gated_delta", "exact"] * 2
    with pytest.raises(ValueError, match=r"layers must list depth=6 entries, or a pattern whose length divides it; "
                                         r"got 4 entries"):
        GPTConfig(depth=6, **TINY, layers=["exact"] * 4)


def test_layer_types_and_layers_build_the_same_model():
    """Qwen3.5's 3:1 hybrid written both ways: the same plan, the same weights for a seed, the same logits."""
    old = dict(layer_types=["linear", "linear", "linear", "full"])
    new = dict(layers=["gated_delta", "gated_delta", "gated_delta", {"attention": "exact"}])
    assert GPTConfig(depth=4, **TINY, **old).layer_plan() == GPTConfig(depth=4, **TINY, **new).layer_plan()
    torch.manual_seed(0)
    a = create_model("gpt_tiny", depth=4, **TINY, **old).eval()
    torch.manual_seed(0)
    b = create_model("gpt_tiny", depth=4, **TINY, **new).eval()
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        assert torch.equal(a(ids), b(ids))


def test_sliding_patterns_and_layers_without_positions_are_one_plan_too():
    gemma = GPTConfig(depth=4, **TINY, sliding_window=16, window_pattern=2, rope_local_theta=10000.0, rope_theta=1e6)
    written = GPTConfig(depth=4, **TINY, sliding_window=16, rope_local_theta=10000.0, rope_theta=1e6,
                        layers=[{"sliding": True}, {"sliding": False}])
    assert gemma.layer_plan() == written.layer_plan()
    assert [p.options["rope_theta"] for p in written.layer_plan()] == [10000.0, 1e6, 10000.0, 1e6]
    smol = GPTConfig(depth=4, **TINY, nope_layers=[3])
    assert smol.layer_plan() == GPTConfig(depth=4, **TINY, layers=["exact", "exact", "exact",
                                                                   {"positions": False}]).layer_plan()


def test_per_layer_options_are_checked_against_their_kind():
    cfg = GPTConfig(depth=2, **TINY, layers=[{"attention": "local", "options": {"sliding_window": 4}}, "exact"])
    assert cfg.attention_options_of(0)["sliding_window"] == 4
    with pytest.raises(ValueError, match=r"layers\[0\]\.options: unknown option 'windw' of attention 'local'"):
        GPTConfig(depth=2, **TINY, layers=[{"attention": "local", "options": {"windw": 4}}])
    with pytest.raises(ValueError, match=r"layers\[0\]: unknown key 'option'; did you mean options"):
        GPTConfig(depth=2, **TINY, layers=[{"attention": "exact", "option": {}}])
    with pytest.raises(ValueError, match=r"layers\[1\]\.attention must be a 'tokens' kind; 'axial' is a grid kind"):
        GPTConfig(depth=2, **TINY, layers=["exact", "axial"])
    with pytest.raises(ValueError, match=r"layers\[0\]\.sliding needs sliding_window set"):
        GPTConfig(depth=2, **TINY, layers=[{"sliding": True}])
    with pytest.raises(ValueError, match=r"layers\[0\]\.sliding needs .* a kind with a sliding window"):
        GPTConfig(depth=2, **TINY, sliding_window=4, layers=[{"attention": "gated_delta", "sliding": True}])
    with pytest.raises(ValueError, match="layers and layer_types both say what each layer is"):
        GPTConfig(depth=2, **TINY, layers=["exact"], layer_types=["full", "full"])
    with pytest.raises(ValueError, match=r"layers\[0\]\.positions=false .* pos_embed is 'learned'"):
        GPTConfig(depth=2, **{**TINY, "pos_embed": "learned"}, layers=[{"positions": False}])


def test_the_layer_plan_is_made_once_and_again_when_a_field_is_set(monkeypatch):
    from attnlab.models.gpt_config import GPTConfig

    cfg = GPTConfig(vocab_size=50, max_len=32, embed_dim=32, depth=3, num_heads=4, pos_embed="rope")
    made = []
    make = GPTConfig._make_plan
    monkeypatch.setattr(GPTConfig, "_make_plan", lambda self: made.append(1) or make(self))
    first = cfg.layer_plan()
    assert cfg.layer_plan() == first and cfg.attention_of(2) == first[2].attention and len(made) == 1
    cfg.layer_plan().clear()  # a copy: the kept plan is not the caller's to change
    assert len(cfg.layer_plan()) == 3 and len(made) == 1
    cfg.sliding_window = 8
    assert all(layer.sliding for layer in cfg.layer_plan()) and len(made) == 2
