"""The exercises' solutions, written the way the tutorials teach them: plain torch, a few
lines each, with the shapes in comments.

``attnlab.exercises.solution(name)`` shows one. Where attnlab has the function, an
exercise is checked against attnlab's own (see :mod:`attnlab.exercises.catalog`), so a
solution that passes its check also shows that the library computes what the tutorial
teaches. They live apart from the checking machinery, so that a learner who reads the
checker does not read the answers by accident.
"""

import math

import torch
import torch.nn.functional as F

# ----------------------------------------------------------------------------- attention


def masked_attention(q, k, v, mask):
    """softmax(q kᵀ / √d) v with a boolean mask (True = blocked); a query whose keys are all
    blocked gets zero weights and a zero output, as attnlab's scaled_dot_product_attention."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])        # (..., Lq, Lk)
    scores = scores.masked_fill(mask, float("-inf"))
    dead = mask.all(dim=-1, keepdim=True)                              # queries that may see no key
    weights = scores.masked_fill(dead, 0.0).softmax(dim=-1)            # a finite row instead of 0/0
    weights = weights.masked_fill(dead, 0.0)                           # ... then zeroed
    return weights @ v, weights                                        # (..., Lq, Dv), (..., Lq, Lk)


def split_heads(x, num_heads):
    """(B, L, E) -> (B, H, L, D): the features cut into H heads of D = E / H."""
    B, L, E = x.shape
    return x.view(B, L, num_heads, E // num_heads).transpose(1, 2)    # (B, L, H, D) -> (B, H, L, D)


def merge_heads(x):
    """(B, H, L, D) -> (B, L, H·D): the heads side by side again, head 0 first."""
    B, H, L, D = x.shape
    return x.transpose(1, 2).reshape(B, L, H * D)                      # (B, L, H, D) -> (B, L, E)


def causal_mask(lq, lk):
    """(Lq, Lk) bool, True = blocked: query i sees key j when j <= i + (Lk - Lq) (bottom-right)."""
    i = torch.arange(lq)[:, None]                                      # (Lq, 1)
    j = torch.arange(lk)[None, :]                                      # (1, Lk)
    return j > i + (lk - lq)


# ----------------------------------------------------------------------------- norms


def layer_norm(x, weight, bias, eps=1e-5):
    """Each token normalized over its E features, then scaled and shifted: (..., E)."""
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, unbiased=False, keepdim=True)                  # divides by E, not E - 1
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def token_batch_norm(x, padding_mask, weight, bias, eps=1e-5):
    """Each feature normalized over the batch and the positions, padding left out: (B, L, E)."""
    real = x[~padding_mask]                                            # (number of real tokens, E)
    mean = real.mean(dim=0)                                            # (E,)
    var = real.var(dim=0, unbiased=False)
    out = (x - mean) / torch.sqrt(var + eps) * weight + bias
    return out.masked_fill(padding_mask[..., None], 0.0)               # padded tokens output zeros


def rms_norm(x, weight, eps=1e-6):
    """x / rms(x) · weight over the last axis; no mean is subtracted, there is no bias."""
    rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return x / rms * weight


def sublayer(x, f, norm, norm_first):
    """One residual sub-layer: pre-norm x + f(norm(x)), or post-norm norm(x + f(x))."""
    if norm_first:
        return x + f(norm(x))
    return norm(x + f(x))


# ----------------------------------------------------------------------------- transformer


def sinusoid_table(length, dim):
    """(length, dim): sin on the even features, cos on the odd ones, at 10000^(-2i/dim)."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]                   # (L, 1)
    freq = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)    # (dim/2,)
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table


def decoder_mask(tgt_ids, pad_id):
    """(B, 1, Lt, Lt) bool, True = blocked: the future keys and the padded keys."""
    L = tgt_ids.shape[1]
    future = torch.ones(L, L, dtype=torch.bool).triu(1)                # key j after query i
    padding = tgt_ids == pad_id                                        # (B, Lt): padded keys
    return future[None, None] | padding[:, None, None, :]             # broadcast to (B, 1, Lt, Lt)


