"""Pure tensor functions for picking tokens. Rows are requests; every parameter is per row.

Sampling draws its randomness from per-request generators as one uniform number per row, then inverts
the CDF: the batch composition never changes which token a seeded request gets.
"""
from __future__ import annotations

import torch


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """logits: [N, V] -> [N] argmax ids."""
    return logits.argmax(dim=-1)


def probabilities(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                  top_p: torch.Tensor) -> torch.Tensor:
    """logits: [N, V] float32; temperature (> 0), top_p: [N] float; top_k: [N] long (0 = off).
    -> probs [N, V]: softmax(logits / T) restricted to the top-k tokens and the top-p nucleus, renormalised.
    -inf logits (masked tokens) stay at probability 0."""
    scaled = logits / temperature[:, None]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    rank = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, vocab)
    drop = rank >= k[:, None]                                                   # [N, V] beyond top-k
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs                    # mass of strictly better tokens
    drop = mass_before >= top_p[:, None]                                        # the best token is always kept
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(sorted_probs).scatter_(-1, order, sorted_probs)


def sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """probs: [N, V], uniforms: [N] in [0, 1) -> [N] ids by inverse-CDF sampling."""
    cdf = probs.cumsum(dim=-1)
    u = uniforms[:, None].to(cdf.dtype) * cdf[:, -1:]                           # guard against cdf[-1] < 1
    ids = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    return ids.clamp_max(probs.shape[-1] - 1)


def draw_uniforms(generators: list[torch.Generator]) -> torch.Tensor:
    """One U[0,1) per row from that row's generator (CPU generators: reproducible on any device)."""
    return torch.tensor([torch.rand(1, generator=g).item() for g in generators], dtype=torch.float64)
