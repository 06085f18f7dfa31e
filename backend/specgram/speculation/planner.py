"""Draft planning: which drafts each decoding request verifies in a step, and what the verify outcome teaches.

For a step's decoding requests: grammar-forced tokens first (free), then the free drafters (lookups) each
request consults (drafting/registry.py: its own, and under auto k every companion; the drafts with the most
expected accepted tokens win), then each forward drafter (a draft model) continues the proposals of the requests
that use it, batched across them (draft logits masked with the rows the target will use): under auto k
adaptive.plan_depths chooses for the whole batch how deep the model drafts and for which requests (a depth's
forward is shared by the requests drafting at it; a request takes the model's drafts only where they beat its
lookup drafts);
auto requests are then cut by adaptive.allocate over the whole batch (the drafts are made: only their verify
rows count); guided proposals are sealed by their
grammar (cut at the first illegal draft, the bonus row filled, the matcher rolled back). After the verify,
settle() records what was accepted: statistics, acceptance estimates, the drafters' own state.

Each request's own work (its grammar, its drafter's proposals, its estimates) runs under the step's Faults
(faults.py): a failure there ends that request alone, and the others draft on.
"""

from __future__ import annotations

import time

from ..drafting import registry
from ..drafting.acceptance import Population, RequestAcceptance
from ..drafting.proposal import Proposal
from ..faults import Faults
from ..grammar.masks import StepMasks
from ..request import Request
from . import adaptive, costs, forward_depths, read_value
from .drafter import Drafter, PickFn
from .rows import VerifyRow

FORCED = registry.FORCED


