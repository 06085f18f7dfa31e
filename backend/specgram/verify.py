"""Pure tensor functions that decide which drafted tokens the target accepts.

Shapes: B requests, K = the batch's largest draft length, V vocabulary. Row b has k[b] <= K real drafts;
drafts beyond k[b] are padding and never accepted.
"""
from __future__ import annotations

import torch

from .transfer import long_tensor


def _prefix_len(ok: torch.Tensor) -> torch.Tensor:
    """ok: [B, K] bool -> [B] length of the all-true prefix."""
    return ok.long().cumprod(dim=-1).sum(dim=-1)


def greedy_accept(target_ids: torch.Tensor, drafts: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """target_ids: [B, K+1] argmax of the target at each verified position; drafts: [B, K]; k: [B].
    -> accepted [B]: the longest prefix where the target's choice equals the draft. The committed tokens
    are drafts[:a] + target_ids[a] — exactly what non-speculative greedy decoding would produce."""
    K = drafts.shape[1]
    ok = (target_ids[:, :K] == drafts) & (torch.arange(K, device=drafts.device)[None, :] < k[:, None])
    return _prefix_len(ok)


def speculative_accept(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, k: torch.Tensor,
                       u_accept: torch.Tensor, u_final: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), batched.

    p: [B, K+1, V] target probabilities at each verified position (after temperature/top-k/top-p and mask);
    q: [B, K, V] draft probabilities the drafts were sampled from (one-hot for deterministic drafters),
       zero beyond k[b]; drafts: [B, K]; k: [B]; u_accept: [B, K], u_final: [B] uniforms in [0, 1).
    Draft i is accepted with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection the token is
    drawn from norm(max(p_i - q_i, 0)); after k accepts the bonus token is drawn from p_k (q is zero there,
    so the same formula applies). Output tokens are then distributed exactly as sampling from p.
    -> (accepted [B], next_token [B])."""
    B, K = drafts.shape
    ar = torch.arange(B, device=p.device)
    p_d = p[:, :K].gather(-1, drafts[..., None]).squeeze(-1)                      # [B, K]
    q_d = q.gather(-1, drafts[..., None]).squeeze(-1)                             # [B, K]
    ratio = torch.where(q_d > 0, p_d / q_d.clamp_min(1e-30), torch.zeros_like(p_d))
    ok = (u_accept < ratio.clamp_max(1.0)) & (torch.arange(K, device=p.device)[None, :] < k[:, None])
    accepted = _prefix_len(ok)                                                    # [B]
    p_at = p[ar, accepted]                                                        # [B, V]
    q_pad = torch.cat([q, q.new_zeros(B, 1, q.shape[-1])], dim=1)                # [B, K+1, V]
    q_at = q_pad[ar, accepted]
    residual = residual_distribution(p_at, q_at)
    cdf = residual.cumsum(-1)
    u = u_final[:, None].to(cdf.dtype) * cdf[:, -1:]
    nxt = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_max(p.shape[-1] - 1)
    return accepted, nxt


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """[N, V] -> norm(max(p - q, 0)); where that is all zero (p == q), p itself."""
    r = (p - q).clamp_min(0)
    s = r.sum(-1, keepdim=True)
    return torch.where(s > 0, r / s.clamp_min(1e-30), p)


def one_hot_rows(tokens: list[int], vocab: int, device) -> torch.Tensor:
    """The 'distribution' of a deterministic drafter: [len(tokens), V] one-hot."""
    out = torch.zeros(len(tokens), vocab, device=device)
    if tokens:
        out[torch.arange(len(tokens), device=device), long_tensor(tokens, device)] = 1.0
    return out
