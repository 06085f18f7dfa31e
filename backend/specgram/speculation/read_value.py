"""What a draft model's prompt read has been worth, learned from the requests it read: the seconds its drafts
saved over the lookup drafts they displaced, net of the seconds spent drafting them, per output token, by kind
of request (guided or free). A new auto request's prompt is read only where that worth over the tokens it may
still produce exceeds the read (forward_depths.readers).

Why: the step-cost questions of costs.py weigh a draft model against no drafts at all. Where lookups already
draft well (guided extraction copies the prompt's values and the schema's keys) the model wins few steps, and
its drafts there add little to what the lookup would have given; its prompt read (a prefill by the draft model)
then costs more than they save. Measured on the requests themselves: per step the model's line wins, its
accepted drafts less the shadow lookup's hits (planner._observe_shadow's judgement) are tokens the read bought,
each worth a step's share of the verify seconds; the draft forwards charged to the request are what they cost.
A kind whose read does not pay still reads one request in PROBE_EVERY, so the estimate follows the workload.
"""

from __future__ import annotations

from ..drafting import registry
from ..request import Request
from .rows import VerifyRow

DECAY = 0.7  # per finished request: the kind's worth follows the last few requests read
PROBE_EVERY = 8  # of a kind's auto requests not read, every PROBE_EVERY-th is read (its worth's evidence)


def kind(req: Request) -> str:
    """The class a request's read worth is pooled in: guided requests draft from different lookups (schema, the
    prompt's values) than free ones."""
    return "guided" if req.guide is not None else "free"


class ReadValue:
    def __init__(self) -> None:
        self.open: dict[int, list[float]] = {}  # request id -> [seconds saved, seconds spent] since its read
        self.worth: dict[str, float] = {}  # kind -> net seconds per output token, decayed mean over requests
        self.skipped: dict[str, int] = {}  # kind -> auto requests not read since the last probe

    def started(self, reqs: list[Request]) -> None:
        """The model read these auto requests' prompts: their drafts' worth is tallied until release."""
        for r in reqs:
            self.open[r.request_id] = [0.0, 0.0]

    def spent(self, req: Request, seconds: float) -> None:
        """Draft-model seconds charged to req (its share of a draft call)."""
        if req.request_id in self.open:
            self.open[req.request_id][1] += seconds

    def gained(self, req: Request, tokens: int, token_s: float) -> None:
        """The model's drafts gave `tokens` more accepted tokens than the lookup would have (may be negative),
        each worth token_s seconds of the step."""
        if req.request_id in self.open:
            self.open[req.request_id][0] += tokens * token_s

    def finished(self, req: Request) -> None:
        """req ended: its net seconds per output token join its kind's worth."""
        tally = self.open.pop(req.request_id, None)
        if tally is None or not req.output_ids:
            return
        value = (tally[0] - tally[1]) / len(req.output_ids)
        old = self.worth.get(kind(req))
        self.worth[kind(req)] = value if old is None else DECAY * old + (1 - DECAY) * value

    def pays(self, req: Request, tokens_left: int, read_s: float) -> bool:
        """Whether to read req's prompt: its kind's worth over tokens_left exceeds read_s (the read's measured
        seconds), no worth learned yet, or this is a probe (one skipped request in PROBE_EVERY). Counts skips."""
        k = kind(req)
        if k not in self.worth or self.worth[k] * tokens_left > read_s:
            return True
        self.skipped[k] = self.skipped.get(k, 0) + 1
        if self.skipped[k] >= PROBE_EVERY:
            self.skipped[k] = 0
            return True
        return False

    def settle(self, rows: list[VerifyRow], token_s: float) -> None:
        """After a verify: each read request whose line the model drafted gained its accepted model drafts less
        what its shadow lookup would have had accepted (its drafts after any forced prefix matching the
        committed tokens), each worth token_s (a step's seconds per request)."""
        model = registry.forward_sources()
        for v in rows:
            p = v.proposal
            if v.req.request_id not in self.open or model.isdisjoint(p.sources):
                continue
            mine = sum(1 for s in p.sources[: v.line_accepted] if s in model)
            theirs = 0
            if v.shadow is not None:
                hits = lookup_hits(v.shadow.tokens, v.committed)
                theirs = sum(1 for s in v.shadow.sources[:hits] if s != registry.FORCED)
            self.gained(v.req, mine - theirs, token_s)


def lookup_hits(drafts: list[int], committed: list[int]) -> int:
    """How many of drafts lead the committed tokens (what the target would have accepted of them)."""
    n = min(len(drafts), len(committed))
    return next((j for j in range(n) if drafts[j] != committed[j]), n)
