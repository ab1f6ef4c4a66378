"""The gated delta rule (Yang, Kautz and Hatamizadeh, 2024, "Gated Delta Networks"), the
linear-attention layer of Qwen3.5 and Qwen3-Next: attention as a recurrent state that is
corrected, not only added to.

Each value head keeps a state ``S`` (``Dk x Dv``), a memory from keys to values. At each token,
with ``q``, ``k`` L2-normalized, a decay ``a = exp(g)`` in (0, 1) and a write strength
``beta`` in (0, 1)::

    S = a S                                   forget a little
    S = S + beta k (v - S^T k)^T              write the part of v that S does not yet give for k
    o = S^T q / sqrt(Dk)

The delta rule's write moves ``S^T k`` a step ``beta`` towards ``v`` (one step of gradient
descent on ``|S^T k - v|^2``), so a key already stored is overwritten rather than piled up;
the gate ``a`` lets the state forget. The state has a fixed size whatever the length: the cache
of a decoder is ``S`` and the last ``conv_size - 1`` inputs of the short causal convolution
that precedes the projections, constant memory.

Training runs the same recurrence a chunk of ``chunk_size`` tokens at a time (:func:`chunked`):
within a chunk the writes ``delta_i = beta_i (v_i - ...)`` depend on each other through a
unit lower-triangular system ``(I + A) Delta = beta (V - Gamma K S0)`` with
``A_ij = beta_i (Gamma_i / Gamma_j) k_i . k_j`` (``j < i``, ``Gamma`` the chunk's cumulative
decay), solved at once; then ``O = Gamma Q S0 + (M o Q K^T) Delta`` and the state moves to the
chunk's end. :func:`recurrent` is the token-by-token form; the two are equal (tested).

The layer (:class:`GatedDeltaNet`) has Qwen3.5's parameter names and computation: one
projection to ``q, k, v``, a depthwise causal convolution with SiLU, the decay from
``A_log``, ``dt_bias`` and a projection ``a``, ``beta`` from a projection ``b``, and the output
normalized per head and gated by SiLU of a projection ``z`` before ``out_proj``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InputError, shape_str
from .contract import Option, Options
from .functional import check_positive_int
from .joined import KeepsJoinedWeights, joined_weight, product
from .registry import register_attention

__all__ = ["GatedDeltaNet", "RecurrentCache", "chunked", "recurrent"]


def _l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor | None = None,
              ) -> tuple[Tensor, Tensor]:
    """The gated delta rule token by token. ``q``, ``k`` ``(B, H, L, Dk)`` (normalized, ``q``
    scaled), ``v`` ``(B, H, L, Dv)``, ``g`` (log decay) and ``beta`` ``(B, H, L)``, ``state``
    ``(B, H, Dk, Dv)`` or None (zeros). Returns ``(out (B, H, L, Dv), final state)``, float32."""
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    b, h, n, dk = k.shape
    s = q.new_zeros(b, h, dk, v.shape[-1]) if state is None else state.float()
    out = []
    for t in range(n):
        s = s * g[:, :, t, None, None].exp()
        kt = k[:, :, t]
        delta = (v[:, :, t] - (s * kt[..., None]).sum(-2)) * beta[:, :, t, None]
        s = s + kt[..., None] * delta[..., None, :]
        out.append((s * q[:, :, t, :, None]).sum(-2))
    return torch.stack(out, 2) if out else v.new_zeros(b, h, 0, v.shape[-1]), s


def chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor | None = None,
            chunk_size: int = 64) -> tuple[Tensor, Tensor]:
    """The gated delta rule a chunk at a time (see the module docstring); the arguments and the
    result as :func:`recurrent`'s."""
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    b, h, n, dk = k.shape
    dv = v.shape[-1]
    s = q.new_zeros(b, h, dk, dv) if state is None else state.float()
    if n == 0:
        return v.new_zeros(b, h, 0, dv), s
    c = min(chunk_size, n)
    pad = (-n) % c
    if pad:  # zero keys, values and decays after the end change neither the outputs nor the state
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    m = (n + pad) // c
    q, k, v = (t.reshape(b, h, m, c, t.shape[-1]) for t in (q, k, v))
    g, beta = g.reshape(b, h, m, c), beta.reshape(b, h, m, c)
    gamma = g.cumsum(-1)  # log of the decay from the chunk's start to each position
    lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()  # j <= i
    ratio = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # Gamma_i / Gamma_j
    kb = k * beta[..., None]
    system = (kb @ k.transpose(-1, -2)) * ratio  # beta_i (Gamma_i / Gamma_j) k_i . k_j, j <= i
    system = system.masked_fill(lower.logical_not().logical_or(torch.eye(c, dtype=torch.bool, device=q.device)), 0.0)
    eye = torch.eye(c, device=q.device, dtype=system.dtype)
    u = torch.linalg.solve_triangular(eye + system, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(eye + system, kb * gamma.exp()[..., None], upper=False, unitriangular=True)
    scores = (q @ k.transpose(-1, -2)) * ratio  # (q_i . k_j) Gamma_i / Gamma_j, j <= i
    q_decayed = q * gamma.exp()[..., None]
    k_to_end = k * (gamma[..., -1:] - gamma).exp()[..., None]
    end_decay = gamma[..., -1].exp()[..., None, None]
    # The chunks one by one through unbind, not t[:, :, i]: the backward of an index writes its
    # gradient into zeros of the whole tensor, once per chunk, which is quadratic in n; unbind's
    # stacks the chunks' gradients once.
    chunks = zip(*(t.unbind(2) for t in (u, w, q_decayed, scores, k_to_end, end_decay)))
    out = []
    for u_i, w_i, q_i, scores_i, k_i, decay_i in chunks:
        delta = u_i - w_i @ s
        out.append(q_i @ s + scores_i @ delta)
        s = s * decay_i + k_i.transpose(-1, -2) @ delta
    return torch.cat(out, 2)[:, :, :n], s


def _autocast_state(kind: str) -> tuple[str, bool, torch.dtype]:
    """``(device type, autocast on, its dtype)`` now, to run a recomputation as the forward ran."""
    try:
        return kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)
    except TypeError:  # torch before 2.4: one call per device type
        if kind == "cpu":
            return kind, torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
        return kind, torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()


