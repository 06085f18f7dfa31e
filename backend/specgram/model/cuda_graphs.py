"""CUDA graphs for the small forwards (decode, verify, draft steps): one graph per (batch bucket, width).

A decode or verify forward of a 135M-8B model at small batch is dominated by kernel launches on a fast GPU;
replaying a captured graph launches them all at once. Graphs need fixed shapes and addresses, so the forward
they capture is ModelRunner.forward_static: every row padded to the bucket, every (row, step) KV entry written
(padding lands past the row's valid length, or in the cache's scratch slot for padding rows), attention over
the whole cache row. Buckets: batch 1, 2, 4, 8, ... up to max_slots; width = k + 1 exactly (1 .. max_width).
Graphs are captured lazily on first use (a capture costs about one forward plus the warm-up), and are on
only with the engine setting cuda_graphs = 1; a shape whose capture fails runs the same path eagerly.
The graphs of one runner share a memory pool: a graph's output [bucket, T, V] is valid until that runner's
next forward (the engine consumes verify logits, and copies draft picks, before then).
Known costs, not yet measured on a GPU: attention reads the whole cache row (max_seq_len + headroom), not the
used length, so long max_seq_len makes each replay read more than an eager forward (a length bucket in the
graph key would fix it); each graph keeps its own fp32 output (bucket x T x V).

On CPU nothing is captured: the same padded static path runs eagerly. That is how the CPU tests cover the
bucketing, padding and static forward that the graphs replay on GPU.
"""

from __future__ import annotations

import logging

import torch

from .transfer import h2d, right_pad

log = logging.getLogger(__name__)


def batch_bucket(b: int, max_batch: int) -> int:
    """Smallest power of two >= b, capped at max_batch (which is always a bucket)."""
    bucket = 1
    while bucket < b:
        bucket *= 2
    return min(bucket, max_batch)


def pad_rows(rows: list[list[int]], slots: list[int], starts: list[int], bucket: int, scratch_slot: int):
    """Ragged rows -> host tensors of the bucket's shape: tokens [bucket, T] (right-padded with 0), slots,
    starts, num_new [bucket]. Padding rows feed one token at position 0 of the scratch slot."""
    tokens = right_pad(rows, bucket)
    pad = bucket - len(rows)
    slots_t = torch.tensor(list(slots) + [scratch_slot] * pad, dtype=torch.long)
    starts_t = torch.tensor(list(starts) + [0] * pad, dtype=torch.long)
    num_new = torch.tensor([len(r) for r in rows] + [1] * pad, dtype=torch.long)
    return tokens, slots_t, starts_t, num_new


class _Graph:
    """One captured forward: static inputs, the graph, its static output [bucket, T, V]."""

    def __init__(self, runner, bucket: int, width: int, pool):
        dev = runner.device
        self.tokens = torch.zeros(bucket, width, dtype=torch.long, device=dev)
        self.slots = torch.full((bucket,), runner.scratch_slot, dtype=torch.long, device=dev)
        self.starts = torch.zeros(bucket, dtype=torch.long, device=dev)
        args = (self.tokens, self.slots, self.starts)
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # warm-up (lazy inits, autotuning) off the capture
            for _ in range(2):
                runner.forward_static(*args)  # writes only the scratch slot
        torch.cuda.current_stream(dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = runner.forward_static(*args)

    def replay(self, tokens, slots, starts) -> torch.Tensor:
        for static, host in ((self.tokens, tokens), (self.slots, slots), (self.starts, starts)):
            static.copy_(h2d(host, static.device), non_blocking=True)
        self.graph.replay()
        return self.out


class GraphedForward:
    """ModelRunner's small forwards through captured graphs (CUDA) or the same static path eagerly (CPU)."""

    def __init__(self, runner, max_batch: int, max_width: int):
        self.runner = runner
        self.max_batch = max_batch
        self.max_width = max_width
        self.graphs: dict[tuple[int, int], _Graph | None] = {}  # None: capture failed, runs eagerly
        self.pool = torch.cuda.graph_pool_handle() if runner.device.type == "cuda" else None

    def handles(self, batch: int, width: int) -> bool:
        return batch <= self.max_batch and width <= self.max_width

    def forward(self, rows: list[list[int]], slots: list[int], starts: list[int], last_only: bool) -> torch.Tensor:
        """Same contract as ModelRunner.forward_rows (logits [B, V] or [B, T, V], float32)."""
        B, T = len(rows), max(map(len, rows))
        bucket = batch_bucket(B, self.max_batch)
        tokens, slots_t, starts_t, num_new = pad_rows(rows, slots, starts, bucket, self.runner.scratch_slot)
        key = (bucket, T)
        if self.pool is not None and key not in self.graphs:
            try:
                self.graphs[key] = _Graph(self.runner, bucket, T, self.pool)
            except Exception as e:  # noqa: BLE001 - an op that cannot be captured: this shape runs eagerly
                log.warning("CUDA graph capture failed for batch bucket %d, width %d (runs eagerly): %r", bucket, T, e)
                self.graphs[key] = None
        graph = self.graphs.get(key)
        if graph is not None:
            out = graph.replay(tokens, slots_t, starts_t)
        else:  # CPU, or a shape whose capture failed: the same path, eagerly
            dev = self.runner.device
            out = self.runner.forward_static(h2d(tokens, dev), h2d(slots_t, dev), h2d(starts_t, dev))
        out = out[:B]
        if last_only:
            last = h2d(num_new[:B] - 1, out.device)
            return out[torch.arange(B, device=out.device), last]
        return out
