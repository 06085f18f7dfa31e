"""vLLM's logits processors beyond the grammar mask and min_tokens: allowed_token_ids, logit_bias, bad_words, and
the repetition, frequency and presence penalties, in vLLM's order.

A row of logits is for one request's token at one output position p. Its history is the output tokens before p:
the committed ones and, in verify row i of a speculative step, the drafts d_0 .. d_{i-1}. Every processor reads
the prompt and that history alone, so verify row i gets exactly the logits a non-speculative step at p would get,
and greedy speculation stays token-identical with any of them on (sampled: the same distribution).

- allowed_token_ids: every other token -inf.
- logit_bias: added to its token's logit.
- bad_words: a word's last token is -inf where the history ends with the word's other tokens (a one-token word
  always); each word counts as tokenized alone and after a space (intake.py).
- repetition_penalty r (tokens in the prompt or the history): a logit l becomes l / r where l > 0, else l * r.
- frequency_penalty f and presence_penalty e (tokens in the history, c times): l - f * c - e.

Drafts of a draft model see the committed history only (their own earlier drafts are not passed to the
drafter's picks): a penalty that an earlier draft would trigger can make a draft be rejected, never change
the output.
"""

from __future__ import annotations

import torch

from ..model.transfer import long_tensor
from ..request import Request


def restrict(row: torch.Tensor, allowed: torch.Tensor) -> None:
    """row: [V], changed in place: -inf outside allowed ([A] long)."""
    keep = row[allowed]
    row.fill_(float("-inf"))
    row[allowed] = keep


def banned_by_words(words: list[list[int]], history: list[int]) -> list[int]:
    """The tokens that would complete a bad word: each word's last token where the history ends with the rest."""
    out = []
    for w in words:
        head = w[:-1]
        if not head or (len(history) >= len(head) and history[len(history) - len(head) :] == head):
            out.append(w[-1])
    return out


def repetition(row: torch.Tensor, seen: torch.Tensor, penalty: float) -> None:
    """row: [V] in place; seen: [S] long, the distinct tokens of the prompt and the history."""
    vals = row[seen]
    row[seen] = torch.where(vals > 0, vals / penalty, vals * penalty)


def frequency_presence(row: torch.Tensor, history: torch.Tensor, frequency: float, presence: float) -> None:
    """row: [V] in place; history: [H] long (H > 0), the output tokens before this row's position."""
    tokens, counts = torch.unique(history, return_counts=True)
    row[tokens] -= frequency * counts.to(row.dtype) + presence


def apply_row(row: torch.Tensor, req: Request, history: list[int]) -> None:
    """row: [V], the logits of req's token after `history` (its output tokens before this position)."""
    p, dev = req.params, row.device
    if p.allowed_token_ids is not None:
        restrict(row, long_tensor(p.allowed_token_ids, dev))
    if p.logit_bias:
        ids = long_tensor(list(p.logit_bias), dev)
        row[ids] += torch.tensor(list(p.logit_bias.values()), dtype=row.dtype, device=dev)
    if req.bad_word_ids:
        banned = banned_by_words(req.bad_word_ids, history)
        if banned:
            row[long_tensor(banned, dev)] = float("-inf")
    if p.repetition_penalty != 1.0:
        repetition(row, torch.unique(long_tensor(req.prompt_ids + history, dev)), p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and history:
        frequency_presence(row, long_tensor(history, dev), p.frequency_penalty, p.presence_penalty)


@torch.inference_mode()  # the forwards' logits are inference tensors: changed in place only in this mode
def apply(logits: torch.Tensor, rows: list[tuple[int, Request, list[int]]]) -> None:
    """logits: [N, V], changed in place; rows: (row index, its request, its history) for the rows of requests
    with a processor on (SamplingParams.penalized); the others are left as they are."""
    for n, req, history in rows:
        apply_row(logits[n], req, history)