class _Segments(torch.autograd.Function):
    """A gated delta layer over a long ``x`` a segment at a time: the forward keeps only the
    output (written into one tensor) and, for each segment, the convolution's last inputs and
    the state it starts from; the backward runs the segments again from the last, each with its
    gradient, passing the gradients of the convolution's inputs and of the state back to the
    segment before. Memory: one segment's steps, whatever the length."""

    @staticmethod
    def forward(ctx, layer: "GatedDeltaNet", x: Tensor, *params: Tensor) -> Tensor:  # type: ignore[override]
        size = layer.SEGMENT
        out = None
        starts: list[tuple[Tensor | None, Tensor | None]] = []
        past = state = None
        with torch.no_grad():
            for i, part in enumerate(x.split(size, dim=1)):
                starts.append((past, state))
                y, past, state = layer._run(part, past, state)
                if out is None:
                    out = y.new_empty(x.shape[0], x.shape[1], y.shape[-1])
                out[:, i * size: i * size + part.shape[1]] = y
        ctx.layer, ctx.starts, ctx.params, ctx.autocast = layer, starts, params, _autocast_state(x.device.type)
        ctx.save_for_backward(x)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        layer, starts, params = ctx.layer, ctx.starts, ctx.params
        size = layer.SEGMENT
        gx = torch.empty_like(x)
        gparams = [torch.zeros_like(p) for p in params]
        g_past = g_state = None  # the gradients the next segment sent back
        for i in reversed(range(len(starts))):
            span = slice(i * size, min(x.shape[1], (i + 1) * size))
            past, state = (None if t is None else t.detach().requires_grad_() for t in starts[i])
            part = x[:, span].detach().requires_grad_()
            kind, enabled, dtype = ctx.autocast
            with torch.enable_grad(), torch.autocast(kind, dtype=dtype, enabled=enabled):  # as the forward ran
                y, past_out, state_out = layer._run(part, past, state)
            outputs, grads = [y], [grad[:, span]]
            for t, g in ((past_out, g_past), (state_out, g_state)):
                if g is not None:
                    outputs.append(t)
                    grads.append(g)
            wrt = [part, *(t for t in (past, state) if t is not None), *params]
            found = torch.autograd.grad(outputs, wrt, grads, allow_unused=True)
            gx[:, span] = found[0]
            rest = list(found[1:])
            g_past = rest.pop(0) if past is not None else None
            g_state = rest.pop(0) if state is not None else None
            for total, g in zip(gparams, rest):
                if g is not None:
                    total += g
        return None, gx, *gparams


