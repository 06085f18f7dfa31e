"""Failure belongs to a request: the step's record of the requests whose own work raised.

The step works on many requests at once. Work that belongs to one request (its grammar, its logits processors,
its drafts, its statistics, its text) runs under guard(): an exception there marks that request failed and the
step goes on for the others; the engine then ends each marked request with its own error (take()). Batched work
that can be rerun (a drafter's proposals, the verify's token choice) runs under each_or_alone(): on a failure it
is rerun for each request alone, so the failure lands on the request that causes it. What is left (the target's
forward itself) fails the requests it touched, and only those.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

from .errors import InvalidRequest

T = TypeVar("T")
R = TypeVar("R")


class DeadEnd(InvalidRequest):
    """Nothing may follow the request's output: its grammar and its token lists (allowed_token_ids, bad_words)
    leave no token at the next position. Ends that request (INVALID_ARG); never a token it excluded."""

    def __init__(self):
        super().__init__(
            "no token is allowed at the next position: the guide's grammar and the request's "
            "allowed_token_ids / bad_words leave nothing to generate"
        )


class Faults:
    def __init__(self):
        self._failed: dict[int, tuple[object, Exception]] = {}  # request id -> (request, what it raised)

    def add(self, req, error: Exception) -> None:
        """req failed with error (the first error of a request is the one reported)."""
        self._failed.setdefault(req.request_id, (req, error))

    def has(self, req) -> bool:
        return req.request_id in self._failed

    def __bool__(self) -> bool:
        return bool(self._failed)

    def guard(self, req, fn: Callable[..., T], *args, default: T | None = None) -> T | None:
        """fn(*args), or default when it raised (req is then marked failed). Nothing is caught for a request
        already marked: its work is skipped."""
        if self.has(req):
            return default
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - reported to the request's client by the engine
            self.add(req, e)
            return default

    def each_or_alone(self, reqs: Sequence[R], fn: Callable[[list[R]], list[T]], default: T) -> list[T]:
        """fn(reqs) -> one result per request, called once for all; where that raises, once for each request
        alone, and a request whose own call raises is marked failed (its result: default). fn must be safe to
        call again for a request after a failed call (it changes nothing that a rerun would not overwrite)."""
        live = [r for r in reqs if not self.has(r)]
        try:
            got = dict(zip(map(id, live), fn(live), strict=True)) if live else {}
        except Exception:  # noqa: BLE001 - each request alone decides whose failure it is
            got = {id(r): self.guard(r, lambda r=r: fn([r])[0], default=default) for r in live}
        return [got.get(id(r), default) for r in reqs]

    def take(self) -> list[tuple[object, Exception]]:
        """The failed requests and their errors, in the order they failed; the record is cleared."""
        out = list(self._failed.values())
        self._failed.clear()
        return out
