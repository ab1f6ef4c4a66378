"""Mixup / CutMix on a batch: soft targets, the cutmix area correction, determinism."""

import pytest
import torch

from attnlab.data import Mixup, cutmix_box, one_hot

K = 10


def _batch(b=8, c=3, h=16, w=12):
    # Image i is the constant i + 1, label i: which image a pixel came from is readable.
    images = (torch.arange(b, dtype=torch.float32) + 1).view(b, 1, 1, 1).expand(b, c, h, w).contiguous()
    return images, torch.arange(b)


def test_one_hot_with_label_smoothing():
    t = one_hot(torch.tensor([2, 0]), 4, smoothing=0.2)
    assert torch.allclose(t[0], torch.tensor([0.05, 0.05, 0.85, 0.05]))
    assert torch.allclose(t.sum(1), torch.ones(2))


@pytest.mark.parametrize("kwargs", [{}, {"alpha": 0.0}, {"cutmix_alpha": 0.0}, {"label_smoothing": 0.1}])
def test_soft_targets_sum_to_one(kwargs):
    images, labels = _batch()
    mix = Mixup(num_classes=K, **kwargs)
    for _ in range(10):
        mixed, targets = mix(images, labels)
        assert mixed.shape == images.shape and targets.shape == (8, K)
        assert torch.allclose(targets.sum(1), torch.ones(8))
        assert float(targets.min()) >= 0


def test_cutmix_lambda_equals_the_share_of_unpasted_pixels():
    images, labels = _batch()
    mix = Mixup(alpha=0.0, cutmix_alpha=1.0, num_classes=K)
    checked = 0
    for seed in range(20):
        torch.manual_seed(seed)
        mixed, targets = mix(images, labels)
        for i in range(8):
            pasted = mixed[i, 0] != images[i, 0]
            if not pasted.any():
                continue
            partner = int(mixed[i, 0][pasted][0]) - 1
            area = float(pasted.float().mean())
            # Only the partner's constant appears inside the box, and the box is a rectangle.
            assert torch.all(mixed[i, 0][pasted] == partner + 1)
            rows, cols = pasted.any(1).nonzero(), pasted.any(0).nonzero()
            assert int(pasted.sum()) == len(rows) * len(cols)
            assert targets[i, i].item() == pytest.approx(1 - area)
            assert targets[i, partner].item() == pytest.approx(area)
            assert mix.last_lam == pytest.approx(1 - area)
            checked += 1
    assert checked > 20


def test_mixup_blends_pixels_in_the_target_proportion():
    images, labels = _batch()
    values = torch.arange(K, dtype=torch.float32) + 1  # label k <-> pixel value k + 1
    mix = Mixup(alpha=0.8, cutmix_alpha=0.0, num_classes=K)
    for seed in range(5):
        torch.manual_seed(seed)
        mixed, targets = mix(images, labels)
        expected = targets @ values  # (B,): each image's blend of constants
        assert torch.allclose(mixed, expected.view(-1, 1, 1, 1).expand_as(mixed), atol=1e-5)
        own = targets[torch.arange(8), labels]
        lam = mix.last_lam
        assert 0 < lam < 1
        assert torch.all(torch.isclose(own, torch.tensor(lam)) | torch.isclose(own, torch.tensor(1.0)))
        assert torch.isclose(own, torch.tensor(lam)).any()


def test_prob_zero_returns_inputs_with_plain_targets():
    images, labels = _batch()
    mixed, targets = Mixup(prob=0.0, label_smoothing=0.1, num_classes=K)(images, labels)
    assert torch.equal(mixed, images)
    assert torch.allclose(targets, one_hot(labels, K, 0.1))


def test_inputs_are_not_modified():
    images, labels = _batch()
    before = images.clone()
    for kwargs in ({"alpha": 0.0}, {"cutmix_alpha": 0.0}):
        Mixup(num_classes=K, **kwargs)(images, labels)
    assert torch.equal(images, before)


def test_mixing_is_reproducible_under_a_seed():
    images, labels = torch.rand(8, 3, 8, 8), torch.randint(0, K, (8,))
    mix = Mixup(num_classes=K)
    torch.manual_seed(3)
    a = mix(images, labels)
    torch.manual_seed(3)
    b = mix(images, labels)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_cutmix_box_is_clipped_inside_the_image():
    for seed in range(50):
        torch.manual_seed(seed)
        top, bottom, left, right = cutmix_box(0.3, 10, 7)
        assert 0 <= top <= bottom <= 10 and 0 <= left <= right <= 7
    torch.manual_seed(0)
    top, bottom, left, right = cutmix_box(0.0, 10, 7)  # lam 0: the box is the whole image, before clipping
    assert (bottom - top, right - left) != (0, 0)


@pytest.mark.parametrize(
    "images, labels, match",
    [
        (torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.zeros(4, dtype=torch.long), "floating batch"),
        (torch.zeros(3, 8, 8), torch.zeros(3, dtype=torch.long), "floating batch"),
        (torch.zeros(4, 3, 8, 8), torch.zeros(5, dtype=torch.long), r"shape \(4,\)"),
        (torch.zeros(4, 3, 8, 8), torch.full((4,), K), r"labels must lie in \[0, 10\)"),
    ],
)
def test_bad_inputs_are_rejected(images, labels, match):
    with pytest.raises(ValueError, match=match):
        Mixup(num_classes=K)(images, labels)


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="nothing to mix"):
        Mixup(alpha=0.0, cutmix_alpha=0.0, num_classes=K)
    with pytest.raises(ValueError, match="prob must be in"):
        Mixup(prob=1.5, num_classes=K)