class RecurrentCache:
    """A gated delta layer's cache while a decoder generates: the recurrent ``state`` ``(B, H, Dk,
    Dv)`` (float32) and ``conv``, the last ``conv_size - 1`` inputs of the convolution ``(B, C,
    conv_size - 1)``. Its size does not grow with the positions."""

    def __init__(self) -> None:
        self.state: Tensor | None = None
        self.conv: Tensor | None = None
        self.seq_len = 0
        self.scratch: dict = {}

    def nbytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in (self.state, self.conv) if t is not None)

    def reorder(self, index: Tensor) -> None:
        self.state = None if self.state is None else self.state.index_select(0, index)
        self.conv = None if self.conv is None else self.conv.index_select(0, index)

    def __repr__(self) -> str:
        return f"RecurrentCache(seen={self.seq_len}, bytes={self.nbytes()})"



GATED_DELTA_OPTIONS = Options(
    Option("dropout", float, 0.0, "taken for the common signature; the layer forms no weights to drop", low=0, high=1,
           high_open=True),
    Option("bias", bool, False, "biases of the projections (Qwen3.5 has none)"),
    Option("num_key_heads", int, None, "query/key heads, each serving num_heads / num_key_heads value heads "
           "(None: num_heads)", low=1),
    Option("head_dim", int, None, "the query/key size (None: embed_dim / num_heads)", low=1),
    Option("v_head_dim", int, None, "the value size (None: head_dim)", low=1),
    Option("conv_size", int, 4, "the causal convolution's width (1: a per-channel scale)", low=1),
    Option("chunk_size", int, 64, "tokens a chunk in training and on prompts", low=1),
    Option("norm_eps", float, 1e-6, "the output norm's eps (the decoder gives its own)", low=0, low_open=True,
           from_model="norm_eps"),
)


# positions: taken and left unused (a recurrent state has its order), so that a decoder with rotary layers can mix it in.
@register_attention("gated_delta", options=GATED_DELTA_OPTIONS, keeps_cache=True, decode_step=True,
                    takes_positions=True, causal=True, padding=True, causal_only=True, lora_roles=("attention",),
                    summary="the gated delta rule (Gated DeltaNet): a recurrent state, linear in time")
