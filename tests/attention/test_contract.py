"""The contract between a model and its attention (attnlab.attention.contract): every kind's
declared capabilities agree with what it does, its options are a typed schema that recipes,
the command line and subclasses share, and its cache is a Cache."""

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.attention import registry
from attnlab.attention.cache import DecodingCache
from attnlab.attention.contract import Cache, Option, Options
from attnlab.attention.differential import DifferentialAttention
from attnlab.attention.nsa import NativeSparseAttention
from attnlab.errors import InputError
from attnlab.models import create_model
from attnlab.models import gpt as gpt_module

ROOT = Path(__file__).resolve().parents[2]
TOKENS = registry.list_attention("tokens")
E, H, L = 32, 4, 8


def build(kind, **options):
    torch.manual_seed(0)
    return registry.build_attention(kind, E, H, **options).eval()


def call(module, kind, x, **kw):
    caps = registry.attention_entry(kind).capabilities
    kw.setdefault("is_causal", bool(caps.causal))
    return module(x, **kw)[0]


# ---------------------------------------------------------------------------------------------- declarations
def test_every_shipped_kind_declares_its_options_and_capabilities_where_it_registers():
    sources = [p for p in (ROOT / "src" / "attnlab" / "attention").rglob("*.py")]
    decorators = [m.group(0) for p in sources
                  for m in re.finditer(r"@register_attention\((.*?)\)\nclass", p.read_text(encoding="utf-8"), re.S)]
    assert len(decorators) == len(registry.list_attention())
    for text in decorators:
        assert "options=" in text, text
        if 'family="grid"' not in text:
            for flag in ("takes_positions=", "causal=", "padding=", "lora_roles="):
                assert flag in text, (flag, text)


@pytest.mark.parametrize("kind", TOKENS)
def test_a_kind_that_declares_causal_ignores_later_tokens_and_one_that_does_not_refuses(kind):
    caps = registry.attention_entry(kind).capabilities
    module = build(kind)
    x = torch.randn(2, L, E)
    if not caps.causal:
        with pytest.raises(InputError):
            module(x, is_causal=True)
        return
    later = x.clone()
    later[:, 5:] = torch.randn(2, L - 5, E)
    with torch.no_grad():
        torch.testing.assert_close(module(x, is_causal=True)[0][:, :5], module(later, is_causal=True)[0][:, :5])
    if caps.causal_only:
        with pytest.raises(InputError):
            module(x, is_causal=False)


