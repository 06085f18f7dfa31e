"""Token choice: pick one token per request, or decide which drafts the target accepts.

Pure tensor functions first (rows are requests; every parameter is per row; B requests, K = the batch's largest
draft length, V vocabulary; row b has k[b] <= K real drafts, drafts beyond k[b] are padding and never
accepted), then the glue to per-request state (sampling parameters, seeds, proposals).

Sampled tokens (noise.py): the token at output position t is the Gumbel-max choice under noise keyed by
(seed, t), so it depends on the seed, the position and the processed distribution there alone. Coupled
verification (the default) accepts a draft when it equals that token, as greedy verification does: sampled
output is the same for every draft length, drafter and batch. Rejection sampling (speculative_sampling
"rejection") accepts draft d with probability min(1, p(d)/q(d)), drawing from the request's generator: higher
acceptance for a draft model, but the committed tokens then depend on what was drafted.
"""

from __future__ import annotations

import torch

from ..drafting.proposal import Proposal
from ..model import tree
from ..model.transfer import h2d, long_tensor
from ..request import Request
from . import noise


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """logits: [N, V] -> [N] argmax ids."""
    return logits.argmax(dim=-1)


def probabilities(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """logits: [N, V] float32; temperature (> 0), top_p: [N] float; top_k: [N] long (0 = off).
    -> probs [N, V]: softmax(logits / T) restricted to the top-k tokens and the top-p nucleus, renormalised.
    -inf logits (masked tokens) stay at probability 0."""
    scaled = logits / temperature[:, None]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    rank = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, vocab)
    drop = rank >= k[:, None]  # [N, V] beyond top-k
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of strictly better tokens
    drop = mass_before >= top_p[:, None]  # the best token is always kept
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(sorted_probs).scatter_(-1, order, sorted_probs)


def draw_uniforms(generators: list[torch.Generator]) -> torch.Tensor:
    """One U[0,1) per row from that row's generator (CPU generators: reproducible on any device)."""
    return torch.tensor([torch.rand(1, generator=g).item() for g in generators], dtype=torch.float64)


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