class GatedDeltaNet(KeepsJoinedWeights, nn.Module):
    """The gated delta rule layer (see the module docstring).

    Args:
        embed_dim: ``E``.
        num_heads: value heads ``H`` (each keeps a state).
        num_key_heads: query/key heads (default ``H``; each serves ``H / num_key_heads`` value
            heads, Qwen3.5's grouping).
        head_dim: the query/key size ``Dk`` (default ``E / H``).
        v_head_dim: the value size ``Dv`` (default ``head_dim``).
        conv_size: the causal convolution's width (4; 1 leaves it a per-channel scale).
        chunk_size: tokens a chunk in training and on prompts (64).
        norm_eps: the output norm's eps.
        bias: biases of the projections (Qwen3.5 has none).
        dropout: taken for the registry's common signature; the layer forms no attention
            weights to drop.

    Causal only: a state sees the past. ``key_padding_mask`` zeroes the padded inputs (a
    left-padded prompt leaves the state at zero until its first token); ``attn_mask`` is
    refused.
    """

    def __init__(self, embed_dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = False,
                 num_key_heads: int | None = None, head_dim: int | None = None, v_head_dim: int | None = None,
                 conv_size: int = 4, chunk_size: int = 64, norm_eps: float = 1e-6) -> None:
        super().__init__()
        check_positive_int("embed_dim", embed_dim)
        check_positive_int("num_heads", num_heads)
        if head_dim is None:
            if embed_dim % num_heads:
                raise InputError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads}), or head_dim "
                                 f"given")
            head_dim = embed_dim // num_heads
        kh = check_positive_int("num_key_heads", num_heads if num_key_heads is None else num_key_heads)
        if num_heads % kh:
            raise InputError(f"num_key_heads must divide num_heads={num_heads}; got {num_key_heads!r}")
        self.embed_dim, self.num_heads, self.num_key_heads = embed_dim, num_heads, kh
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.v_head_dim = check_positive_int("v_head_dim", head_dim if v_head_dim is None else v_head_dim)
        self.conv_size, self.chunk_size = check_positive_int("conv_size", conv_size), check_positive_int("chunk_size", chunk_size)
        key_dim, value_dim = kh * self.head_dim, num_heads * self.v_head_dim
        self.conv_dim = 2 * key_dim + value_dim
        self.in_proj_qkv = nn.Linear(embed_dim, self.conv_dim, bias=bias)
        self.in_proj_z = nn.Linear(embed_dim, value_dim, bias=bias)
        self.in_proj_b = nn.Linear(embed_dim, num_heads, bias=bias)
        self.in_proj_a = nn.Linear(embed_dim, num_heads, bias=bias)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv_size, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(num_heads))
        self.A_log = nn.Parameter(torch.log(torch.empty(num_heads).uniform_(1.0, 16.0)))  # decay rates, as Mamba2's
        self.norm_weight = nn.Parameter(torch.ones(self.v_head_dim))
        self.norm_eps = float(norm_eps)
        self.out_proj = nn.Linear(value_dim, embed_dim, bias=bias)

    # ------------------------------------------------------------------ the cache (the decoder contract)
    def new_cache(self, batch: int, capacity: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> RecurrentCache:
        return RecurrentCache()

    def cache_bytes(self, batch: int, positions: int, dtype: torch.dtype) -> int:
        """The state (float32) and the convolution's last inputs, whatever ``positions``."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return batch * (self.num_heads * self.head_dim * self.v_head_dim * 4
                        + self.conv_dim * (self.conv_size - 1) * itemsize)

    # ------------------------------------------------------------------ forward
    def forward(self, x: Tensor, *, key_padding_mask: Tensor | None = None, attn_mask: Tensor | None = None,
                is_causal: bool = False, need_weights: bool = False, average_attn_weights: bool = True,
                positions: Tensor | None = None, cache: RecurrentCache | None = None,
                ) -> tuple[Tensor, Tensor | None]:
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise InputError(f"x must have shape (B, L, {self.embed_dim}); got {shape_str(x)}")
        if not is_causal:
            raise InputError("gated_delta attention is causal only (its state holds the past): use it in a decoder "
                             "(is_causal=True)")
        if attn_mask is not None:
            raise InputError("gated_delta attention takes no attn_mask (a state has no pairs of positions to mask); "
                             "pad with key_padding_mask")
        if need_weights:
            raise InputError("gated_delta attention forms no attention weights (it keeps a state, not a map)")
        batch, n, _ = x.shape
        if n == 0 or batch == 0:
            return self.out_proj(self.in_proj_z(x)), None  # empty: nothing to attend (still a function of x)
        if key_padding_mask is not None:
            if key_padding_mask.dim() != 2 or key_padding_mask.shape[0] != batch or key_padding_mask.shape[1] < n:
                raise InputError(f"key_padding_mask must have shape (B, L) = ({batch}, {n}) or cover the cached "
                                 f"positions too; got {shape_str(key_padding_mask)}")
            x = x.masked_fill(key_padding_mask[:, -n:, None], 0.0)
        if cache is None and torch.is_grad_enabled() and n > self.SEGMENT_FROM:
            # Training at length: the layer a segment at a time, each recomputed in the backward from its
            # input, the convolution's last inputs and the state it starts from (:class:`_Segments`). Kept whole, the chunks'
            # products and the projections grow the peak with the length, several times exact attention's; in
            # segments it stays near it for about the same time (torch's checkpoint per segment keeps each
            # segment's output apart, and the heap its freed steps between them: about twice the memory).
            # Below SEGMENT_FROM positions the whole is cheaper and small enough.
            params = tuple(p for p in self.parameters() if p.requires_grad)
            return _Segments.apply(self, x, *params), None
        past = None if cache is None else cache.conv
        out, conv, state = self._run(x, past, None if cache is None else cache.state)
        if cache is not None:  # a copy: a view would hold the whole of the convolution's input
            cache.conv, cache.state, cache.seq_len = conv.detach().clone(), state.detach(), cache.seq_len + n
        return out, None

    # Positions a segment of the layer holds in training at length (4 chunks of 64), and the length
    # from which training takes segments.
    SEGMENT, SEGMENT_FROM = 256, 4096

    def _run(self, x: Tensor, past: Tensor | None, state: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """The layer on ``x`` ``(B, L, E)`` after the convolution's last inputs ``past`` ``(B, C,
        conv_size - 1)`` and from ``state`` (None: zeros): ``(output (B, L, E), the convolution's
        last inputs, the state)``."""
        batch, n, _ = x.shape
        h, kh, dk, dv = self.num_heads, self.num_key_heads, self.head_dim, self.v_head_dim
        mixed = self.in_proj_qkv(x).transpose(1, 2)  # (B, C, L)
        if past is None:
            past = mixed.new_zeros(batch, self.conv_dim, self.conv_size - 1)
        joined = torch.cat([past, mixed], dim=-1)
        conv = joined[:, :, joined.shape[-1] - (self.conv_size - 1):]
        mixed = F.silu(F.conv1d(joined, self.conv1d.weight, groups=self.conv_dim)).transpose(1, 2)  # (B, L, C)
        q, k, v = mixed.split([kh * dk, kh * dk, h * dv], dim=-1)
        q, k = _l2norm(q.reshape(batch, n, kh, dk)), _l2norm(k.reshape(batch, n, kh, dk))
        if kh != h:  # each query/key head serves h / kh value heads
            q, k = q.repeat_interleave(h // kh, dim=2), k.repeat_interleave(h // kh, dim=2)
        q = q * dk ** -0.5
        v = v.reshape(batch, n, h, dv)
        beta = torch.sigmoid(self.in_proj_b(x))
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        args = [t.transpose(1, 2) for t in (q, k, v, g, beta)]
        if n == 1 and state is not None:
            out, state = recurrent(*args, state)
        else:
            out, state = chunked(*args, state, chunk_size=self.chunk_size)
        out = out.transpose(1, 2)  # (B, L, H, Dv), float32
        z = self.in_proj_z(x).reshape(batch, n, h, dv)
        normed = F.rms_norm(out, (dv,), None, self.norm_eps) if hasattr(F, "rms_norm") else \
            out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        out = (self.norm_weight * normed.to(x.dtype)) * F.silu(z.float())
        return self.out_proj(out.to(x.dtype).reshape(batch, n, h * dv)), conv, state

    def decode_step(self, x: Tensor, cache: RecurrentCache, *, positions: Tensor | None = None,
                    key_padding_mask: Tensor | None = None) -> Tensor:
        """One token per row, ``x`` ``(B, E)`` -> ``(B, E)``, in eval mode: :meth:`forward`'s
        recurrent form for one token without its checks, reshapes and transposes: the four input
        projections as one product with their weights joined once per generation, the
        convolution as a weighted sum over the kept inputs, and one step of the state."""
        if cache.state is None:  # nothing seen yet: the forward makes the state and the convolution's inputs
            return self(x[:, None], key_padding_mask=key_padding_mask, is_causal=True, cache=cache)[0][:, 0]
        if key_padding_mask is not None:
            x = x.masked_fill(key_padding_mask[:, -1:], 0.0)
        batch = x.shape[0]
        h, kh, dk, dv = self.num_heads, self.num_key_heads, self.head_dim, self.v_head_dim
        w_in, b_in = joined_weight(self, "in", (self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a))
        mixed, z, b, a = product(x, w_in, b_in).split([self.conv_dim, h * dv, h, h], dim=-1)
        joined = torch.cat([cache.conv, mixed[:, :, None]], dim=-1)  # (B, C, conv_size)
        cache.conv = joined[:, :, 1:].contiguous()  # a copy: a view would keep the whole of joined
        mixed = F.silu((joined * self.conv1d.weight[:, 0]).sum(-1))  # (B, C)
        q, k, v = mixed.split([kh * dk, kh * dk, h * dv], dim=-1)
        q, k = _l2norm(q.view(batch, kh, dk).float()), _l2norm(k.view(batch, kh, dk).float())
        if kh != h:
            q, k = q.repeat_interleave(h // kh, dim=1), k.repeat_interleave(h // kh, dim=1)
        q = q * dk ** -0.5
        beta = torch.sigmoid(b.float())  # (B, H)
        decay = torch.exp(-self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias))
        s = cache.state * decay[:, :, None, None]  # (B, H, Dk, Dv)
        delta = (v.view(batch, h, dv).float() - torch.einsum("bhkv,bhk->bhv", s, k)) * beta[..., None]
        s = s + k[..., None] * delta[:, :, None, :]
        cache.state, cache.seq_len = s, cache.seq_len + 1
        out = torch.einsum("bhkv,bhk->bhv", s, q)  # (B, H, Dv)
        normed = F.rms_norm(out, (dv,), None, self.norm_eps) if hasattr(F, "rms_norm") else \
            out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        out = (self.norm_weight * normed.to(x.dtype)) * F.silu(z.view(batch, h, dv).float())
        return product(out.to(x.dtype).reshape(batch, h * dv), *joined_weight(self, "out", (self.out_proj,)))

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_key_heads={self.num_key_heads}, "
                f"head_dim={self.head_dim}, v_head_dim={self.v_head_dim}, conv_size={self.conv_size}")
