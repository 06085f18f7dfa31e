"""min_tokens: the first min_tokens tokens of an output never end it (EOS and the request's stop_token_ids here;
stop strings in output.py).

A token's output position p is its index in the request's output: the first token is p = 0; in a decode step,
verify row i (and draft i) is p = len(output_ids) + i. Wherever p < min_tokens (and the request does not
ignore EOS, which then is an ordinary token), every EOS logit is set to -inf before anything is chosen from
the row: the first token, each draft the draft model picks, each verify row. EOS's probability is thus
renormalised away, as vLLM's min_tokens logits processor does, and draft (q) and target (p) distributions
are the same ones a non-speculative run would use at that position, so speculative sampling stays exact and
greedy speculation token-identical.

A grammar wins: a row whose only allowed tokens are EOS (the grammar is complete and allows nothing but its
stop token) keeps them, and the request ends there (finish_reason `stop`) with fewer than min_tokens tokens.
min_tokens never forces output the grammar forbids.
"""
from __future__ import annotations

import torch

from ..model.transfer import h2d, long_tensor
from ..request import Request


def eos_banned(req: Request, offset: int) -> bool:
    """Whether req's token at output position len(req.output_ids) + offset may not be EOS."""
    return not req.params.ignore_eos and len(req.output_ids) + offset < req.params.min_tokens


def suppress_eos(logits: torch.Tensor, eos: torch.Tensor, rows: torch.Tensor) -> None:
    """logits: [N, V] float, changed in place; eos: [E] long, the EOS token ids; rows: [N] bool, the rows
    whose token may not be EOS. Those rows get -inf at every EOS id, except a row where nothing but EOS ids
    is allowed (every other logit already -inf, e.g. by a grammar mask): that row is left as it is.
    No host sync: everything stays on the logits' device."""
    allowed = logits > float("-inf")                                          # [N, V]
    others = allowed.sum(-1) > allowed[:, eos].sum(-1)                        # [N] a non-EOS token is allowed
    ban = (rows & others)[:, None]                                            # [N, 1]
    logits[:, eos] = torch.where(ban, float("-inf"), logits[:, eos])          # [N, E]


@torch.inference_mode()      # the forwards' logits are inference tensors: changed in place only in this mode
def apply(logits: torch.Tensor, banned: list[bool], eos_ids: set[int],
          stop_ids: list[list[int]] | None = None) -> None:
    """logits: [N, V], row n for a token whose eos_banned() is banned[n]; stop_ids[n]: row n's request's
    stop_token_ids, banned with EOS. Nothing to do (and no tensor work) when no row is banned. EOS ids beyond
    the model's vocabulary can never be chosen anyway."""
    if not any(banned):
        return
    vocab, dev = logits.shape[-1], logits.device
    extra = [n for n, b in enumerate(banned) if b and stop_ids and stop_ids[n]]
    for n in extra:             # rows with their own stop tokens: one at a time
        ids = sorted({e for e in eos_ids if e < vocab} | set(stop_ids[n]))
        suppress_eos(logits[n:n + 1], long_tensor(ids, dev), torch.ones(1, dtype=torch.bool, device=dev))
    if extra:
        banned = [b and n not in extra for n, b in enumerate(banned)]
    eos = sorted(e for e in eos_ids if e < vocab)
    if not eos or not any(banned):
        return
    suppress_eos(logits, long_tensor(eos, dev), h2d(torch.tensor(banned), dev))
