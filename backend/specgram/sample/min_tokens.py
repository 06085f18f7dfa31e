"""min_tokens: the first min_tokens tokens of an output never end it (EOS and the request's stop_token_ids here;
stop strings in output.py).

A token's output position p is its index in the request's output: the first token is p = 0; in a decode step,
verify row i (and draft i) is p = len(output_ids) + i. Wherever p < min_tokens, every EOS logit (unless the
request ignores EOS, which then is an ordinary token) and every stop_token_ids logit is set to -inf before anything
is chosen from the row: the first token, each draft the draft model picks, each verify row. EOS's probability is thus
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


def ends_banned(req: Request, offset: int) -> bool:
    """Whether req's token at output position len(req.output_ids) + offset may not end the output (it is below
    min_tokens)."""
    return len(req.output_ids) + offset < req.params.min_tokens


def banned_ids(req: Request, eos_ids: set[int], vocab: int) -> list[int]:
    """The tokens that would end req's output, banned below min_tokens: EOS (unless the request ignores it, when
    EOS is an ordinary token) and its stop_token_ids (always: they end the output under ignore_eos too, and
    vLLM bans them below min_tokens alike)."""
    eos = set() if req.params.ignore_eos else {e for e in eos_ids if e < vocab}
    return sorted(eos | {t for t in req.params.stop_token_ids if t < vocab})


def suppress_eos(logits: torch.Tensor, eos: torch.Tensor, rows: torch.Tensor) -> None:
    """logits: [N, V] float, changed in place; eos: [E] long, the ending token ids; rows: [N] bool, the rows
    whose token may not end the output. Those rows get -inf at every id of eos, except a row where nothing but
    those ids is allowed (every other logit already -inf, e.g. by a grammar mask): that row is left as it is.
    No host sync: everything stays on the logits' device."""
    allowed = logits > float("-inf")  # [N, V]
    others = allowed.sum(-1) > allowed[:, eos].sum(-1)  # [N] a non-ending token is allowed
    ban = (rows & others)[:, None]  # [N, 1]
    logits[:, eos] = torch.where(ban, float("-inf"), logits[:, eos])  # [N, E]


@torch.inference_mode()  # the forwards' logits are inference tensors: changed in place only in this mode
def apply(logits: torch.Tensor, rows: list[tuple[Request, int]], eos_ids: set[int]) -> None:
    """logits: [N, V]; rows[n] = (the request of row n, the row's offset past its committed output). Rows below
    their request's min_tokens get its banned_ids() at -inf. Nothing to do (and no tensor work) when no row is
    below it. Rows whose banned ids are the EOS ids alone share one batched call; the others go one at a time."""
    banned = [ends_banned(r, o) for r, o in rows]
    if not any(banned):
        return
    vocab, dev = logits.shape[-1], logits.device
    plain = [
        b and not r.params.ignore_eos and not r.params.stop_token_ids for b, (r, _) in zip(banned, rows, strict=True)
    ]
    for n, (r, _) in enumerate(rows):
        if banned[n] and not plain[n]:
            ids = banned_ids(r, eos_ids, vocab)
            if ids:
                suppress_eos(logits[n : n + 1], long_tensor(ids, dev), torch.ones(1, dtype=torch.bool, device=dev))
    eos = sorted(e for e in eos_ids if e < vocab)
    if eos and any(plain):
        suppress_eos(logits, long_tensor(eos, dev), h2d(torch.tensor(plain), dev))
