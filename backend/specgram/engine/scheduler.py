"""Admission: the waiting queue, the free KV slots, the per-step prefill budget, and requests waiting for a
grammar.

Invariant: a request is in exactly one of `waiting` (no slot) and `running` (holds `slot`), or in neither
once finished. A slot's KV rows are never cleared: the next request simply overwrites them.
Chunked prefill: an admitted request's prompt enters the cache over as many steps as the budget needs
(max_prefill_tokens prompt tokens per step, first come first served), so a long prompt never stalls the
running streams for more than one chunk, and the earliest request gets its first token first.
Where a prefill forward costs in proportion to its tokens (compute-bound, as on a CPU), a step also ends at a
prompt's end once it holds `pack_tokens`: a prompt then gets its first token as soon as its own prefill is done
instead of when the whole budget's worth is (docs/performance.md, Prefill scheduling).
Where a forward costs about the same for few or many tokens (a GPU), pack_tokens = the budget packs steps full.
"""

from __future__ import annotations

import random
import time
from collections import deque

import torch

from ..errors import InvalidRequest
from ..grammar.guide import Guide
from ..request import Request
from .prefix_cache import PrefixCache


class Scheduler:
    def __init__(
        self, max_slots: int, max_prefill_tokens: int, prefix: PrefixCache | None = None, pack_tokens: int | None = None
    ):
        self.max_prefill_tokens = max_prefill_tokens
        self.pack_tokens = max_prefill_tokens if pack_tokens is None else min(pack_tokens, max_prefill_tokens)
        self.prefix = prefix  # picks the free slot already holding the longest prompt prefix
        self.free_slots: list[int] = list(range(max_slots))[::-1]
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def find(self, request_id: int) -> Request | None:
        return self.running.get(request_id) or next((r for r in self.waiting if r.request_id == request_id), None)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def only_waiting_for_grammars(self) -> bool:
        return bool(self.waiting) and not self.running and all(r.pending_grammar is not None for r in self.waiting)

    def admit(self) -> tuple[list[Request], list[tuple[Request, str]]]:
        """Move waiting requests into free slots (their prompts are prefilled by prefill_chunks()). A request
        whose grammar is still compiling keeps waiting without holding up the ones behind it.
        -> (admitted, [(request whose grammar failed to compile, its error)]); the failed ones are checked even
        without a free slot, so that their errors go out at once."""
        batch: list[Request] = []
        failed: list[tuple[Request, str]] = []
        for req in list(self.waiting):
            if req.pending_grammar is not None:
                try:
                    compiled = req.pending_grammar.result()
                except InvalidRequest as e:
                    failed.append((req, str(e)))
                    continue
                if compiled is None:
                    continue
                req.guide = Guide(compiled)
                req.pending_grammar = None
            if not self.free_slots:
                continue
            self.waiting.remove(req)
            if self.prefix:
                req.slot = self.prefix.choose_free_slot(req.prompt_ids, self.free_slots, req.scope)
                self.free_slots.remove(req.slot)
                req.cache_len = req.cached_prompt_tokens = self.prefix.attach(req.slot, req.prompt_ids, req.scope)
            else:
                req.slot = self.free_slots.pop()
            req.admitted = time.monotonic()
            req.seed = req.params.seed if req.params.seed is not None else random.getrandbits(63)
            req.generator = torch.Generator().manual_seed(req.seed)  # rejection sampling's uniforms
            self.running[req.request_id] = req
            batch.append(req)
        return batch, failed

    def prefill_chunks(self) -> list[tuple[Request, int]]:
        """This step's prompt chunks: (request, tokens) for running requests still prefilling, in admission order,
        max_prefill_tokens in all; a chunk ends a prompt or uses the rest of the budget. The step ends early at
        a prompt's end once it holds pack_tokens."""
        budget, chunks = self.max_prefill_tokens, []
        for req in self.running.values():  # insertion order = admission order
            if budget == 0 or self.max_prefill_tokens - budget >= self.pack_tokens:
                break
            if req.prefilling and not req.finished:
                n = min(len(req.prompt_ids) - req.cache_len, budget)
                chunks.append((req, n))
                budget -= n
        return chunks

    def remove(self, req: Request) -> bool:
        """Take a finished request out; its slot is free for the next admission. -> whether it was running."""
        if self.running.pop(req.request_id, None) is not None:
            self.free_slots.append(req.slot)
            return True
        if req in self.waiting:
            self.waiting.remove(req)
        return False