def padded_loss(logits, targets, pad_id):
    """The mean cross-entropy over the target tokens that are not padding: a 0-dim tensor."""
    log_probs = logits.log_softmax(dim=-1)                                     # (B, L, V)
    picked = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)           # (B, L)
    real = targets != pad_id
    return -picked[real].mean()


def greedy_step(logits, finished, eos_id, pad_id):
    """The arg-max token of each row, pad_id for the rows that have ended; the rows ended after it."""
    next_tokens = logits.argmax(dim=-1)                                        # (B,)
    next_tokens = torch.where(finished, torch.full_like(next_tokens, pad_id), next_tokens)
    return next_tokens, finished | (next_tokens == eos_id)


# ----------------------------------------------------------------------------- vit


def patchify(images, p):
    """(B, C, H, W) -> (B, N, C·p·p): the p x p patches row by row, each flattened as (C, p, p)."""
    B, C, H, W = images.shape
    cut = images.unfold(2, p, p).unfold(3, p, p)                       # (B, C, H/p, W/p, p, p)
    return cut.permute(0, 2, 3, 1, 4, 5).reshape(B, (H // p) * (W // p), C * p * p)


def patch_embed(images, weight, bias):
    """(B, C, H, W) -> (B, N, E): one linear map per patch, as a convolution of stride p."""
    p = weight.shape[-1]
    return F.conv2d(images, weight, bias, stride=p).flatten(2).transpose(1, 2)   # (B, E, N) -> (B, N, E)


def add_class_token(patches, cls_token, pos_embed):
    """(B, N, E) -> (B, 1 + N, E): the class token in front, then a position embedding for every token."""
    cls = cls_token.expand(patches.shape[0], -1, -1)                   # (B, 1, E)
    return torch.cat([cls, patches], dim=1) + pos_embed


def attention_rollout(maps):
    """R = Â_L ··· Â_1 with Â = (mean over heads of A + I) / 2: (B, N, N), rows sum to 1."""
    result = None
    for a in maps:                                                     # first layer first
        a = a.mean(dim=-3)                                             # (B, H, N, N) -> (B, N, N)
        a = (a + torch.eye(a.shape[-1])) / 2                           # the residual; rows sum to 1 again
        result = a if result is None else a @ result
    return result


# ----------------------------------------------------------------------------- cnn


def pixel_attention(x, wq, wk, wv, gamma):
    """SAGAN's block: every pixel attends to every pixel; x + gamma · attention, (B, C, H, W)."""
    B, C, H, W = x.shape
    tokens = x.flatten(2).transpose(1, 2)                              # (B, HW, C)
    q, k, v = tokens @ wq.T, tokens @ wk.T, tokens @ wv.T              # (B, HW, C'), (B, HW, C'), (B, HW, C)
    attn = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)   # (B, HW, HW)
    out = (attn @ v).transpose(1, 2).reshape(B, C, H, W)              # channels first again
    return x + gamma * out


def squeeze_excite(x, w1, b1, w2, b2):
    """x · sigmoid(W2 relu(W1 avgpool(x) + b1) + b2), one gate per channel: (B, C, H, W)."""
    s = x.mean(dim=(2, 3))                                             # squeeze: (B, C)
    z = F.relu(s @ w1.T + b1)                                          # (B, C/r)
    gate = torch.sigmoid(z @ w2.T + b2)                                # (B, C), each in (0, 1)
    return x * gate[:, :, None, None]                                  # excite


def spatial_gate(x, weight, bias):
    """CBAM's spatial gate: sigmoid(conv([mean over channels; max over channels])), (B, 1, H, W)."""
    pooled = torch.cat([x.mean(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)], dim=1)   # (B, 2, H, W)
    k = weight.shape[-1]
    return torch.sigmoid(F.conv2d(pooled, weight, bias, padding=k // 2))


def relative_logits(q, rel_height, rel_width, size):
    """BoTNet's position logits q_i · (r^h[y_j - y_i] + r^w[x_j - x_i]): (B, heads, HW, HW)."""
    H, W = size
    ys = torch.arange(H).repeat_interleave(W)                          # pixel i = y * W + x
    xs = torch.arange(W).repeat(H)
    rel = rel_height[ys[None, :] - ys[:, None] + H - 1] \
        + rel_width[xs[None, :] - xs[:, None] + W - 1]                 # (HW, HW, D)
    return torch.einsum("bnid,ijd->bnij", q, rel)


# ----------------------------------------------------------------------------- efficient


def window_mask(length, window, causal):
    """(L, L) bool, True = blocked: keys further than the window (and, causal, the future)."""
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    if causal:
        return (i - j < 0) | (i - j >= window)                         # sees itself and window - 1 before
    return (i - j).abs() >= window


def linear_attention(q, k, v):
    """phi(q_i)ᵀ (Σ_j phi(k_j) v_jᵀ) / (phi(q_i)ᵀ Σ_j phi(k_j)), phi = elu + 1: (B, H, L, Dv)."""
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1                          # positive features (B, H, L, D)
    kv = phi_k.transpose(-2, -1) @ v                                   # (B, H, D, Dv): once for all queries
    z = phi_k.sum(dim=-2, keepdim=True)                                # (B, H, 1, D)
    return (phi_q @ kv) / ((phi_q * z).sum(dim=-1, keepdim=True) + 1e-6)


def causal_linear_attention(q, k, v):
    """Linear attention where query i sums over keys j <= i only: prefix sums, (B, H, L, Dv)."""
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    kv = torch.einsum("bhjd,bhje->bhjde", phi_k, v).cumsum(dim=2)     # (B, H, L, D, Dv): Σ_{j<=i}
    z = phi_k.cumsum(dim=2)                                            # (B, H, L, D)
    num = torch.einsum("bhid,bhide->bhie", phi_q, kv)
    return num / ((phi_q * z).sum(dim=-1, keepdim=True) + 1e-6)


def topk_attention(q, k, v, top_k):
    """Each query keeps its top_k largest logits; the softmax runs over those alone."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])          # (B, H, Lq, Lk)
    if top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]              # each row's k-th largest
        scores = scores.masked_fill(scores < kth, float("-inf"))
    return scores.softmax(dim=-1) @ v


# ----------------------------------------------------------------------------- lm


def rope(x, positions, base=10000.0):
    """x (B, H, L, D) rotated pair by pair, (x_i, x_{i+D/2}) by the angle position · base^(-2i/D)."""
    D = x.shape[-1]
    omega = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float32) / D)    # (D/2,)
    angle = positions[:, None].float() * omega[None, :]                        # (L, D/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]                                # the two halves
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def alibi(num_heads, length):
    """(H, L, L): -slope_h · |i - j| with the paper's slopes."""
    def geometric(n):
        return [2 ** (-8 * h / n) for h in range(1, n + 1)]

    low = 2 ** math.floor(math.log2(num_heads))                        # the power of two below
    slopes = geometric(low)
    if low < num_heads:
        slopes += geometric(2 * low)[0::2][: num_heads - low]          # every other one of twice as many
    slopes = torch.tensor(slopes)                                      # (H,)
    pos = torch.arange(length)
    distance = (pos[:, None] - pos[None, :]).abs()                     # (L, L)
    return -slopes[:, None, None] * distance


def repeat_kv(x, n_rep):
    """(B, Hkv, L, D) -> (B, Hkv · n_rep, L, D): query heads g·n_rep ... (g+1)·n_rep - 1 share head g."""
    return x.repeat_interleave(n_rep, dim=1)


def cache_step(cache_k, cache_v, q, k, v):
    """Append the new keys and values to the cache, then attend over it (bottom-right causal)."""
    cache_k = torch.cat([cache_k, k], dim=2)                           # (B, H, T + Lq, D)
    cache_v = torch.cat([cache_v, v], dim=2)
    lq, lk = q.shape[2], cache_k.shape[2]
    scores = q @ cache_k.transpose(-2, -1) / math.sqrt(q.shape[-1])    # (B, H, Lq, T + Lq)
    query_pos = torch.arange(lq)[:, None] + (lk - lq)                  # the new queries come last
    key_pos = torch.arange(lk)[None, :]
    scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
    return scores.softmax(dim=-1) @ cache_v, cache_k, cache_v


def top_p_filter(logits, p):
    """The logits outside the nucleus set to -inf: keep the most probable tokens until their
    probability reaches p (the token that crosses p is kept)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs                              # the probability ranked above
    drop_sorted = before >= p
    drop = drop_sorted.scatter(-1, order, drop_sorted)                 # back to the vocabulary's order
    return logits.masked_fill(drop, float("-inf"))


def sampling_probs(logits, temperature, top_k):
    """The distribution generate() samples from: softmax over the top_k of logits / temperature."""
    scaled = logits / temperature
    kth = scaled.topk(top_k, dim=-1).values[..., -1:]
    return scaled.masked_fill(scaled < kth, float("-inf")).softmax(dim=-1)


# ----------------------------------------------------------------------------- data


def class_index(paths):
    """The class names (the folders, sorted) and each file's class index."""
    folders = [path.split("/")[-2] for path in paths]                  # root/<class>/<file>
    classes = sorted(set(folders))
    labels = torch.tensor([classes.index(f) for f in folders], dtype=torch.long)
    return classes, labels


def encode_chars(text):
    """The sorted distinct characters of text, and text as their indices."""
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return chars, torch.tensor([index[c] for c in text], dtype=torch.long)


def lm_windows(tokens, context):
    """Windows of context + 1 tokens every context tokens: inputs x and labels y shifted by one."""
    T, L = len(tokens), context
    n = -(-(T - 1) // L)                                               # ceil((T - 1) / L) windows
    x = torch.zeros(n, L, dtype=torch.long)
    y = torch.full((n, L), -100, dtype=torch.long)                     # -100: ignored by the loss
    for i in range(n):
        inputs = tokens[i * L : i * L + L]                             # fewer in the last window
        labels = tokens[i * L + 1 : i * L + L + 1]                     # the next token of each input
        x[i, : len(inputs)] = inputs
        y[i, : len(labels)] = labels
    return x, y


def split_by_class(labels, val_fraction, seed):
    """Sorted (train, validation) indices, int(val_fraction · n_c) of each class c held out."""
    g = torch.Generator().manual_seed(seed)                            # one generator for all classes
    train, val = [], []
    for c in labels.unique().tolist():                                 # classes in increasing order
        idx = (labels == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        n_val = int(val_fraction * len(idx))
        val.append(idx[:n_val])
        train.append(idx[n_val:])
    return torch.cat(train).sort().values, torch.cat(val).sort().values


# ----------------------------------------------------------------------------- inside


def head_entropy(weights):
    """(H, L, L) -> (H,): each row's entropy in bits (0 · log 0 = 0), averaged over the queries."""
    plogp = torch.where(weights > 0, weights * torch.log2(weights), torch.zeros(()))
    return -plogp.sum(dim=-1).mean(dim=-1)


def previous_token_score(weights):
    """(H, L, L) -> (H,): the weight of query i on key i - 1, averaged over the queries i >= 1."""
    if weights.shape[-1] < 2:
        return torch.zeros(weights.shape[0])
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=-1)  # w[h, i, i - 1]


def induction_score(weights, tokens):
    """(H, L, L), (L,) -> (H,): the weight on the tokens that followed earlier occurrences of
    the query's token, averaged over the queries whose token occurred before."""
    L = tokens.shape[0]
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    before = torch.roll(tokens, 1)                                     # before[j] = tokens[j - 1]
    follows = (before[None, :] == tokens[:, None]) & (j >= 1) & (j <= i)   # (L, L)
    repeated = follows.any(dim=-1)                                     # the queries that count
    return (weights * follows).sum(dim=-1)[:, repeated].mean(dim=-1)


def cls_patch_map(rollout, grid):
    """(B, 1 + N, 1 + N) -> (B, gh, gw): the class token's row without its own column, on the grid."""
    gh, gw = grid
    return rollout[:, 0, 1:].reshape(rollout.shape[0], gh, gw)
