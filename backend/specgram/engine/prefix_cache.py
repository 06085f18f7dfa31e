"""Prompt-prefix reuse: a new request whose prompt starts like one already in the KV cache (a shared system
prompt, the same instructions, a resent prompt) takes those positions' keys and values instead of prefilling
them again.

What the cache holds is tracked per slot: `held[slot]` = the prompt tokens whose KV sits at positions
0 .. len - 1 of that slot. A slot's prompt positions are never overwritten while its request runs (decode
and draft tokens go after the prompt), and after the request finishes they stay valid until the slot's next
request writes over them - so a finished request's prompt is reusable until its slot is taken again.

On admission the new request gets a free slot: one whose whole held prompt is a prefix of the new prompt if
there is one (reused in place: nothing is lost), else the least recently used, so that a finished prompt
stays reusable as long as possible. A longer match held by any other slot, running or free, is copied over
(all layers, one strided copy per tensor). The last prompt token is always prefilled: its logits give the
first output token.

Keys and values depend on the LoRA adapter that computed them, and a reused prompt is faster than a prefilled one
(a timing side channel: a tenant could learn that another sent a prompt): a slot's held prompt is reused only by
requests of the same scope (Request.scope: the adapter and the cache_salt; `owner[slot]`).

Exactness: reused KV equals recomputed KV bitwise only where the forward computes each token independently
of its batch and chunking (the native CPU kernels); elsewhere the reuse is off unless asked for ("on"),
because greedy output could then depend on which prompts came before.
"""

from __future__ import annotations

from ..model.kv_cache import KVCache

BASE = (-1, None)  # the scope of a request of the base model without a cache_salt (Request.scope)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    def __init__(self, cache: KVCache):
        self.cache = cache
        self.held: dict[int, list[int]] = {}
        self.owner: dict[int, tuple] = {}  # slot -> the scope (adapter, cache_salt) whose KV it holds
        self.used: dict[int, int] = {}  # slot -> when it last got a request (a counter)
        self.clock = 0

    def _held(self, slot: int, scope: tuple) -> list[int]:
        """What `slot` holds for a request of `scope` (nothing where another scope's request left it)."""
        return self.held.get(slot, []) if self.owner.get(slot, BASE) == scope else []

    def best(self, prompt: list[int], slots, scope: tuple = BASE) -> tuple[int | None, int]:
        """-> (slot, n): among `slots`, the one holding the longest prefix of `prompt` usable for it (at most
        len(prompt) - 1 tokens, left by a request of the same scope), or (None, 0)."""
        best_slot, best_n = None, 0
        limit = len(prompt) - 1
        for s in slots:
            n = min(common_prefix(self._held(s, scope), prompt), limit)
            if n > best_n:
                best_slot, best_n = s, n
        return best_slot, best_n

    def choose_free_slot(self, prompt: list[int], free: list[int], scope: tuple = BASE) -> int:
        """The free slot to give a new request: the longest one whose whole held prompt `prompt` extends (in
        place, nothing lost), else the least recently used (a never used one first)."""
        keep = [s for s in free if self._held(s, scope) and common_prefix(self.held[s], prompt) == len(self.held[s])]
        if keep:
            return max(keep, key=lambda s: len(self.held[s]))
        return min(reversed(free), key=lambda s: self.used.get(s, -1))

    def attach(self, slot: int, prompt: list[int], scope: tuple = BASE) -> int:
        """A request with `prompt` (of `scope`) now owns `slot`: fill its first positions from the best match
        anywhere (in place or copied). -> how many prompt tokens need no prefill (the request's starting cache_len)."""
        _, here = self.best(prompt, [slot], scope)
        src, n = self.best(prompt, [s for s in self.held if s != slot], scope)
        if n > here:
            self.cache.copy_prefix(src, slot, n)
        else:
            n = here
        self.held[slot], self.owner[slot] = prompt[:n], scope
        self.used[slot] = self.clock
        self.clock += 1
        return n

    def clear(self) -> None:
        """Forget every held prompt (benchmarks: each run starts cold)."""
        self.held.clear()

    def prefilled(self, slot: int, prompt: list[int], upto: int) -> None:
        """The slot now holds the KV of prompt[:upto]."""
        self.held[slot] = prompt[:upto]
