"""A request's grammar state (Guide: one xgrammar matcher) and bitmask row helpers.

The step moves a Guide only in two ways:
  tentative  accept drafted tokens while filling bitmask rows, then roll back exactly that many;
  commit     accept the verified tokens, each of which must succeed (the masks guarantee it).
"""

from __future__ import annotations

import numpy as np
import torch


def bitmask_width(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def single_allowed_token(row: np.ndarray) -> int:
    """row: [W] int32 bitmask -> the token id if exactly one bit is set, else -1."""
    nz = np.flatnonzero(row)
    if nz.size != 1:
        return -1
    word = int(row[nz[0]]) & 0xFFFFFFFF
    if word & (word - 1):
        return -1
    return int(nz[0]) * 32 + word.bit_length() - 1


def token_allowed(row: np.ndarray, token: int) -> bool:
    return bool((int(row[token >> 5]) >> (token & 31)) & 1)


class Guide:
    """A request's grammar state (one xgrammar matcher) plus its tentative-accept bookkeeping."""

    def __init__(self, compiled):
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)  # rollback depth is unlimited in xgrammar >= 0.2
        self.tentative = 0  # tokens accepted since the last commit, to be rolled back

    def fill(self, bitmask: torch.Tensor, index: int) -> None:
        """Write the mask for the next position (after the tentative tokens) into bitmask[index]."""
        self.matcher.fill_next_token_bitmask(bitmask, index)

    def try_tentative(self, token: int) -> bool:
        if self.matcher.accept_token(token):
            self.tentative += 1
            return True
        return False

    def legal_prefix(self, tokens: list[int]) -> int:
        """-> how many of tokens, in order, the grammar accepts after the current (tentative) state; the
        matcher is left as it was."""
        n = 0
        for t in tokens:
            if self.matcher.is_terminated() or not self.matcher.accept_token(t):
                break  # (nothing follows the stop token: do not even ask the matcher)
            n += 1
        if n:
            self.matcher.rollback(n)
        return n

    def rollback_to(self, n: int) -> None:
        """Keep only the first n tentative tokens (n <= tentative)."""
        if self.tentative > n:
            self.matcher.rollback(self.tentative - n)
            self.tentative = n

    def rollback(self) -> None:
        if self.tentative:
            self.matcher.rollback(self.tentative)
            self.tentative = 0

    def commit(self, token: int) -> None:
        assert self.tentative == 0, "commit with tentative tokens still accepted"
        if not self.matcher.accept_token(token):
            raise AssertionError(f"committed token {token} violates the grammar: masks and matcher disagree")

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()
