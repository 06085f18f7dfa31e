"""Sampling noise keyed by (seed, output position).

A sampled request's token at output position t is argmax_v (logits_v / T + G_v) over the support that top-k,
top-p, the grammar mask and min_tokens leave (Gumbel-max: with G_v iid standard Gumbel this is an exact sample
of softmax(logits / T) on that support), and G comes from (seed, t) alone. So the token is a function of the
seed, the position and the distribution there: not of how many random numbers were drawn before, how many
drafts were verified, which drafter proposed them, or what else was batched. A draft equal to that token is
accepted, as under greedy decoding; a draft model that drafts with the same noise on its own distribution is
accepted often (coupled drafting).

G for (seed, t): a CPU MT19937 generator seeded with a 64-bit mix of both, one float32 uniform per vocabulary
entry (torch's CPU uniform kernel is serial), then -log(-log(u)); a test checks that the rows do not depend on
the thread count or on the other rows. Drawn on the CPU and copied: the same on every device.
"""
from __future__ import annotations

import torch

_M64 = (1 << 64) - 1
_HALF_STEP = 2.0 ** -25     # torch.rand's float32 values are multiples of 2^-24 in [0, 1): shift into (0, 1)


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit ints whose output bits each depend on every input bit."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _M64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _M64
    return x ^ (x >> 31)


def key(seed: int, position: int) -> int:
    """The generator seed for (request seed, output position): distinct pairs give unrelated streams."""
    return _mix64((_mix64(seed & _M64) + 0x9E3779B97F4A7C15 * (position + 1)) & _M64)


def gumbel(keys: list[int], vocab: int) -> torch.Tensor:
    """-> [len(keys), vocab] float32 standard Gumbel noise on the CPU, row i from keys[i] alone."""
    out = torch.empty(len(keys), vocab)
    g = torch.Generator()
    for i, k in enumerate(keys):
        g.manual_seed(k)
        out[i] = torch.rand(vocab, generator=g)
    return out.add_(_HALF_STEP).log_().neg_().log_().neg_()             # -log(-log(u)), u in (0, 1)


def gumbel_argmax(scaled: torch.Tensor, support: torch.Tensor | None, noise: torch.Tensor) -> torch.Tensor:
    """scaled: [N, V] logits / temperature (-inf where masked); support: [N, V] bool or None (= the finite
    entries); noise: [N, V] -> [N] argmax of scaled + noise over the support."""
    scores = scaled + noise
    allowed = support if support is not None else torch.isfinite(scaled)
    return scores.masked_fill(~allowed, float("-inf")).argmax(dim=-1)
