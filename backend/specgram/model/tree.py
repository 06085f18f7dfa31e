"""Trees of drafts as a forward sees them. A verify row may be a tree: parents[i] is the row index of token i's
parent (-1 for the row's first token, the request's last committed one; a parent always comes before its
children). The row's tokens still sit at consecutive cache positions (storage), but each token attends only to
the committed tokens and its own ancestors, and its position (rotary, sliding window) is its depth past the
row's first token: exactly what it would get as the last token of its own path verified as a plain row. The
kernels take this as one ancestor mask per token (kernels/tree.h); the PyTorch forward as an attention mask and
position ids built from the same masks. A chain (parents[i] = i - 1) is a plain row.
"""

from __future__ import annotations

import ctypes

import torch

from ..drafting.proposal import depths  # noqa: F401 (each token's depth: also the forward's)

MAX_ROW = 64  # tokens in one tree row: an ancestor mask names 64 positions
ALL = (1 << 64) - 1  # every bit: causal attention


def is_chain(parents: list[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


def plain(trees: list[list[int] | None] | None) -> bool:
    """Whether no row of a forward is a tree (each None or a chain)."""
    return trees is None or all(t is None or is_chain(t) for t in trees)


def ancestor_masks(parents: list[int]) -> list[int]:
    """-> per token a 64-bit mask: bit b set = it attends to the token b rows before it (bit 0: itself); bits past
    the row's first token are set (the committed positions before the row: always attended)."""
    if len(parents) > MAX_ROW:
        raise ValueError(f"a tree row holds at most {MAX_ROW} tokens, got {len(parents)}")
    depths(parents)  # validates
    masks = []
    for i in range(len(parents)):
        mask, j = ALL, i
        keep = set()
        while j >= 0:
            keep.add(j)
            j = parents[j]
        for b in range(1, i + 1):
            if i - b not in keep:
                mask &= ~(1 << b)
        masks.append(mask)
    return masks


def flat_masks(trees: list[list[int] | None] | None, lengths: list[int]) -> ctypes.Array | None:
    """Every token's ancestor mask, the rows one after another, as the uint64 array the kernels take (rows
    without a tree: every bit); None where no row is a tree."""
    if plain(trees):
        return None
    flat: list[int] = []
    for t, n in zip(trees, lengths, strict=True):
        flat += ancestor_masks(t) if t is not None else [ALL] * n
    return (ctypes.c_uint64 * len(flat))(*flat)


def tensors(trees: list[list[int] | None], width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row parents (None: a plain row) -> (ancestor masks as int64 two's complement, depths), both [B, width],
    for the PyTorch forward: padding entries are plain (every bit, depth = index)."""
    bits = torch.full((len(trees), width), -1, dtype=torch.long)
    depth = torch.arange(width).repeat(len(trees), 1)
    for b, t in enumerate(trees):
        if t is not None:
            bits[b, : len(t)] = torch.tensor([m - (1 << 64) if m >> 63 else m for m in ancestor_masks(t)])
            depth[b, : len(t)] = torch.tensor(depths(t))
    return bits.to(device, non_blocking=True), depth.to(device, non_blocking=True)


def walk(parents: list[int], tokens: list[int], choice: list[int]) -> tuple[list[int], int]:
    """The target's path through a verified tree: from the first token, follow the child whose token is the
    target's own choice there (choice[i]: its token after row i), while there is one. -> (the row indices of the
    accepted tokens, in order; the target's token after the last of them). With a chain this is the longest
    prefix of drafts the target agrees with, as a plain row's verify; siblings hold distinct tokens."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    path, node = [], 0
    while True:
        nxt = next((c for c in children.get(node, ()) if tokens[c] == choice[node]), None)
        if nxt is None:
            return path, choice[node]
        path.append(nxt)
        node = nxt
