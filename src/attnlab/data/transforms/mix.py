"""Mixup (Zhang et al., 2018) and CutMix (Yun et al., 2019) on a batch.

Both pair each image with another one of the same batch (a random permutation) and
mix the one-hot targets in the proportion the images were mixed:

* mixup: ``x = lam * x_i + (1 - lam) * x_j``, ``lam ~ Beta(alpha, alpha)``;
* cutmix: a box of ``x_j`` is pasted into ``x_i``; the box covers about ``1 - lam`` of
  the image, ``lam ~ Beta(cutmix_alpha, cutmix_alpha)``, and ``lam`` is then corrected
  to the exact share of ``x_i``'s pixels left once the box is clipped to the image.

One ``lam`` and one box per batch. All randomness comes from torch's generator.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...errors import InputError

__all__ = ["Mixup", "one_hot", "cutmix_box"]


def one_hot(labels: Tensor, num_classes: int, smoothing: float = 0.0) -> Tensor:
    """``(B,)`` int labels -> ``(B, num_classes)`` float targets with label smoothing:
    ``1 - smoothing + smoothing / K`` on the label, ``smoothing / K`` elsewhere."""
    off = smoothing / num_classes
    out = torch.full((labels.shape[0], num_classes), off, device=labels.device)
    return out.scatter_(1, labels.long().view(-1, 1), 1.0 - smoothing + off)


def cutmix_box(lam: float, height: int, width: int) -> tuple[int, int, int, int]:
    """A random box ``(top, bottom, left, right)`` (bottom/right exclusive) whose
    unclipped area is ``(1 - lam)`` of the image, centred uniformly, clipped to it."""
    ratio = math.sqrt(1.0 - lam)
    cut_h, cut_w = int(height * ratio), int(width * ratio)
    cy = int(torch.randint(height, ()))
    cx = int(torch.randint(width, ()))
    top, bottom = max(cy - cut_h // 2, 0), min(cy + cut_h - cut_h // 2, height)
    left, right = max(cx - cut_w // 2, 0), min(cx + cut_w - cut_w // 2, width)
    return top, bottom, left, right


class Mixup:
    """Mix a batch with mixup or cutmix and return soft targets.

    Args:
        alpha: Beta parameter of mixup; 0 disables mixup.
        cutmix_alpha: Beta parameter of cutmix; 0 disables cutmix.
        prob: probability of mixing a given batch at all (else only label smoothing).
        switch_prob: with both enabled, probability of cutmix rather than mixup.
        label_smoothing: smoothing of the one-hot targets before mixing.
        num_classes: number of classes ``K`` (keyword, required).

    Call: ``images (B, C, H, W)`` floating, ``labels (B,)`` ints in ``[0, K)`` ->
    ``(mixed images (B, C, H, W), targets (B, K))``; each target row sums to 1. Inputs
    are not modified. Use a soft-target loss, e.g. ``F.cross_entropy(logits, targets)``.
    ``last_lam`` holds the mixing weight of the latest call (1.0 when not mixed).
    """

    def __init__(
        self,
        alpha: float = 0.8,
        cutmix_alpha: float = 1.0,
        prob: float = 1.0,
        switch_prob: float = 0.5,
        label_smoothing: float = 0.0,
        *,
        num_classes: int,
    ) -> None:
        if alpha < 0 or cutmix_alpha < 0:
            raise InputError(f"alpha and cutmix_alpha must be >= 0; got {alpha} and {cutmix_alpha}")
        if alpha == 0 and cutmix_alpha == 0:
            raise InputError("alpha or cutmix_alpha must be > 0; got both 0 (nothing to mix)")
        for name, value in (("prob", prob), ("switch_prob", switch_prob), ("label_smoothing", label_smoothing)):
            if not 0.0 <= value <= 1.0:
                raise InputError(f"{name} must be in [0, 1]; got {value!r}")
        if not isinstance(num_classes, int) or num_classes < 2:
            raise InputError(f"num_classes must be an int >= 2; got {num_classes!r}")
        self.alpha, self.cutmix_alpha = float(alpha), float(cutmix_alpha)
        self.prob, self.switch_prob = prob, switch_prob
        self.label_smoothing, self.num_classes = label_smoothing, num_classes
        self.last_lam = 1.0

    def _beta(self, a: float) -> float:
        return float(torch.distributions.Beta(torch.tensor(a), torch.tensor(a)).sample())

    def __call__(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        if images.dim() != 4 or not images.is_floating_point():
            raise InputError(
                f"images must be a floating batch (B, C, H, W); got {images.dtype} of shape {tuple(images.shape)}"
            )
        if labels.dim() != 1 or labels.shape[0] != images.shape[0] or labels.is_floating_point():
            raise InputError(
                f"labels must be integer class indices of shape ({images.shape[0]},); "
                f"got {labels.dtype} of shape {tuple(labels.shape)}"
            )
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
            raise InputError(
                f"labels must lie in [0, {self.num_classes}); got values in [{int(labels.min())}, {int(labels.max())}]"
            )
        targets = one_hot(labels, self.num_classes, self.label_smoothing).to(images.dtype)
        self.last_lam = 1.0
        if images.shape[0] < 2 or float(torch.rand(())) >= self.prob:
            return images, targets

        use_cutmix = self.cutmix_alpha > 0 and (self.alpha == 0 or float(torch.rand(())) < self.switch_prob)
        perm = torch.randperm(images.shape[0], device=images.device)
        if use_cutmix:
            lam = self._beta(self.cutmix_alpha)
            h, w = images.shape[-2:]
            top, bottom, left, right = cutmix_box(lam, h, w)
            mixed = images.clone()
            mixed[:, :, top:bottom, left:right] = images[perm, :, top:bottom, left:right]
            lam = 1.0 - (bottom - top) * (right - left) / (h * w)
        else:
            lam = self._beta(self.alpha)
            mixed = images * lam + images[perm] * (1.0 - lam)
        self.last_lam = lam
        return mixed, targets * lam + targets[perm] * (1.0 - lam)

    def __repr__(self) -> str:
        return (
            f"Mixup(alpha={self.alpha}, cutmix_alpha={self.cutmix_alpha}, prob={self.prob}, "
            f"switch_prob={self.switch_prob}, label_smoothing={self.label_smoothing}, num_classes={self.num_classes})"
        )
