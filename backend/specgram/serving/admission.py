"""Backpressure: the bound on requests waiting for a KV slot, and the per-request time limits.

Waiting = handed to the engine thread and not yet holding a slot (still in the loop's inbox, or in the
scheduler's waiting queue). Over the bound a new request is refused at once, before it reaches the engine:
a fast refusal lets a client or a load balancer go elsewhere, where a long queue would only add latency.
Neither class locks: EngineLoop calls Admission under its own lock, and Deadlines on the engine thread only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..request import Request


class Admission:
    def __init__(self, max_requests: int | None, max_prompt_tokens: int | None):
        self.max_requests = max_requests  # None = no bound
        self.max_prompt_tokens = max_prompt_tokens  # None = no bound
        self.closed: str | None = None  # once set, why every new request is refused
        self._waiting: dict[int, Request] = {}
        self.prompt_tokens = 0  # prompt tokens of the waiting requests

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def adapters(self) -> frozenset[int]:
        """The LoRA adapters (ids; -1, the base model, left out) of the waiting requests."""
        return frozenset(r.adapter for r in self._waiting.values() if r.adapter >= 0)

    def refusal(self, req: Request) -> str | None:
        """Why req cannot wait now (None: it can)."""
        if self.closed is not None:
            return self.closed
        if self.max_requests is not None and len(self._waiting) >= self.max_requests:
            return (
                f"the server is at capacity: {len(self._waiting)} requests are already waiting for a slot "
                f"(max_waiting_requests = {self.max_requests}); retry later"
            )
        tokens = len(req.prompt_ids)
        if (
            self.max_prompt_tokens is not None
            and self._waiting
            and self.prompt_tokens + tokens > self.max_prompt_tokens
        ):
            return (
                f"the server is at capacity: the waiting requests hold {self.prompt_tokens} prompt tokens and "
                f"this one has {tokens} (max_waiting_prompt_tokens = {self.max_prompt_tokens}); retry later"
            )
        return None

    def enter(self, req: Request) -> None:
        self._waiting[req.request_id] = req
        self.prompt_tokens += len(req.prompt_ids)

    def settle(self) -> None:
        """Forget the requests that now hold a slot (after a step)."""
        for r in [r for r in self._waiting.values() if r.slot >= 0]:
            self.leave(r.request_id)

    def leave(self, request_id: int) -> None:
        """Forget a request (it got a slot, or it ended while waiting)."""
        req = self._waiting.pop(request_id, None)
        if req is not None:
            self.prompt_tokens -= len(req.prompt_ids)


@dataclass(frozen=True)
class Limit:
    at: float  # time.monotonic() deadline
    what: str  # where it comes from, for messages: "max_queue_delay_ms = 500"


class Deadlines:
    """Each open request's time limits: `queue` applies while it waits for a slot, `run` until it ends.
    Checked once per step; a step in which no limit can have passed costs one comparison."""

    def __init__(self):
        self._limits: dict[int, tuple[Limit | None, Limit | None]] = {}
        self._next = math.inf  # no limit passes before this (a lower bound: it may be stale, never late)

    def add(self, request_id: int, queue: Limit | None, run: Limit | None) -> None:
        if queue is None and run is None:
            return
        self._limits[request_id] = (queue, run)
        self._next = min(self._next, *(lim.at for lim in (queue, run) if lim is not None))

    def discard(self, request_id: int) -> None:
        self._limits.pop(request_id, None)

    def passed(self, now: float, waiting) -> list[tuple[int, Limit]]:
        """-> (request id, the limit it passed) for each request past the limit of its state, which is forgotten;
        waiting(request id) says whether it still waits for a slot."""
        if now < self._next:
            return []
        passed, self._next = [], math.inf
        for rid, (queue, run) in list(self._limits.items()):
            candidates = [lim for lim in ((queue, run) if waiting(rid) else (run,)) if lim is not None]
            if not candidates:  # running, and only a queue limit: nothing left to check
                del self._limits[rid]
                continue
            first = min(candidates, key=lambda lim: lim.at)
            if now >= first.at:
                passed.append((rid, first))
                del self._limits[rid]
            else:
                self._next = min(self._next, first.at)
        return passed
