"""Preallocated KV cache indexed by (slot, position).

Layout per layer: k, v: [num_slots, num_kv_heads, max_seq_len, head_dim]; the native CPU forward keeps k as
[num_slots, num_kv_heads, head_dim, max_seq_len] instead (positions last: its attention loads 16 positions
per vector), and reads and writes the cache itself (kernels/attention.c).
A row's valid length lives with its request (Request.cache_len), not here: entries at positions >= that
length are never read (the attention mask hides them), so rolling back rejected draft tokens is free —
the next write simply overwrites them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class WriteIndex:
    """Where the new tokens of a batch go, computed once per forward and reused by every layer."""

    batch_idx: torch.Tensor  # [N] row in the batch of each valid new token
    step_idx: torch.Tensor  # [N] its position within the row's new tokens
    slot_idx: torch.Tensor  # [N] its cache slot
    pos_idx: torch.Tensor  # [N] its absolute position


def make_write_index(slots: torch.Tensor, starts: torch.Tensor, num_new: torch.Tensor, width: int) -> WriteIndex:
    """slots, starts, num_new: [B]; width: T, the padded number of new tokens per row."""
    steps = torch.arange(width, device=slots.device)
    valid = steps[None, :] < num_new[:, None]  # [B, T]
    b, t = valid.nonzero(as_tuple=True)
    return WriteIndex(b, t, slots[b], starts[b] + t)


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        k_positions_last: bool = False,
    ):
        shape = (num_layers, num_slots, num_kv_heads, max_seq_len, head_dim)
        k_shape = (num_layers, num_slots, num_kv_heads, head_dim, max_seq_len) if k_positions_last else shape
        self.k = torch.zeros(k_shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.k_positions_last = k_positions_last

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Positions 0 .. n-1 of slot src -> slot dst, every layer (a reused prompt prefix)."""
        if self.k_positions_last:
            self.k[:, dst, :, :, :n] = self.k[:, src, :, :, :n]
        else:
            self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]

    def move(self, slot: int, src: list[int], dst: list[int]) -> None:
        """Positions src -> dst of one slot, every layer (a tree row's accepted path, to consecutive positions).
        The sources are gathered before anything is written, so src and dst may overlap."""
        s, d = torch.tensor(src, device=self.v.device), torch.tensor(dst, device=self.v.device)
        if self.k_positions_last:
            self.k[:, slot, :, :, d] = self.k[:, slot, :, :, s]
        else:
            self.k[:, slot, :, d] = self.k[:, slot, :, s]
        self.v[:, slot, :, d] = self.v[:, slot, :, s]

    def write(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, idx: WriteIndex) -> None:
        """k_new, v_new: [B, H_kv, T, D]; only the valid (row, step) pairs of idx are stored."""
        self.k[layer][idx.slot_idx, :, idx.pos_idx] = k_new[idx.batch_idx, :, idx.step_idx]
        self.v[layer][idx.slot_idx, :, idx.pos_idx] = v_new[idx.batch_idx, :, idx.step_idx]

    def read(self, layer: int, slots: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """-> k, v: [B, H_kv, length, D] for the given slots (a copy of only the first `length` positions)."""
        return (
            self.k[layer, :, :, :length].index_select(0, slots),
            self.v[layer, :, :, :length].index_select(0, slots),
        )
