"""Draft-model prompt reads put off for guided requests until the request's own steps say the model would pay.

A guided request under auto k often drafts well with no draft model at all: its grammar forces keys and
punctuation, and its lookups copy the values from its prompt (an extraction: the prompt holds the record). There
the draft model's read of the prompt at admission (a prefill of the whole prompt, a fifth to a quarter of the
target's cost per token beside a 4-bit target) buys nothing, and at one stream it was a fifth of such a request's
time (docs/performance.md, "Grammar masks and prompt reads beside an int4 target"). So a guided auto request that
the planner would read at admission (forward_depths.readers) is deferred instead: it drafts with its free drafters
for CHECK_STEPS steps, then the model reads its prompt (and catches up on its output at its next draft) only where
the model's expected tokens per second (forward_depths.value) beat what the request measured without it over those
steps; else it is weighed again after as many steps more. Free requests are read as before: a free request's
lookups rarely carry it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..request import Request

CHECK_STEPS = 4  # steps a deferred request drafts without the model between two weighings


@dataclass
class Tally:
    """A deferred request's steps since its last weighing: the draft model's name, the steps, the tokens they
    committed and the verify rows they ran."""

    model: str
    steps: int = 0
    tokens: int = 0
    rows: int = 0


class DeferredReads:
    def __init__(self) -> None:
        self.pending: dict[int, Tally] = {}  # request id -> its tally

    @staticmethod
    def wants(req: Request) -> bool:
        """Whether req's read is put off rather than done at admission: guided, under auto k."""
        return req.guide is not None and req.params.auto_draft

    def defer(self, model: str, reqs: list[Request]) -> None:
        for r in reqs:
            self.pending[r.request_id] = Tally(model)

    def observe(self, req: Request, rows: int, tokens: int) -> Tally | None:
        """After a verify step of req (rows verify rows, tokens committed): -> its tally where a weighing is due
        (CHECK_STEPS steps since the last), else None."""
        t = self.pending.get(req.request_id)
        if t is None:
            return None
        t.steps, t.tokens, t.rows = t.steps + 1, t.tokens + tokens, t.rows + rows
        return t if t.steps >= CHECK_STEPS else None

    def again(self, req: Request) -> None:
        """Weighed and still not read: count afresh."""
        self.pending[req.request_id] = Tally(self.pending[req.request_id].model)

    def forget(self, req: Request) -> None:
        self.pending.pop(req.request_id, None)


def free_rate(t: Tally, cost) -> float:
    """A tally's tokens per second, its steps priced by the fitted step cost (cost: verify rows -> seconds) at
    their mean verify rows: the rate the request drafts at without the model, as forward_depths.value prices one
    with it."""
    return t.tokens / (t.steps * cost(t.rows / t.steps))
