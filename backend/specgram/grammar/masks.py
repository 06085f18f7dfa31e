"""Bitmask rows of one decode step, and applying them to draft and target logits.

Row (slot, i) holds the grammar mask for the request in that KV slot, at its position i of this step:
position 0 follows the last committed token, position i follows draft token i-1, and position k (after the
last draft) is the bonus row; a tree's branch drafts follow, each at its verify row index. Draft logits at
position i and target logits at verify row i get the same row, so drafts are always legal and draft/target
probabilities live on the same support.
"""

from __future__ import annotations

import numpy as np
import torch

from .guide import Guide, bitmask_width, single_allowed_token, token_allowed


def apply_native(lib, logits: torch.Tensor, buf: torch.Tensor, rows: list[int], src: list[int]) -> None:
    """logits [N, V] float32 on CPU (rows contiguous), rows[i] masked in place by mask row buf[src[i]] (int32 [R, W]):
    the native kernel (kernels/mask.c), the same values as xgrammar's CPU kernel at a twentieth of its time."""
    at, take = (torch.tensor(v, dtype=torch.int64) for v in (rows, src))
    lib.specgram_apply_bitmask(
        logits.data_ptr(), logits.stride(0), logits.shape[1], buf.data_ptr(), buf.stride(0), buf.shape[1],
        at.data_ptr(), take.data_ptr(), len(rows),
    )  # fmt: skip


class StepMasks:
    def __init__(
        self, vocab_size: int, max_slots: int, max_draft_len: int, device: torch.device, branches: int = 0, lib=None
    ):
        """branches: a verify row's tree nodes past its line at most (their rows follow the line's). lib: the native
        CPU kernels (model/kernels) where the forward runs on them, to apply masks to CPU logits (apply_native);
        None: xgrammar's kernel everywhere."""
        self.lib = lib
        self.vocab = vocab_size
        self.width = bitmask_width(vocab_size)
        self.stride = max_draft_len + 1 + branches
        # int32 [slots * (k_max + 1), W] on CPU: xgrammar fills host memory
        self.buf = torch.full((max_slots * self.stride, self.width), -1, dtype=torch.int32)
        # the rows one apply() needs, at their logits rows (a verify has <= max_slots * (k_max + 1) rows)
        self.stage = torch.full(
            (max_slots * self.stride, self.width), -1, dtype=torch.int32, pin_memory=device.type == "cuda"
        )
        self._copy_done = None  # CUDA event: the last copy out of `stage` has run
        self.device = device

    def row(self, slot: int, i: int) -> int:
        return slot * self.stride + i

    def fill(self, slot: int, guide: Guide) -> np.ndarray:
        """Fill row (slot, guide.tentative) from the guide's current state; -> that row as numpy (a view)."""
        r = self.row(slot, guide.tentative)
        guide.fill(self.buf, r)
        return self.buf[r].numpy()

    def forced_prefix(self, slot: int, guide: Guide, k: int, strings: bool = True) -> list[int]:
        """Tokens the grammar forces next, up to k, accepted tentatively (each position's row filled): a
        position with exactly one legal token, and with `strings` the string the grammar forces from here (a
        key name and '": "', closing brackets, the rest of an enum literal) in xgrammar's own greedy
        tokenization (find_jump_forward_tokens). The model may tokenize that string otherwise; the verify
        pass decides, so output stays exact either way."""
        out: list[int] = []
        row = self.fill(slot, guide)
        while len(out) < k and not guide.terminated:
            t = single_allowed_token(row)
            run = [t] if t >= 0 else guide.matcher.find_jump_forward_tokens() if strings else []
            before = len(out)
            for tok in run[: k - len(out)]:
                if not token_allowed(row, tok) or not guide.try_tentative(tok):
                    break
                out.append(tok)
                if guide.terminated:
                    break
                row = self.fill(slot, guide)
            if len(out) == before:
                break
        return out

    def seal(self, slot: int, guide: Guide, tokens: list[int]) -> int:
        """After drafting: tentatively accept the drafts not yet accepted (n-gram proposals), stopping at
        the first illegal one; fill the bonus row; roll the matcher back. -> how many drafts stay legal."""
        n = guide.tentative
        while (
            n < len(tokens)
            and not guide.terminated
            and token_allowed(self.fill(slot, guide), tokens[n])
            and guide.try_tentative(tokens[n])
        ):
            n += 1
        if guide.terminated:  # the drafts end with the stop token: nothing may follow it,
            self.buf[self.row(slot, n)] = -1  # and the bonus token is never committed; leave it unmasked
        else:
            self.fill(slot, guide)  # the row after the last draft (bonus position)
        guide.rollback()
        return n

    def seal_path(self, slot: int, guide: Guide, path: list[int], row: int) -> bool:
        """A tree node's mask (speculation/trees.py): whether the grammar accepts `path` (the drafts from the
        committed tokens to the node, its own last) and, if so, row (slot, row) filled after it (all allowed
        where the path ends the grammar: nothing follows it). The matcher is rolled back either way."""
        ok = True
        for t in path:
            if guide.terminated or not guide.try_tentative(t):
                ok = False
                break
        if ok and guide.terminated:
            self.buf[self.row(slot, row)] = -1
        elif ok:
            guide.fill(self.buf, self.row(slot, row))
        guide.rollback()
        return ok

    def rows_for(self, entries: list[tuple[int, int, int]]) -> tuple[torch.Tensor, list[int]]:
        """entries: (logits row, slot, i) -> (mask [max logits row + 1, W] holding row (slot, i) at each entry's logits
        row, the logits rows to mask). Rows not listed are left stale: the kernel reads only the listed ones.
        The mask is a view of a staging buffer reused by the next call (pinned on CUDA)."""
        idx = [e[0] for e in entries]
        if self._copy_done is not None:  # the previous async copy out of the staging buffer must be done
            self._copy_done.synchronize()  # (already true in practice: every step syncs on its results)
            self._copy_done = None
        self.stage[idx] = self.buf[[self.row(slot, i) for _, slot, i in entries]]
        return self.stage[: max(idx) + 1], idx

    def apply(self, logits: torch.Tensor, entries: list[tuple[int, int, int]]) -> None:
        """logits: [N, V] (float32, on self.device), masked in place at the given rows: on CPU by the native kernel
        where there is one (reading the rows where they were filled), else by xgrammar's kernel (its CUDA kernel on
        GPU: the mask goes over in one non-blocking copy from pinned memory)."""
        if not entries:
            return
        native = self.lib is not None and logits.device.type == "cpu" and logits.dtype == torch.float32
        if native and logits.dim() == 2 and logits.stride(1) == 1:
            apply_native(self.lib, logits, self.buf, [e[0] for e in entries], [self.row(s, i) for _, s, i in entries])
            return
        import xgrammar as xgr

        mask, idx = self.rows_for(entries)
        if logits.device.type == "cuda":
            mask = mask.to(logits.device, non_blocking=True)
            self._copy_done = torch.cuda.Event()
            self._copy_done.record()
        xgr.apply_token_bitmask_inplace(logits, mask, indices=idx)
