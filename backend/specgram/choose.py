"""Token choice for a batch of requests: pick one token per row, or decide which drafts the target accepts.

Thin glue between per-request state (sampling parameters, generators, proposals) and the pure tensor
functions of sampling.py and verify.py. Randomness: every sampled request draws from its own generator in
a fixed order (k accept tests then one final draw per verify step), so its output does not depend on batch
composition.
"""
from __future__ import annotations

import torch

from . import sampling, verify
from .drafters import Proposal
from .request import Request
from .transfer import h2d, long_tensor


def _params(reqs: list[Request], device, repeat: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> temperature, top_k, top_p: [len(reqs) * repeat], each request's value repeated `repeat` times."""
    rep = lambda vals, dt: h2d(torch.tensor([v for v in vals for _ in range(repeat)], dtype=dt), device)  # noqa: E731
    return (rep([r.params.temperature for r in reqs], torch.float32), rep([r.params.top_k for r in reqs], torch.long),
            rep([r.params.top_p for r in reqs], torch.float32))


def pick(logits: torch.Tensor, reqs: list[Request]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits: [B, V] -> ([B] next tokens on CPU, greedy or sampled per request;
    [B, V] probabilities when any request samples (one-hot rows for greedy ones), else None)."""
    ids = sampling.greedy(logits)
    sampled = [b for b, r in enumerate(reqs) if not r.params.greedy]
    if not sampled:
        return ids.cpu(), None
    rows = [reqs[b] for b in sampled]
    at = long_tensor(sampled, logits.device)        # a python-list index would be a blocking copy on CUDA
    probs = torch.nn.functional.one_hot(ids, logits.shape[-1]).float()
    probs[at] = sampling.probabilities(logits[at], *_params(rows, logits.device))
    u = h2d(sampling.draw_uniforms([r.generator for r in rows]), logits.device)
    ids[at] = sampling.sample(probs[at], u)
    return ids.cpu(), probs


def accept(reqs: list[Request], proposals: list[Proposal], logits: torch.Tensor) -> tuple[list[int], list[int]]:
    """logits: [B, K+1, V] from the verify forward (masked where guided).
    -> (accepted drafts per request, the target's next token per request). Greedy rows: the longest prefix
    the target's argmax agrees with, then its token. Sampled rows: speculative sampling."""
    B, T, V = logits.shape
    dev = logits.device
    k = long_tensor([len(p.tokens) for p in proposals], dev)
    drafts = torch.zeros(B, T - 1, dtype=torch.long)                  # built on the host, one non-blocking copy
    for b, p in enumerate(proposals):
        if p.tokens:
            drafts[b, :len(p.tokens)] = torch.tensor(p.tokens)
    drafts = h2d(drafts, dev)
    accepted = torch.zeros(B, dtype=torch.long, device=dev)
    nxt = torch.zeros(B, dtype=torch.long, device=dev)
    g_rows = [b for b, r in enumerate(reqs) if r.params.greedy]
    if g_rows:
        g = long_tensor(g_rows, dev)                  # a python-list index would be a blocking copy on CUDA
        target_ids = logits[g].argmax(-1)                                               # [G, T]
        accepted[g] = verify.greedy_accept(target_ids, drafts[g], k[g])
        nxt[g] = target_ids.gather(1, accepted[g][:, None]).squeeze(1)
    s_rows = [b for b, r in enumerate(reqs) if not r.params.greedy]
    if s_rows:
        s = long_tensor(s_rows, dev)
        accepted[s], nxt[s] = _speculative_sample([reqs[b] for b in s_rows], [proposals[b] for b in s_rows],
                                                  logits[s], drafts[s], k[s])
    return accepted.tolist(), nxt.tolist()          # the verify step waits for the device here


def _speculative_sample(reqs, proposals, logits, drafts, k) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [S, K+1, V] for the sampled requests -> (accepted [S], next token [S])."""
    S, T, V = logits.shape
    dev = logits.device
    p = sampling.probabilities(logits.reshape(S * T, V), *_params(reqs, dev, repeat=T)).reshape(S, T, V)
    q = torch.zeros(S, T - 1, V, device=dev)
    u_accept = torch.ones(S, T - 1, dtype=torch.float64)
    for i, (r, prop) in enumerate(zip(reqs, proposals)):
        n = len(prop.tokens)
        if n:
            q[i, :n] = prop.probs.to(dev) if prop.probs is not None else verify.one_hot_rows(prop.tokens, V, dev)
            u_accept[i, :n] = sampling.draw_uniforms([r.generator] * n)      # exactly k + 1 draws per step
    u_final = sampling.draw_uniforms([r.generator for r in reqs])
    return verify.speculative_accept(p, q, drafts, k, h2d(u_accept, dev), h2d(u_final, dev))
