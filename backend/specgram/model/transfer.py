"""Host -> device copies that do not stall the host.

A copy from ordinary (pageable) host memory to a CUDA device blocks the host until it is done, and it is done
only after everything queued before it on the stream: in the middle of a step that is a hidden sync. From
pinned memory the copy is queued like a kernel and the host goes on. Torch's caching host allocator keeps
the pinned block alive until the copy has run. On CPU these are no-ops.
"""

from __future__ import annotations

import torch


def h2d(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor on `device`, without blocking the host."""
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def long_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    """Python ints -> int64 tensor on `device` (built on the host, copied without blocking)."""
    return h2d(torch.tensor(values, dtype=torch.long), device)


def right_pad(rows: list[list[int]], n_rows: int | None = None) -> torch.Tensor:
    """Ragged token rows -> long [n_rows (default len(rows)), T] on the host, right-padded with 0 (padding
    rows are all 0)."""
    tokens = torch.zeros(n_rows or len(rows), max(map(len, rows)), dtype=torch.long)
    for b, row in enumerate(rows):
        tokens[b, : len(row)] = torch.tensor(row)
    return tokens