class DraftPlanner:
    def __init__(
        self,
        drafters: dict[str, Drafter],
        masks: StepMasks,
        max_draft_len: int,
        max_seq_len: int,
        forced_strings: bool,
        faults: Faults | None = None,
    ):
        self.drafters = drafters
        self.masks = masks
        self.faults = faults if faults is not None else Faults()
        self.max_draft_len, self.max_seq_len, self.forced_strings = max_draft_len, max_seq_len, forced_strings
        self.costs = costs.StepCosts()  # decode-step seconds by verify rows, for num_draft_tokens auto
        self.population = Population()  # engine-wide acceptance per draft source: each request's prior
        self.read_value = read_value.ReadValue()  # what a draft model's prompt reads bought, by kind of request

    def start(self, req: Request) -> None:
        req.acceptance = RequestAcceptance(self.population)

    def admitted(self, reqs: list[Request], running: list[Request]) -> None:
        """reqs' prompts are now complete in the target cache: their drafters see them. running: the requests
        holding a slot (these included). A draft model reads an auto request's prompt now only where it is the
        model the request would draft with (beside the target's copy: forward_depths.readers), a draft depth could
        pay at this many streams (costs.depth_can_pay) and the drafts can save more than the read costs over the
        tokens the request may still produce, alone or joining the depths that the requests it already reads
        draft in (costs.read_pays; the reads are timed for it); else it never drafts for that request under auto
        (reading the prompt is a prefill, which then costs more than the drafts it may ever win). A draft model
        that shares the target's cache reads nothing: every request may draft with it at any step."""
        for name, drafter in self.drafters.items():
            users = [r for r in reqs if r.params.speculates and name in self._uses(r)]
            if not users:
                continue
            if not registry.DRAFTERS[name].forward or not drafter.reads_prompts:
                self._admit(drafter, users, True)
                continue
            known = (self.population, self.costs, self.max_draft_len, self.read_value)
            read, skip = forward_depths.readers(name, self.drafters, users, reqs, running, *known)
            if read:
                start = time.perf_counter()
                self._admit(drafter, read, True)
                forward_depths.costs_of(name, self.costs).record_read(
                    sum(len(r.prompt_ids) for r in read), time.perf_counter() - start
                )
                self.read_value.started([r for r in read if r.params.auto_draft])
            if skip:
                self._admit(drafter, skip, False)

    def _admit(self, drafter: Drafter, reqs: list[Request], now: bool) -> None:
        """drafter.admit(reqs, now); where that fails, each request alone (a failing one ends)."""
        self.faults.each_or_alone(reqs, lambda sub: [drafter.admit(sub, now)] * len(sub), None)

    def _uses(self, req: Request) -> list[str]:
        """The drafters req may draft with: its own, and the forward drafters beside it (under auto k)."""
        return [
            req.params.drafter,
            *registry.forward_options(req.params.drafter, req.params.auto_draft, self.drafters)[1:],
        ]

    def release(self, req: Request) -> None:
        """req finished or was aborted: its drafters, and every drafter that learns from other requests, hear it."""
        uses = self._uses(req)
        self.read_value.finished(req)
        for name, drafter in self.drafters.items():
            if name in uses or registry.DRAFTERS[name].hears_all:
                drafter.release(req)

    def draft_len(self, req: Request) -> int:
        """This step's most drafts: the request's num_draft_tokens (max_draft_len when auto), cut so that the
        k + 1 tokens a verify step may commit fit in max_tokens and in the context (k = 0 near the end costs
        nothing)."""
        k = self.max_draft_len if req.params.auto_draft else req.params.num_draft_tokens
        k = min(
            k,
            self.max_draft_len,
            req.params.max_tokens - len(req.output_ids) - 1,
            self.max_seq_len - req.num_tokens - 1,
        )
        return max(k, 0)

    def draft(self, rows: list[VerifyRow], pick: PickFn, held: bool = False) -> float:
        """Each row's drafts for this step (row.available), cut to its k, and its lookup drafts that lost to the
        draft model's (row.shadow); guided ones stay tentatively accepted in their matchers until seal(). pick: the
        engine's token choice; held: auto requests draft nothing (fallback.py). -> the draft model's seconds."""
        reqs = [v.req for v in rows]
        ks = [0 if held and r.params.auto_draft else self.draft_len(r) for r in reqs]
        prefixes = [
            self.faults.guard(r, self.masks.forced_prefix, r.slot, r.guide, k, self.forced_strings, default=[])
            if r.guide and k
            else []
            for r, k in zip(reqs, ks, strict=True)
        ]
        # auto requests idle for a while look up only now and then (acceptance.LOOKUP_EVERY)
        rests = [r.params.auto_draft and r.acceptance.lookup_rests for r in reqs]
        found = self._free_drafts(reqs, ks, prefixes, pick, rests)
        using = forward_depths.choose(self.drafters, reqs, ks, prefixes, self.costs)  # each one's model this step
        depths = self._forward_depths(reqs, ks, prefixes, found, using)
        drafted_s = 0.0  # this step's draft-model seconds (choose_cuts: spent whatever it cuts)
        proposals = [Proposal(p, sources=[FORCED] * len(p)) for p in prefixes]
        modeled = [False] * len(reqs)
        for name, drafter in self.drafters.items():
            if not registry.DRAFTERS[name].forward:
                continue
            idx = [i for i in range(len(reqs)) if depths[i] > len(prefixes[i]) and using[i] == name]
            if idx:
                # a draft model's depth cost is learned from steps that feed it the usual 1-2 committed tokens
                # first, not from a catch-up (the prompt, or tokens committed while lookup drafted: a prefill)
                timed = max(drafter.behind(reqs[i]) for i in idx) <= 2
                start = time.perf_counter()
                # a request's lookup drafts ride along: the model checks them in its first forward (draft_model.py)
                hints = [found[i].tokens[len(prefixes[i]) :] if found[i] is not None else [] for i in idx]
                props = self._propose(
                    drafter, [reqs[i] for i in idx], [depths[i] for i in idx], pick, [prefixes[i] for i in idx], hints
                )
                spent = time.perf_counter() - start
                drafted_s += spent
                if timed:
                    made = [depths[i] - len(prefixes[i]) for i in idx]
                    forward_depths.costs_of(name, self.costs).record_draft(max(made), spent, sum(made) / max(made))
                for i, prop in zip(idx, props, strict=True):
                    proposals[i], modeled[i] = prop.tagged(len(prefixes[i]), registry.source_of(name)), True
                    self.read_value.spent(reqs[i], spent / len(idx))
        for i, lookup in enumerate(found):
            if lookup is None:
                continue
            if modeled[i]:
                rows[i].shadow = lookup
            else:
                proposals[i], depths[i] = lookup, ks[i]
        for v, p, k in zip(rows, proposals, depths, strict=True):
            v.available = p.cut(k) if not self.faults.has(v.req) else Proposal([], sources=[])
        return drafted_s

    def _propose(
        self,
        drafter: Drafter,
        reqs: list[Request],
        ks: list[int],
        pick: PickFn,
        prefixes: list[list[int]],
        hints: list[list[int]] | None = None,
    ) -> list[Proposal]:
        """drafter.propose over the requests together; where that fails, for each alone (its grammar back at its
        forced prefix first), so that the failure ends the request that causes it and the others draft on.
        hints: a forward drafter's (lookup drafts it checks); None: none for any request (a free drafter's call)."""
        hints = hints if hints is not None else [[] for _ in reqs]
        at = {id(r): (k, pre, h) for r, k, pre, h in zip(reqs, ks, prefixes, hints, strict=True)}

        def propose(sub: list[Request]) -> list[Proposal]:
            for r in sub:
                if r.guide is not None:
                    r.guide.rollback_to(len(at[id(r)][1]))
            ks, prefixes, hints = ([at[id(r)][j] for r in sub] for j in range(3))
            return drafter.propose(sub, ks, pick, prefixes, hints)

        return self.faults.each_or_alone(reqs, propose, Proposal([]))

    def _free_drafts(
        self, reqs: list[Request], ks: list[int], prefixes: list[list[int]], pick: PickFn, rests: list[bool]
    ) -> list[Proposal | None]:
        """Each request's best lookup drafts: every free drafter it consults (registry.consulted) continues its
        forced prefix, batched per drafter; the proposal with the most expected accepted tokens (its acceptance
        estimates) wins, the first consulted on a tie. None where none finds more than the prefix, where the
        request rests this step (idle auto requests), and for requests that consult none."""
        asked = [
            registry.consulted(r.params.drafter, r.params.auto_draft, self.drafters)
            if ks[i] > len(prefixes[i]) and not rests[i]
            else []
            for i, r in enumerate(reqs)
        ]
        best: list[Proposal | None] = [None] * len(reqs)
        score = [0.0] * len(reqs)
        for name, drafter in self.drafters.items():
            idx = [i for i, a in enumerate(asked) if name in a]
            if not idx:
                continue
            props = self._propose(
                drafter, [reqs[i] for i in idx], [ks[i] for i in idx], pick, [prefixes[i] for i in idx]
            )
            for i, p in zip(idx, props, strict=True):
                if len(p.tokens) <= len(prefixes[i]):
                    continue
                p = p.tagged(len(prefixes[i]), registry.source_of(name))
                expect = sum(reqs[i].acceptance.chances(p.sources)) if len(asked[i]) > 1 else 0.0
                if best[i] is None or expect > score[i]:
                    best[i], score[i] = p, expect
        return best

    def _forward_depths(
        self, reqs: list[Request], ks: list[int], prefixes: list[list[int]], lookups: list, using: list[str]
    ) -> list[int]:
        """Per request its drafts to make this step: each forward drafter's auto requests (using[i]: the model it
        drafts with this step) planned (forward_depths.plan), the other requests keep their k."""
        out = list(ks)
        for name, drafter in self.drafters.items():
            if registry.DRAFTERS[name].forward:
                forward_depths.plan(name, drafter, reqs, prefixes, lookups, out, self.costs, using)
        return out

    def choose_cuts(self, rows: list[VerifyRow], drafted_s: float) -> None:
        """Each row's proposal: for auto requests, how many of their available drafts this step verifies
        (adaptive.allocate over the whole batch; fixed-k requests count with all their drafts). drafted_s: the
        draft model's seconds this step, spent whatever is cut."""
        reqs, proposals = [v.req for v in rows], [v.available for v in rows]
        if not any(r.params.auto_draft for r in reqs):
            for v in rows:
                v.proposal = v.available
            return
        chances = [
            r.acceptance.chances(p.sources) if r.params.auto_draft else [1.0] * len(p.tokens)
            for r, p in zip(reqs, proposals, strict=True)
        ]
        # the drafts are made: their draft forwards are spent (in the step's seconds, whatever is cut), and only
        # the verify rows are still to choose
        cuts = adaptive.allocate(
            chances, [False] * len(reqs), self.costs, [not r.params.auto_draft for r in reqs], sunk=drafted_s
        )
        for v, c in zip(rows, cuts, strict=True):
            r, p = v.req, v.available
            if r.params.auto_draft:
                # a draft model's estimate learns only from verified drafts: probe now and then
                probe = not registry.forward_sources().isdisjoint(p.sources) and r.acceptance.probe_due
                p = p.cut(max(c, min(1, len(p.tokens)) if probe else 0))
                r.acceptance.idle_steps = 0 if p.tokens else r.acceptance.idle_steps + 1
            v.proposal = p

    def seal(self, req: Request, p: Proposal) -> Proposal:
        """A guided request's drafts cut at the first one the grammar rejects (n-gram drafts are unmasked), the
        bonus row filled, the matcher rolled back: its mask rows for positions 0..len(proposal) are then filled.
        An unguided request's drafts as they are."""
        if req.guide is None:
            return p
        return p.cut(self.faults.guard(req, self.masks.seal, req.slot, req.guide, p.tokens, default=0))

    def settle(self, rows: list[VerifyRow]) -> None:
        """After the verify (each row's accepted and token set): what was accepted teaches the estimates and
        the drafters (available: the drafts before this step's cuts; a legal draft past the cut is a free
        observation), each row under its request's guard."""
        for v in rows:
            self.faults.guard(v.req, self._settle_one, v)
        if rows and self.costs.known:  # a step not taken saves each request its share of a one-row-each step
            self.read_value.settle(rows, self.costs.curve()(len(rows)) / len(rows), self.drafters)

    def _settle_one(self, v: VerifyRow) -> None:
        r, p, full, a = v.req, v.proposal, v.available, v.line_accepted  # the line's (a tree's branches aside)
        k, t = len(p.tokens), v.committed[a]  # every proposal carries its sources from draft() on; t: after a
        beyond = full.tokens[k] == t if a == k and len(full.tokens) > k else None
        r.acceptance.observe(full.sources[: k + 1], k, a, beyond)
        for name in self._uses(r):  # each drafter it may draft with (those that did not draft this step: no-ops)
            self.drafters[name].committed(r, a)
        self._observe_shadow(r, v.shadow, v.committed)

    @staticmethod
    def _observe_shadow(r: Request, shadow: Proposal | None, committed: list[int]) -> None:
        """The lookup drafts that lost to the draft model's this step, judged against the committed tokens (what
        the target would have accepted of them): the lookup estimate stays current while the model drafts.
        Skipped after a forced prefix, which the verified proposal's own observation already counted."""
        if shadow is None or shadow.sources[0] == FORCED:
            return
        n = min(len(shadow.tokens), len(committed))
        r.acceptance.observe(shadow.sources[:n], n, read_value.lookup_hits(shadow.tokens, committed), None)
