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
from .drafter import Drafter
from .rows import VerifyRow

DECAY = 0.8  # per finished request: the kind's worth follows the last few requests read
# a request that ends with fewer output tokens teaches nothing: its drafts are a few steps' worth, and a warm-up's
# first draft forwards (one-time costs) would outweigh them
MIN_TOKENS = 32
PROBE_EVERY = 8  # of a kind's auto requests not read, every PROBE_EVERY-th is read (its worth's evidence)


def kind(req: Request) -> str:
    """The class a request's read worth is pooled in: guided requests draft from different lookups (schema, the
    prompt's values) than free ones."""
    return "guided" if req.guide is not None else "free"


class ReadValue:
    def __init__(self) -> None:
        self.open: dict[int, list[float]] = {}  # request id -> [seconds saved, seconds spent] since its read
        self.sums: dict[str, tuple[float, float]] = {}  # kind -> (net seconds, output tokens), decayed sums
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
        """req ended: its net seconds and output tokens join its kind's sums (a short request weighs little: a
        few tokens' drafts say little of a long one's; under MIN_TOKENS: nothing)."""
        tally = self.open.pop(req.request_id, None)
        if tally is None or len(req.output_ids) < MIN_TOKENS:
            return
        net, tokens = self.sums.get(kind(req), (0.0, 0.0))
        self.sums[kind(req)] = (DECAY * net + tally[0] - tally[1], DECAY * tokens + len(req.output_ids))

    def worth(self, kind_: str) -> float | None:
        """A kind's net seconds per output token over its recent read requests (None: none finished yet)."""
        net, tokens = self.sums.get(kind_, (0.0, 0.0))
        return net / tokens if tokens > 0 else None

    def pays(self, req: Request, tokens_left: int, read_s: float) -> bool:
        """Whether to read req's prompt: its kind's worth over tokens_left exceeds read_s (the read's measured
        seconds), no worth learned yet, or this is a probe (one skipped request in PROBE_EVERY). Counts skips."""
        k, worth = kind(req), self.worth(kind(req))
        if worth is None or worth * tokens_left > read_s:
            return True
        self.skipped[k] = self.skipped.get(k, 0) + 1
        if self.skipped[k] >= PROBE_EVERY:
            self.skipped[k] = 0
            return True
        return False

    def settle(self, rows: list[VerifyRow], token_s: float, drafters: dict[str, Drafter]) -> None:
        """After a verify: each read request whose line a model that reads prompts drafted (of drafters; not a
        model beside it that shares the target's cache, which needs no read) gained its accepted drafts from it
        less what its shadow lookup would have had accepted (its drafts after any forced prefix matching the
        committed tokens), each worth token_s (a step's seconds per request)."""
        model = {registry.source_of(n) for n, d in drafters.items() if registry.DRAFTERS[n].forward and d.reads_prompts}
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
