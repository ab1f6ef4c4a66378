"""attnlab.bench.fidelity: each kind's error against exact attention on a model's own queries, keys and values."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from attnlab.attention.exact import GroupedQueryAttention
from attnlab.bench.attention import run_bench
from attnlab.bench.fidelity import FIDELITY_SETTINGS, attention_inputs, relative_errors
from attnlab.bench.report import markdown
from attnlab.models import create_model


def _model_and_batches():
    torch.manual_seed(0)
    model = create_model("sentiment_transformer_tiny", vocab_size=50, num_classes=2).eval()
    ids = torch.randint(4, 50, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 7:] = 0  # padding in the second sentence
    mask[2, 10:] = 0
    ids[mask == 0] = 0
    return model, [{"input_ids": ids, "attention_mask": mask}]


def test_recorded_queries_keys_values_give_the_layers_own_output():
    model, batches = _model_and_batches()
    layers = [m for m in model.modules() if isinstance(m, GroupedQueryAttention)]
    outputs = []
    handle = layers[0].register_forward_hook(lambda m, a, out: outputs.append(out[0]))
    inputs = attention_inputs(model, batches)
    handle.remove()
    assert len(inputs) == len(layers) and all(len(layer) == 1 for layer in inputs)
    q, k, v, pad = inputs[0][0]
    assert q.shape == (3, layers[0].num_heads, 12, layers[0].head_dim) and pad.dtype == torch.bool
    assert pad[1, 7:].all() and not pad[1, :7].any() and not pad[0].any()
    attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=~pad[:, None, None, :])
    again = layers[0].o_proj(attended.transpose(1, 2).reshape(3, 12, -1))
    real = ~pad
    torch.testing.assert_close(again[real], outputs[0][real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind, options", [("topk", {"top_k": 12}), ("local", {"sliding_window": 12}),
                                           ("lsh", {"bucket_size": 12, "n_buckets": 4})])
def test_a_kind_that_is_exact_at_these_settings_has_no_error(kind, options):
    model, batches = _model_and_batches()
    rec = relative_errors(kind, options, attention_inputs(model, batches))
    assert rec["error"] < 1e-5 and len(rec["error_per_layer"]) == len(attention_inputs(model, batches))
    if kind == "topk":
        assert rec["kept_mass"] == pytest.approx(1.0, abs=1e-5)


def test_approximations_have_errors_that_fall_with_k_and_kept_mass_that_grows():
    model, batches = _model_and_batches()
    inputs = attention_inputs(model, batches)
    recs = [relative_errors("topk", {"top_k": k}, inputs) for k in (1, 3, 6)]
    errors, kept = [r["error"] for r in recs], [r["kept_mass"] for r in recs]
    assert errors[0] > errors[1] > errors[2] > 0 and kept[0] < kept[1] < kept[2] < 1
    assert relative_errors("local", {"sliding_window": 1}, inputs)["error"] > 0.01
    assert relative_errors("lsh", {"bucket_size": 2, "n_buckets": 4}, inputs)["reference"].startswith("one-chunk")


def test_a_latent_of_full_rank_is_exact_and_a_smaller_one_loses_what_it_leaves_out():
    """Latent attention's rows: keys and values through their best shared latent. At the rank of
    the keys and values side by side (2 x embed) nothing is lost; below it the error grows as
    the rank falls and the kept energy is the SVD's share, checked by hand for one rank."""
    model, batches = _model_and_batches()
    inputs = attention_inputs(model, batches)
    embed = inputs[0][0][0].shape[1] * inputs[0][0][0].shape[3]
    full = relative_errors("latent", {"kv_rank": 2 * embed}, inputs)
    assert full["error"] < 1e-5 and full["kept_energy"] == pytest.approx(1.0, abs=1e-9)
    recs = [relative_errors("latent", {"kv_rank": r}, inputs) for r in (2, 8, 24)]
    assert recs[0]["error"] > recs[1]["error"] > recs[2]["error"] > 1e-4
    assert recs[0]["kept_energy"] < recs[1]["kept_energy"] < recs[2]["kept_energy"] < 1
    energies = []
    for layer in inputs:
        q, k, v, pad = layer[0]
        z = torch.cat([k, v], dim=1).permute(0, 2, 1, 3).flatten(2)[~pad].double()
        s = torch.linalg.svdvals(z).square()
        energies.append(float(s[:8].sum() / s.sum()))
    assert recs[1]["kept_energy"] == pytest.approx(sum(energies) / len(energies), rel=1e-9)


def test_every_setting_builds():
    model, batches = _model_and_batches()
    inputs = attention_inputs(model, batches)
    for label, kind, options in FIDELITY_SETTINGS:
        rec = relative_errors(kind, options, inputs)
        assert 0 <= rec["error"] < 10, label


def _mr_dir() -> Path | None:
    d = os.environ.get("ATTNLAB_DATA_DIR")
    return Path(d) if d and (Path(d) / "mr").is_dir() else None


@pytest.mark.skipif(_mr_dir() is None, reason="needs the MR data under $ATTNLAB_DATA_DIR/mr")
def test_the_fidelity_part_trains_the_exact_mr_model_once_and_tables_every_setting(tmp_path):
    data = run_bench(tmp_path, parts=["fidelity"], quick=True, log=lambda s: None)
    labels = [r["label"] for r in data["fidelity"]]
    assert labels == [s[0] for s in FIDELITY_SETTINGS]
    assert [r["kind"] for r in data["quality"]] == ["exact"]  # the model the errors come from, recorded once
    assert data["fidelity"][0]["sentences"] == 64
    text = markdown(data)
    assert "Error against exact attention on a trained model's" in text and "| topk k=4 | top_k=4 |" in text
    again = run_bench(tmp_path, parts=["fidelity"], quick=True, log=lambda s: None)  # resumes: nothing new
    assert again["fidelity"] == data["fidelity"]
