"""Sampling noise keyed by (seed, output position).

A sampled request's token at output position t is argmax_v (logits_v / T + G_v) over the support that top-k,
top-p, the grammar mask and min_tokens leave (Gumbel-max: with G_v iid standard Gumbel this is an exact sample
of softmax(logits / T) on that support), and G comes from (seed, t) alone. So the token is a function of the
seed, the position and the distribution there: not of how many random numbers were drawn before, how many
drafts were verified, which drafter proposed them, or what else was batched. A draft equal to that token is
accepted, as under greedy decoding; a draft model that drafts with the same noise on its own distribution is
accepted often (coupled drafting).

G for (seed, t): Philox-4x64 (a counter-based generator, numpy's) keyed by the 128-bit pair seed * 2^64 + t,
one raw 64-bit word per vocabulary entry (a stable stream: no sampling algorithm between the words and G), the
top 52 bits as u = (k + 1/2) / 2^52 in (0, 1) exactly, then -log(-log u) in float64 (finite: at most ~36.7).
Computed on the CPU, so the same on every device and thread count, and kept per (seed, t) while it may be
needed again (NoiseRows): a draft model's row is its verify row's.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

_SHIFT = np.uint64(12)  # 64-bit words -> their top 52 bits
_SCALE = 2.0**-52


def gumbel_of_words(raw: np.ndarray) -> np.ndarray:
    """uint64 words -> float64 standard Gumbel values, finite for every word."""
    u = ((raw >> _SHIFT).astype(np.float64) + 0.5) * _SCALE  # (k + 1/2) / 2^52: exact, in (0, 1)
    return -np.log(-np.log(u))


def gumbel_row(seed: int, position: int, vocab: int) -> torch.Tensor:
    """-> [vocab] float32 standard Gumbel noise of (seed, position): seed in [0, 2^64), position >= 0."""
    raw = np.random.Philox(key=(seed << 64) | position).random_raw(vocab)
    return torch.from_numpy(gumbel_of_words(raw)).float()


class NoiseRows:
    """Gumbel rows by (seed, position), the most recently used kept up to `max_bytes`."""

    def __init__(self, vocab: int, max_bytes: int = 64 << 20):
        self.vocab = vocab
        self.max_rows = max(1, max_bytes // (4 * vocab))
        self._rows: OrderedDict[tuple[int, int], torch.Tensor] = OrderedDict()

    def get(self, keys: list[tuple[int, int]]) -> torch.Tensor:
        """keys: (seed, position) per row -> [len(keys), vocab] float32 on the CPU."""
        out = []
        for key in keys:
            row = self._rows.get(key)
            if row is None:
                row = self._rows[key] = gumbel_row(*key, self.vocab)
                while len(self._rows) > self.max_rows:
                    self._rows.popitem(last=False)
            else:
                self._rows.move_to_end(key)
            out.append(row)
        return torch.stack(out) if out else torch.empty(0, self.vocab)


def gumbel_argmax(scaled: torch.Tensor, support: torch.Tensor | None, noise: torch.Tensor) -> torch.Tensor:
    """scaled: [N, V] logits / temperature (-inf where masked); support: [N, V] bool or None (= the finite
    entries); noise: [N, V] -> [N] argmax of scaled + noise over the support."""
    scores = scaled + noise
    allowed = support if support is not None else torch.isfinite(scaled)
    return scores.masked_fill(~allowed, float("-inf")).argmax(dim=-1)
