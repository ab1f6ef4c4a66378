import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def reference_attention(q, k, v, blocked=None, additive=None, scale=None):
    """Plain softmax attention in float64, written independently of attnlab.

    ``blocked``: bool, True = may not attend. Rows with no allowed key give zeros.
    """
    q, k, v = q.double(), k.double(), v.double()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = q @ k.transpose(-2, -1) * scale
    allowed = torch.ones_like(logits, dtype=torch.bool)
    if blocked is not None:
        allowed = allowed & ~blocked
    if additive is not None:
        logits = logits + additive.double()
        allowed = allowed & (additive != float("-inf"))
    logits = logits.masked_fill(~allowed, float("-inf"))
    m = logits.amax(-1, keepdim=True).clamp_min(-1e300)
    e = torch.exp(logits - m) * allowed
    s = e.sum(-1, keepdim=True)
    w = torch.where(s > 0, e / s.clamp_min(1e-300), torch.zeros_like(e))
    return w @ v, w