def speculative_accept(
    p: torch.Tensor,
    q: torch.Tensor,
    drafts: torch.Tensor,
    k: torch.Tensor,
    u_accept: torch.Tensor,
    u_final: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
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
    p_d = p[:, :K].gather(-1, drafts[..., None]).squeeze(-1)  # [B, K]
    q_d = q.gather(-1, drafts[..., None]).squeeze(-1)  # [B, K]
    ratio = torch.where(q_d > 0, p_d / q_d.clamp_min(1e-30), torch.zeros_like(p_d))
    ok = (u_accept < ratio.clamp_max(1.0)) & (torch.arange(K, device=p.device)[None, :] < k[:, None])
    accepted = _prefix_len(ok)  # [B]
    p_at = p[ar, accepted]  # [B, V]
    q_pad = torch.cat([q, q.new_zeros(B, 1, q.shape[-1])], dim=1)  # [B, K+1, V]
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


# ---- per-request glue ------------------------------------------------------------------------------------


def _params(reqs: list[Request], device, repeat: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> temperature, top_k, top_p: [len(reqs) * repeat], each request's value repeated `repeat` times."""
    rep = lambda vals, dt: h2d(torch.tensor([v for v in vals for _ in range(repeat)], dtype=dt), device)  # noqa: E731
    return (
        rep([r.params.temperature for r in reqs], torch.float32),
        rep([r.params.top_k for r in reqs], torch.long),
        rep([r.params.top_p for r in reqs], torch.float32),
    )


def coupled_pick(
    logits: torch.Tensor, reqs: list[Request], positions: list[int], rows: noise.NoiseRows
) -> torch.Tensor:
    """logits: [N, V] (masked), row n for reqs[n]'s token at output position positions[n] -> [N] the sampled
    tokens, each a function of (seed, position, processed distribution) alone (noise.py)."""
    temperature, top_k, top_p = _params(reqs, logits.device)
    # the tokens top-k / top-p leave (masked ones are -inf already); None: every finite one, no sort needed
    plain = all(r.params.top_k == 0 and r.params.top_p == 1.0 for r in reqs)
    support = None if plain else probabilities(logits, temperature, top_k, top_p) > 0
    g = h2d(rows.get([(r.seed, t) for r, t in zip(reqs, positions, strict=True)]), logits.device)
    return noise.gumbel_argmax(logits / temperature[:, None], support, g)


def pick(
    logits: torch.Tensor, reqs: list[Request], positions: list[int], rows: noise.NoiseRows, want_probs: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits: [B, V], row b for reqs[b]'s token at output position positions[b] -> ([B] next tokens on CPU,
    greedy or sampled per request; with want_probs and any sampled request, [B, V] the distributions they were
    sampled from (one-hot rows for greedy ones), which rejection sampling needs as q; else None)."""
    ids = greedy(logits)
    sampled = [b for b, r in enumerate(reqs) if not r.params.greedy]
    if not sampled:
        return ids.cpu(), None
    chosen = [reqs[b] for b in sampled]
    at = long_tensor(sampled, logits.device)  # a python-list index would be a blocking copy on CUDA
    ids[at] = coupled_pick(logits[at], chosen, [positions[b] for b in sampled], rows)
    if not want_probs:
        return ids.cpu(), None
    probs = torch.nn.functional.one_hot(ids, logits.shape[-1]).float()
    probs[at] = probabilities(logits[at], *_params(chosen, logits.device))
    return ids.cpu(), probs


def accept(
    reqs: list[Request],
    proposals: list[Proposal],
    logits: torch.Tensor,
    rows: noise.NoiseRows,
    coupled: bool = True,
) -> tuple[list[int], list[int], list[list[int]]]:
    """logits: [B, K+1, V] from the verify forward (masked where guided); row (b, i) is reqs[b]'s output position
    len(output_ids) + the depth of the row's token i (a line: i; a tree of drafts, Proposal.parents: tree.py).
    -> (accepted drafts per request, the target's next token per request, the row indices of the accepted
    drafts). Greedy rows, and sampled rows when coupled: the longest prefix of drafts equal to the target's own
    choice (in a tree, the path that follows the target's choice from node to node: tree.walk), then its choice.
    Sampled rows otherwise (never trees): speculative (rejection) sampling."""
    B, T, V = logits.shape
    dev = logits.device
    k = long_tensor([len(p.tokens) for p in proposals], dev)
    drafts = torch.zeros(B, T - 1, dtype=torch.long)  # built on the host, one non-blocking copy
    for b, p in enumerate(proposals):
        if p.tokens:
            drafts[b, : len(p.tokens)] = torch.tensor(p.tokens)
    drafts = h2d(drafts, dev)
    choice = logits.argmax(-1)  # [B, T] greedy choice at every position
    s_rows = [b for b, r in enumerate(reqs) if not r.params.greedy]
    if s_rows and coupled:
        depth = [p.depths for p in proposals]
        cells = [(b, i) for b in s_rows for i in range(len(depth[b]))]  # padding rows skipped
        flat = long_tensor([b * T + i for b, i in cells], dev)
        picked = coupled_pick(
            logits.view(B * T, V)[flat],
            [reqs[b] for b, _ in cells],
            [len(reqs[b].output_ids) + depth[b][i] for b, i in cells],
            rows,
        )
        choice.view(-1)[flat] = picked
    accepted = greedy_accept(choice, drafts, k)
    nxt = choice.gather(1, accepted[:, None]).squeeze(1)
    if s_rows and not coupled:
        s = long_tensor(s_rows, dev)
        accepted[s], nxt[s] = _speculative_sample(
            [reqs[b] for b in s_rows], [proposals[b] for b in s_rows], logits[s], drafts[s], k[s]
        )
    accepted_l, nxt_l = accepted.tolist(), nxt.tolist()  # the verify step waits for the device here
    paths = [list(range(1, a + 1)) for a in accepted_l]
    # rows verified as trees (rejection sampling reads a sampled row's line alone: its branches are ignored)
    tree_rows = [b for b, p in enumerate(proposals) if p.branches and (coupled or reqs[b].params.greedy)]
    if tree_rows:
        chosen = choice.tolist()
        for b in tree_rows:
            tokens = [-1, *proposals[b].tokens, *(n.token for n in proposals[b].branches)]
            paths[b], nxt_l[b] = tree.walk(proposals[b].parents, tokens, chosen[b])
            accepted_l[b] = len(paths[b])
    return accepted_l, nxt_l, paths


def _speculative_sample(reqs, proposals, logits, drafts, k) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [S, K+1, V] for the sampled requests -> (accepted [S], next token [S])."""
    S, T, V = logits.shape
    dev = logits.device
    p = probabilities(logits.reshape(S * T, V), *_params(reqs, dev, repeat=T)).reshape(S, T, V)
    q = torch.zeros(S, T - 1, V, device=dev)
    u_accept = torch.ones(S, T - 1, dtype=torch.float64)
    for i, (r, prop) in enumerate(zip(reqs, proposals, strict=True)):
        n = len(prop.tokens)
        if n:
            q[i, :n] = prop.probs.to(dev) if prop.probs is not None else one_hot_rows(prop.tokens, V, dev)
            u_accept[i, :n] = draw_uniforms([r.generator] * n)  # exactly k + 1 draws per step
    u_final = draw_uniforms([r.generator for r in reqs])
    return speculative_accept(p, q, drafts, k, h2d(u_accept, dev), h2d(u_final, dev))
