"""The training loop: it learns, resumes bit-exactly, accumulates, keeps an EMA."""

import pytest
import torch

from attnlab.data import load_digits_dataset
from attnlab.engine.trainer import EpochSampler, TrainConfig, Trainer, evaluate_model, read_batches
from attnlab.models import create_model


class Scaled:
    """Digits as normalized float tensors."""

    def __init__(self, split):
        self.ds = load_digits_dataset(split)

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        x, y = self.ds[i]
        return (x.float() / 255.0 - 0.3053) / 0.3759, int(y)


def digits_model():
    return create_model("vit_digits_patch2", depth=2, embed_dim=32, num_heads=2, drop_rate=0.1, drop_path_rate=0.1)


def config(**kw):
    base = dict(steps=12, batch_size=32, lr=3e-3, warmup_steps=2, log_every=0, device="cpu", seed=1,
                deterministic=True)
    return TrainConfig(**{**base, **kw})


def test_sampler_is_a_function_of_seed_and_epoch():
    s = EpochSampler(100, 10, seed=3)
    assert len(s) == 10
    assert list(s.batches(2)) == list(EpochSampler(100, 10, seed=3).batches(2))
    assert list(s.batches(2)) != list(s.batches(3))
    assert list(s.batches(2, start=4)) == list(s.batches(2))[4:]
    ranks = [list(EpochSampler(100, 5, 0, rank=r, world=2).batches(0)) for r in (0, 1)]
    assert sorted(ranks[0][0] + ranks[1][0]) == sorted(list(EpochSampler(100, 10, 0).batches(0))[0])


def test_learns_digits():
    torch.manual_seed(0)
    model = create_model("vit_digits_patch2")
    trainer = Trainer(model, Scaled("train"), config(steps=200, batch_size=64, lr=2e-3, warmup_steps=10,
                                                     deterministic=False), eval_data=Scaled("test"))
    before = trainer.evaluate()["accuracy"]
    trainer.fit()
    assert trainer.evaluate()["accuracy"] > max(0.6, before + 0.3)


def test_resume_is_bitwise_equal_to_an_uninterrupted_run(tmp_path):
    train = Scaled("train")
    torch.manual_seed(0)
    straight = Trainer(digits_model(), train, config(), run_dir=tmp_path / "a")
    straight.fit()

    torch.manual_seed(0)
    first = Trainer(digits_model(), train, config(steps=12, checkpoint_every=5), run_dir=tmp_path / "b")
    first.cfg.steps = 7  # stop after step 7: the last checkpoint is step 5
    first.fit()
    torch.manual_seed(123)  # a fresh process would start from anything
    resumed = Trainer(digits_model(), train, config(checkpoint_every=5), run_dir=tmp_path / "b")
    resumed.resume()
    assert resumed.step == 5
    resumed.fit()
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_gradient_accumulation_equals_a_larger_batch():
    train = Scaled("train")
    torch.manual_seed(0)
    model = create_model("vit_digits_patch2", depth=1, embed_dim=32, num_heads=2)
    twin = create_model("vit_digits_patch2", depth=1, embed_dim=32, num_heads=2)
    twin.load_state_dict(model.state_dict())
    big = Trainer(model, train, config(steps=3, batch_size=32, grad_clip=None, warmup_steps=0))
    small = Trainer(twin, train, config(steps=3, batch_size=16, accum_steps=2, grad_clip=None, warmup_steps=0))

    # Same samples per step: the large batch's order split into halves.
    def halves():
        for idx in big.sampler.batches(0):
            for x, y, _, _ in read_batches(train, [(0, 0, idx[:16]), (0, 1, idx[16:])], workers=0):
                yield x, y
    batches = halves()
    for _ in range(3):
        small.train_step(batches)
    big.fit()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_ema_follows_the_weights():
    trainer = Trainer(digits_model(), Scaled("train"), config(steps=3, ema_decay=0.5))
    start = [p.clone() for p in trainer.ema.parameters()]
    trainer.fit()
    moved = [not torch.equal(a, b) for a, b in zip(start, trainer.ema.parameters())]
    assert any(moved)
    assert not any(e.requires_grad for e in trainer.ema.parameters())


def test_grad_checkpointing_needs_support():
    with pytest.raises(ValueError, match="grad_checkpointing: Linear has no set_grad_checkpointing"):
        Trainer(torch.nn.Linear(64, 10), Scaled("train"), config(grad_checkpointing=True))


class TokenBatches:
    """Toy text data with batched dict inputs: is token 5 in the (padded) sequence?"""

    def __init__(self, n=256, length=12, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 10, (n, length), generator=g)
        self.lengths = torch.randint(3, length + 1, (n,), generator=g)
        self.mask = torch.arange(length)[None, :] < self.lengths[:, None]
        self.ids[~self.mask] = 0
        self.labels = ((self.ids == 5) & self.mask).any(1).long()

    def __len__(self):
        return len(self.labels)

    def get_batch(self, idx):
        idx = torch.as_tensor(idx)
        return {"input_ids": self.ids[idx], "attention_mask": self.mask[idx]}, self.labels[idx]


class BagOfTokens(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 16)
        self.head = torch.nn.Linear(16, 2)

    def forward(self, input_ids, attention_mask):
        h = (self.emb(input_ids) * attention_mask[..., None]).amax(1)
        return self.head(h)


def test_dict_inputs_are_passed_by_name_and_learned():
    data = TokenBatches()
    trainer = Trainer(BagOfTokens(), data, config(steps=150, lr=3e-2, progress=False), eval_data=TokenBatches(seed=1))
    trainer.fit()
    assert trainer.evaluate()["accuracy"] > 0.95


class Jittered(Scaled):
    """Digits with random noise drawn from torch's global stream: random augmentation."""

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return x + 0.1 * torch.randn_like(x), y


def test_resume_with_loader_workers_is_exact_augmentation_included(tmp_path):
    train = Jittered("train")
    torch.manual_seed(0)
    straight = Trainer(digits_model(), train, config(workers=2), run_dir=tmp_path / "a")
    straight.fit()

    torch.manual_seed(0)
    first = Trainer(digits_model(), train, config(checkpoint_every=5, workers=2), run_dir=tmp_path / "b")
    first.cfg.steps = 7  # the workers have read ahead of step 7; the checkpoint at step 5 must not count that
    first.fit()
    torch.manual_seed(123)
    resumed = Trainer(digits_model(), train, config(checkpoint_every=5, workers=2), run_dir=tmp_path / "b")
    resumed.resume()
    assert (resumed.step, resumed.batch_in_epoch) == (5, 5)
    resumed.fit()
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_loader_workers_read_every_batch_once_in_order():
    train = Scaled("train")
    sampler = EpochSampler(len(train), 32, seed=0)
    items = [(0, b, idx) for b, idx in enumerate(sampler.batches(0))]
    here = [(x, y, b) for x, y, _, b in read_batches(train, items, workers=0)]
    there = [(x, y, b) for x, y, _, b in read_batches(train, items, workers=2)]
    assert [b for *_, b in there] == list(range(len(items)))
    for (x0, y0, _), (x1, y1, _) in zip(here, there):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)


def test_evaluation_does_not_depend_on_loader_workers():
    torch.manual_seed(0)
    model, test = digits_model(), Scaled("test")
    assert evaluate_model(model, test, batch_size=50, device="cpu", workers=2) == \
        evaluate_model(model, test, batch_size=50, device="cpu")