@pytest.mark.parametrize("kind", TOKENS)
def test_a_kind_that_declares_padding_is_not_moved_by_what_the_padding_holds(kind):
    caps = registry.attention_entry(kind).capabilities
    assert caps.padding in (True, False)
    module = build(kind)
    x = torch.randn(2, L, E)
    pad = torch.zeros(2, L, dtype=torch.bool)
    pad[0, :2] = True  # left padding, as a batch of prompts has it
    changed = x.clone()
    changed[0, :2] = torch.randn(2, E) * 10
    if not caps.padding:
        with pytest.raises(InputError):
            call(module, kind, x, key_padding_mask=pad)
        return
    with torch.no_grad():
        torch.testing.assert_close(call(module, kind, x, key_padding_mask=pad)[0, 2:],
                                   call(module, kind, changed, key_padding_mask=pad)[0, 2:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", TOKENS)
def test_a_kind_forms_weights_exactly_when_it_declares_them(kind):
    caps = registry.attention_entry(kind).capabilities
    module = build(kind)
    x = torch.randn(2, L, E)
    with torch.no_grad():
        if caps.weights:
            weights = module(x, is_causal=bool(caps.causal), need_weights=True)[1]
            assert weights is not None and weights.shape[-2:] == (L, L)
        else:
            try:
                assert module(x, is_causal=bool(caps.causal), need_weights=True)[1] is None
            except InputError:
                pass


@pytest.mark.parametrize("kind", [k for k in TOKENS if registry.attention_entry(k).capabilities.positions])
def test_a_kind_that_takes_positions_takes_each_rows_own(kind):
    module = build(kind)
    x = torch.randn(2, L, E)
    positions = torch.stack([torch.arange(L), torch.arange(L) + 3])
    with torch.no_grad():
        out = call(module, kind, x, positions=positions)
    assert out.shape == (2, L, E) and torch.isfinite(out).all()


CACHED = [k for k in TOKENS if registry.attention_entry(k).capabilities.cache]


def _prefix(module, kind, x, n):
    cache = module.new_cache(x.shape[0], 32, dtype=x.dtype, device=x.device)
    with torch.no_grad():
        module(x[:, :n], cache=cache, is_causal=True)
    return cache


@pytest.mark.parametrize("kind", CACHED)
def test_a_kind_that_keeps_a_cache_makes_a_cache_that_reorders_its_rows(kind):
    module = build(kind)
    x = torch.randn(2, L, E)
    cache = _prefix(module, kind, x, 5)
    assert isinstance(cache, Cache) and cache.seq_len == 5 and cache.nbytes() > 0
    assert isinstance(cache.scratch, dict)
    assert module.cache_bytes(2, 5, torch.float32) > 0
    swapped = torch.tensor([1, 0])
    plain = _prefix(module, kind, x, 5)
    cache.reorder(swapped)
    with torch.no_grad():
        step_swapped = module(x[swapped, 5:6], cache=cache, is_causal=True)[0]
        step_plain = module(x[:, 5:6], cache=plain, is_causal=True)[0]
    torch.testing.assert_close(step_swapped, step_plain[swapped])
    dropped = _prefix(module, kind, x, 5)
    dropped.reorder(torch.tensor([1]))  # beam search drops hypotheses the same way
    with torch.no_grad():
        torch.testing.assert_close(module(x[1:, 5:6], cache=dropped, is_causal=True)[0], step_plain[1:])


@pytest.mark.parametrize("kind", [k for k in CACHED if registry.attention_entry(k).capabilities.decode_step])
def test_a_kind_that_declares_a_decode_step_steps_as_its_forward_does(kind):
    module = build(kind)
    x = torch.randn(2, L, E)
    stepped, forward = _prefix(module, kind, x, 5), _prefix(module, kind, x, 5)
    with torch.no_grad():
        torch.testing.assert_close(module.decode_step(x[:, 5], stepped),
                                   module(x[:, 5:6], cache=forward, is_causal=True)[0][:, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", CACHED)
def test_a_kind_that_streams_sizes_and_makes_its_cache_under_the_policy(kind):
    module = build(kind)
    caps = registry.attention_entry(kind).capabilities
    if not caps.streaming:
        assert "cache_window" not in inspect.signature(module.cache_bytes).parameters or kind == "nsa"
        return
    whole = module.cache_bytes(1, 100_000, torch.float32)
    streamed = module.cache_bytes(1, 100_000, torch.float32, cache_window=16, sink_tokens=4)
    assert streamed < whole / 100
    cache = module.new_cache(1, 100_000, dtype=torch.float32, device="cpu", cache_window=16, sink_tokens=4)
    with torch.no_grad():
        for t in range(60):
            module(torch.randn(1, 1, E), cache=cache, is_causal=True)
    assert cache.nbytes() <= streamed


def test_the_key_value_cache_reorders_its_sink_tokens_too():
    cache = DecodingCache(64, window=4, sinks=2)
    keys = torch.arange(2 * 10, dtype=torch.float32).view(2, 1, 10, 1)
    cache.update(keys, keys.clone())
    cache.reorder(torch.tensor([1, 0]))
    k, v, _ = cache.update(keys[:, :, :1] * 0, keys[:, :, :1] * 0)
    assert k[0, 0, :2, 0].tolist() == [10.0, 11.0] and k[1, 0, :2, 0].tolist() == [0.0, 1.0]  # each row's sinks


# ---------------------------------------------------------------------------------------------- the streaming check
def test_a_long_streaming_generation_on_a_full_attention_model_is_sized_by_its_window(monkeypatch):
    model = create_model("gpt_tiny", vocab_size=64, max_len=100_000, pos_embed="rope").eval()
    dtype = model.tok_embed.weight.dtype
    room = sum(b.attn.cache_bytes(1, 200, dtype) for b in model.blocks)  # the whole cache of 200 positions
    monkeypatch.setattr(gpt_module, "available_memory", lambda: room)
    ids = torch.randint(0, 64, (1, 4))
    with pytest.raises(InputError, match="max_new_tokens must be at most"):
        model.generate(ids, 300)  # the whole cache does not fit
    out = model.generate(ids, 300, cache_window=16, sink_tokens=4)  # refused before: sized as the whole cache
    assert out.shape == (1, 304)


# ---------------------------------------------------------------------------------------------- options
def _size(kind):
    return {"size": (4, 4)} if registry.attention_entry(kind).family == "grid" else {}


@pytest.mark.parametrize("kind", registry.list_attention())
def test_every_kind_builds_with_its_declared_defaults_and_refuses_values_outside_its_ranges(kind):
    schema = registry.attention_entry(kind).options
    defaults = {o.name: o.default for o in schema if not o.required}
    registry.build_attention(kind, E, H, **{**defaults, **_size(kind)})
    for option in schema:
        if option.type in (int, float) and option.low is not None:
            below = option.low - 1 if option.type is int or not option.low_open else option.low
            with pytest.raises(InputError, match=rf"^{option.name} must be .*\(an option of attention '{kind}'\)"):
                registry.build_attention(kind, E, H, **{option.name: below}, **_size(kind))
        if option.type is bool:
            with pytest.raises(InputError, match=rf"^{option.name} must be true or false"):
                registry.build_attention(kind, E, H, **{option.name: "yes"}, **_size(kind))
    with pytest.raises(InputError, match=f"unknown option 'nonsense' of attention '{kind}'"):
        registry.build_attention(kind, E, H, nonsense=1, **_size(kind))


def test_a_kind_built_on_another_extends_its_options_without_repeating_them():
    constructor = inspect.signature(DifferentialAttention).parameters
    schema = registry.attention_entry("differential").options
    assert "rope_theta" in schema and "rope_theta" not in constructor  # the exact kind's, not re-listed
    assert "lambda_init" in schema and "lambda_init" in constructor
    assert "softcap" not in schema  # dropped: differential attention has no soft-capped form
    with pytest.raises(InputError, match="unknown option 'softcap' of attention 'differential'"):
        DifferentialAttention(E, H, softcap=30.0)  # built directly, as from the registry
    assert registry.attention_entry("nsa").options["branch_window"].default == 64  # its sliding branch's, by its own name
    assert "alibi" not in registry.attention_entry("nsa").options
    with pytest.raises(InputError, match="unknown option 'alibi' of attention 'nsa'"):
        NativeSparseAttention(E, H, alibi=True)


def test_a_kind_whose_options_disagree_with_its_constructor_is_refused_at_registration(monkeypatch):
    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))

    class Windowed(torch.nn.Module):
        def __init__(self, embed_dim, num_heads, *, window=8):
            super().__init__()

    with pytest.raises(InputError, match="option 'window' defaults to 4 in its options and to 8 in its constructor"):
        registry.register_attention("windowed_test", options=Options(Option("window", int, 4)))(Windowed)
    with pytest.raises(InputError, match="declares options its constructor does not take: gain"):
        registry.register_attention("windowed_test", options=Options(Option("window", int, 8),
                                                                     Option("gain", float, 1.0)))(Windowed)
    with pytest.raises(InputError, match="its constructor takes 'window', which its options do not declare"):
        registry.register_attention("windowed_test", options=Options())(Windowed)


def test_a_recipes_attention_options_are_checked_against_the_schema_before_the_model_is_built():
    with pytest.raises(InputError, match=r"^GPTConfig\.attention_options\.top_k must be an integer >= 1; got 0$"):
        create_model("gpt_tiny", attention="topk", attention_options={"top_k": 0})
    with pytest.raises(InputError, match=r"^GPTConfig\.attention_options\.pattern must be one of 'fixed', 'strided', "
                                         r"'bigbird'; got 'dense'$"):
        create_model("gpt_tiny", attention="sparse", attention_options={"pattern": "dense"})
    with pytest.raises(InputError, match="unknown option 'top_kk' of attention 'topk'; did you mean top_k"):
        create_model("gpt_tiny", attention="topk", attention_options={"top_kk": 8})


def _attnlab(*args):
    done = subprocess.run([sys.executable, "-m", "attnlab", *args], capture_output=True, text=True)
    return done.returncode, done.stdout, done.stderr


def test_attnlab_kinds_lists_every_kind_and_a_kinds_options_with_defaults_and_ranges():
    code, out, _ = _attnlab("kinds")
    assert code == 0
    listed = [line.split()[0] for line in out.splitlines()[1:] if line and not line.startswith("attnlab")]
    assert listed == registry.list_attention()
    code, out, _ = _attnlab("kinds", "local")
    assert code == 0
    assert re.search(r"^  sliding_window\s+an integer >= 1\s+128\s+each query sees", out, re.M), out
    code, out, err = _attnlab("kinds", "locla")
    assert code == 2 and out == "" and err.strip().endswith("unknown attention 'locla'; did you mean local?")
    assert len(err.strip().splitlines()) == 1


def test_nothing_outside_the_registry_probes_an_attention_modules_signature_or_methods():
    for folder in ("models", "layers", "tasks", "bench", "viz", "engine"):
        for file in (ROOT / "src" / "attnlab" / folder).rglob("*.py"):
            text = file.read_text(encoding="utf-8")
            assert "inspect.signature" not in text, file
            assert not re.search(r"getattr\([^)]*\"(decode_step|new_cache|cache_bytes|scratch)\"", text), file
            assert not re.search(r"isinstance\(getattr\([^)]*\"scratch\"", text), file
