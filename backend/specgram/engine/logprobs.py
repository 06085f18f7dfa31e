"""Logprobs of the committed tokens, from the logits the step already has (no extra forward).

Each committed token was chosen from one row of logits: the first token from its prompt's last position, a
decode step's tokens from verify rows 0 .. a (the accepted drafts and the target's own token). Its logprob is
read from that row, so it is the same for every draft length, drafter and batch wherever the row's logits
are (the native forward: bitwise).

Two modes (config `logprobs_mode`, vLLM's names without the suffix):
- raw: log_softmax of the target's logits as the model computed them, before any processing: penalties,
  grammar mask, min_tokens and temperature do not change them (vLLM's default, "raw_logprobs");
- processed: log_softmax of the logits the token was chosen from: after the penalties, the grammar mask and
  min_tokens, divided by the temperature for sampled requests (top-k / top-p cut nothing here). Tokens the
  grammar forbids are -inf and never listed among the top-n.
The rank of a token is 1 + the number of tokens of its row with a strictly higher logprob.
"""

from __future__ import annotations

import math

import torch

from ..faults import Faults
from ..model.transfer import h2d, long_tensor
from ..request import Request, TokenLogprob

MODES = ("raw", "processed")


def log_probs(logits: torch.Tensor, temperature: torch.Tensor | None = None) -> torch.Tensor:
    """logits: [N, V] -> [N, V] float32 log-softmax, of logits / temperature[:, None] when it is given."""
    x = logits.float()
    if temperature is not None:
        x = x / temperature[:, None]
    return torch.log_softmax(x, dim=-1)


def chosen_and_top(lp: torch.Tensor, chosen: torch.Tensor, n: int):
    """lp: [N, V] log-probs; chosen: [N] long -> (chosen logprob [N], chosen rank [N] (1-based), top-n logprobs
    [N, n], top-n ids [N, n]) on the host."""
    at = lp.gather(1, chosen[:, None])  # [N, 1]
    rank = (lp > at).sum(-1) + 1  # [N]
    top_lp, top_ids = lp.topk(n, dim=-1) if n else (lp[:, :0], chosen[:, None][:, :0])
    return at.squeeze(1).cpu(), rank.cpu(), top_lp.cpu(), top_ids.cpu()


class LogprobTaker:
    def __init__(self, mode: str, tokenizer):
        assert mode in MODES, mode
        self.mode = mode
        self.tokenizer = tokenizer
        self._pieces: dict[int, str] = {}  # token id -> its text alone (at most the vocabulary)

    def capture(self, logits: torch.Tensor, reqs: list[Request], stage: str) -> dict[int, torch.Tensor] | None:
        """logits: [B, T, V], row b for reqs[b]; stage: "raw" (before any processing) or "processed" (after
        it). -> {b: [T, V] log-probs} for the requests that want logprobs when stage is this taker's mode;
        None when it is not (nothing computed)."""
        if stage != self.mode:
            return None
        want = [b for b, r in enumerate(reqs) if r.params.wants_logprobs]
        if not want:
            return {}
        B, T, V = logits.shape
        rows = logits[long_tensor(want, logits.device)].reshape(len(want) * T, V)
        temperature = None
        if stage == "processed":
            t = [reqs[b].params.temperature or 1.0 for b in want for _ in range(T)]
            temperature = h2d(torch.tensor(t, dtype=torch.float32), logits.device)
        lp = log_probs(rows, temperature).view(len(want), T, V)
        return {b: lp[j] for j, b in enumerate(want)}

    def entries(
        self, captured: dict[int, torch.Tensor], reqs: list[Request], tokens: list[list[int]], faults: Faults
    ) -> list[list[list[TokenLogprob]] | None]:
        """tokens[b]: the tokens reqs[b] commits, chosen from its rows 0 .. len - 1 -> per request, per token
        [the chosen token, then the top-n others] (None for requests without logprobs), each under its request's
        guard (faults.py)."""
        out: list[list[list[TokenLogprob]] | None] = [None] * len(reqs)
        for b, lp in captured.items():
            out[b] = faults.guard(reqs[b], self._entry, lp, reqs[b].params.logprobs or 0, tokens[b])
        return out

    def _entry(self, lp: torch.Tensor, n: int, toks: list[int]) -> list[list[TokenLogprob]]:
        """lp: [T, V] one request's log-probs; toks: its committed tokens -> per token [chosen, top-n others]."""
        at, rank, top_lp, top_ids = chosen_and_top(lp[: len(toks)], long_tensor(toks, lp.device), n)
        return [
            self._token(t, float(at[i]), int(rank[i]), top_lp[i].tolist(), top_ids[i].tolist())
            for i, t in enumerate(toks)
        ]

    def _token(
        self, token: int, logprob: float, rank: int, top_lp: list[float], top_ids: list[int]
    ) -> list[TokenLogprob]:
        row = [TokenLogprob(token, logprob, rank, self.piece(token))]
        row += [
            TokenLogprob(t, v, j + 1, self.piece(t))
            for j, (t, v) in enumerate(zip(top_ids, top_lp, strict=True))
            if t != token and math.isfinite(v)
        ]
        return row

    def piece(self, token: int) -> str:
        """The token's text decoded alone (a special token's is empty, as in the output text)."""
        text = self._pieces.get(token)
        if text is None:
            text = self._pieces[token] = self.tokenizer.decode([token], skip_special_tokens=True)
        return text
