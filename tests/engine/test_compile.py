"""TrainConfig(compile=True): the same training through torch.compile, the same checkpoints."""

import shutil

import pytest
import torch

from attnlab.engine.checkpoint import latest_checkpoint, load_checkpoint
from attnlab.engine.config import ConfigError
from attnlab.engine.metrics import read_metrics
from attnlab.engine.trainer import TrainConfig, Trainer
from attnlab.models import create_model
from attnlab.recipes import load_recipe


def _inductor_missing() -> str | None:
    """Why torch.compile's default backend (inductor) cannot run here, or None."""
    try:
        import torch._dynamo

        if not torch._dynamo.is_dynamo_supported():
            return "torch.compile is not supported on this Python/platform"
    except Exception as exc:  # noqa: BLE001 - any import problem means no compile
        return f"torch._dynamo is unavailable: {exc}"
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "inductor's CPU backend compiles C++ and no C++ compiler (g++, c++, clang++) is on PATH"
    return None


class Blobs:
    """Fixed random 8x8 images with labels a small model can start to learn."""

    def __init__(self, n=128):
        g = torch.Generator().manual_seed(5)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.x = torch.randn(n, 1, 8, 8, generator=g) * 0.5 + self.y.view(-1, 1, 1, 1) / 5

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def _train(tmp_path, compile: bool):
    torch.manual_seed(0)  # the same initial weights for both runs
    model = create_model("vit_digits_patch2", depth=1, embed_dim=32, num_heads=2, drop_rate=0.0, drop_path_rate=0.0)
    cfg = TrainConfig(steps=4, batch_size=16, accum_steps=2, lr=3e-3, warmup_steps=1, device="cpu", seed=1,
                      log_every=1, checkpoint_every=4, progress=False, tensorboard=False, compile=compile)
    run_dir = tmp_path / ("compiled" if compile else "eager")
    trainer = Trainer(model, Blobs(), cfg, run_dir=run_dir, log=lambda _: None)
    trainer.fit()
    losses = [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    weights, _ = load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))
    return trainer, losses, weights


def test_compile_option_is_validated():
    assert load_recipe("vit-digits", ["train.compile=true"]).train.compile is True
    assert load_recipe("vit-digits", ["train.compile=true", "train.compile_mode=max-autotune"]).train.compile_mode \
        == "max-autotune"
    with pytest.raises(ValueError, match="train.compile_mode applies only with train.compile=true"):
        load_recipe("vit-digits", ["train.compile_mode=max-autotune"])  # silently ignored before
    with pytest.raises(ConfigError, match="compile_mode"):
        load_recipe("vit-digits", ["train.compile_mode=fastest"])


@pytest.mark.skipif(_inductor_missing() is not None, reason=str(_inductor_missing()))
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own import
def test_compiled_training_matches_eager_and_keeps_checkpoint_keys(tmp_path):
    torch._dynamo.reset()
    eager, eager_losses, eager_weights = _train(tmp_path, compile=False)
    compiled, compiled_losses, compiled_weights = _train(tmp_path, compile=True)

    assert compiled.train_model is not compiled.model  # it did train through the compiled wrapper
    assert compiled.model is not None and type(compiled.model) is type(eager.model)
    assert len(eager_losses) == len(compiled_losses) == 4
    torch.testing.assert_close(torch.tensor(compiled_losses), torch.tensor(eager_losses), atol=1e-4, rtol=1e-4)
    assert eager_losses[-1] != eager_losses[0]  # the weights did move

    assert list(compiled_weights) == list(eager_weights)  # no "_orig_mod." prefix
    assert list(compiled.model.state_dict()) == list(eager.model.state_dict())
    for name, w in eager_weights.items():
        torch.testing.assert_close(compiled_weights[name], w, atol=1e-4, rtol=1e-3, msg=name)
