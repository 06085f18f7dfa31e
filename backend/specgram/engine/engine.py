"""The engine's step. Single-threaded: one thread owns it (see loop.py); nothing here locks.

Each step:  admit (scheduler.py) -> prefill this step's prompt chunks (a request whose prompt is complete gets
            its first token) -> decode the others:
            draft -> seal -> verify (one batched target forward) -> mask -> accept -> commit (output.py).
            With the native CPU forward, a step's prompt chunks and verify rows share one target forward.
A request with k = 0 drafts nothing, and its verify row is a plain decode over [last token]. Guided requests
carry a Guide (grammar.py); masks.py holds the bitmask rows, keyed by (slot, position); min_tokens.py bans EOS
below a request's min_tokens, after the grammar mask, wherever a token is chosen; choose.py decides tokens.
"""
from __future__ import annotations

import time

import torch

from ..config import EngineConfig
from ..errors import InvalidRequest
from ..grammar.compiler import GrammarCompiler
from ..grammar.masks import StepMasks
from ..model.runner import ModelRunner
from ..request import Request, RequestOutput, SamplingParams
from ..speculation import adaptive, min_tokens
from ..speculation import sampling as choose
from ..speculation.drafter import Drafter, GrammarOnlyDrafter, Proposal
from ..speculation.ngram import NgramDrafter
from . import loading
from .output import Outputs
from .prefix_cache import PrefixCache
from .prompt import prompt_ids as build_prompt_ids
from .scheduler import Scheduler

# a CPU forward is compute-bound from a few dozen rows (native, 2 cores: ~0.9 ms a row vs ~21 ms to stream the
# weights), so a prefill step's cost follows its tokens
PREFILL_PACK_TOKENS_CPU = 64


def _chunk_rows(chunks: list[tuple[Request, int]]) -> tuple[list[list[int]], list[int], list[int]]:
    """Prompt chunks -> forward rows (tokens, slot, start position): the next n prompt tokens of each."""
    return ([r.prompt_ids[r.cache_len:r.cache_len + n] for r, n in chunks], [r.slot for r, _ in chunks],
            [r.cache_len for r, _ in chunks])


def _verify_rows(reqs: list[Request], proposals: list[Proposal]) -> tuple[list[list[int]], list[int], list[int]]:
    """Verify rows: [last committed token, d_0 .. d_{k-1}] at the end of each request's cache."""
    return ([[r.output_ids[-1], *p.tokens] for r, p in zip(reqs, proposals)], [r.slot for r in reqs],
            [r.cache_len for r in reqs])


def _cut(p: Proposal, n: int) -> Proposal:
    """The first n drafts of a proposal (the proposal itself when it is not longer)."""
    if n >= len(p.tokens):
        return p
    return Proposal(p.tokens[:n], None if p.probs is None else p.probs[:n],
                    None if p.sources is None else p.sources[:n])


def _tagged(p: Proposal, n_forced: int, drafter: str) -> Proposal:
    """p with its per-token sources: the drafter's own tags, else the forced prefix then the drafter's name."""
    if p.sources is None:
        p.sources = ["forced"] * min(n_forced, len(p.tokens)) + [drafter] * max(len(p.tokens) - n_forced, 0)
    return p


class Engine:
    def __init__(self, config: EngineConfig, target: ModelRunner, tokenizer,
                 drafters: dict[str, Drafter] | None = None):
        self.config = config
        self.target = target
        self.tokenizer = tokenizer
        self.device = target.device
        # verify forward before the matchers' seal (see _decode): worth it where forwards run asynchronously
        self.overlap_grammar = self.device.type == "cuda"
        eos = loading.eos_ids(tokenizer, getattr(target.model, "generation_config", None), target.config)
        self.drafters: dict[str, Drafter] = {"ngram": NgramDrafter(config.ngram_min, config.ngram_max),
                                             "grammar": GrammarOnlyDrafter()}
        self.drafters.update(drafters or {})
        self.grammar = GrammarCompiler(tokenizer, target.vocab_size, sorted(eos),
                                       cache_bytes=config.grammar_cache_mb << 20,
                                       timeout_s=config.grammar_compile_timeout_s,
                                       json_strict=bool(config.json_strict),
                                       json_any_whitespace=bool(config.json_any_whitespace),
                                       workers=config.grammar_compile_workers,
                                       queue_limit=config.grammar_compile_queue,
                                       unsupported_keywords=config.json_unsupported_keywords)
        self.masks = StepMasks(target.vocab_size, config.max_slots, config.max_draft_len, self.device)
        # prompt-prefix reuse: "auto" only where reused KV is bitwise what a prefill would write (native forward)
        reuse = config.prefix_cache == "on" or (config.prefix_cache == "auto" and target.native is not None)
        self.prefix = PrefixCache(target.cache) if reuse else None
        # CPU: a prefill forward costs in proportion to its tokens, so a step ends at a prompt's end once it has
        # enough tokens to be compute-bound (scheduler.py); CUDA: steps are packed to the budget
        pack = PREFILL_PACK_TOKENS_CPU if self.device.type == "cpu" else None
        self.scheduler = Scheduler(config.max_slots, config.max_prefill_tokens, self.prefix, pack)
        self.fuse_prefill = target.fuses_rows      # prompt chunks and verify rows in one forward (native CPU)
        self.output = Outputs(tokenizer, eos, config.max_seq_len)
        self.costs = adaptive.StepCosts()   # decode-step seconds by verify rows, for num_draft_tokens auto
        self.population = adaptive.Population()     # engine-wide acceptance per draft source: each request's prior

    @classmethod
    def from_config(cls, config: EngineConfig) -> "Engine":
        return cls(config, *loading.load(config))

    @property
    def eos_ids(self) -> set[int]:
        return self.output.eos_ids

    # ---- requests in and out (called by the owning thread) ----------------------------------------------

    def make_request(self, params: SamplingParams, text: str | None = None, messages: list[dict] | None = None,
                     chat: bool = False, prompt_ids: list[int] | None = None) -> Request:
        """Validate and tokenize; raises InvalidRequest with a user-facing message (Overloaded when too many
        guides wait to compile). Thread-safe."""
        if params.num_draft_tokens is None:
            params.num_draft_tokens = self.config.default_num_draft_tokens_guided if params.guide_type is not None \
                else self.config.default_num_draft_tokens
        params.validate(self.config.default_max_tokens, self.config.max_draft_len)
        kind = None
        if params.guide_type is not None:
            kind = self.grammar.check(params.guide_type, params.guide)
        if params.drafter is None:
            params.drafter = self.config.default_drafter
        if params.drafter not in self.drafters:
            raise InvalidRequest(f"unknown or unconfigured drafter {params.drafter!r}; "
                                 f"available: {sorted(self.drafters)}")
        ids = prompt_ids if prompt_ids is not None else build_prompt_ids(self.tokenizer, text, messages, chat)
        if not ids:
            raise InvalidRequest("the prompt is empty")
        if any(not 0 <= t < self.target.vocab_size for t in ids):
            raise InvalidRequest(f"prompt token ids must be in [0, {self.target.vocab_size})")
        limit = self.config.max_seq_len - 1
        if len(ids) > limit:
            raise InvalidRequest(f"the prompt has {len(ids)} tokens; this model accepts at most {limit} "
                                 f"(max_seq_len {self.config.max_seq_len} minus one token to generate)")
        req = Request(prompt_ids=list(ids), params=params)
        if kind is not None:
            req.pending_grammar = self.grammar.submit(kind, params.guide)   # compiles off the step loop
            if params.speculates and params.drafter == "ngram" and params.guide:
                req.guide_ids = self.tokenizer.encode(params.guide, add_special_tokens=False)
        return req

    def add(self, req: Request) -> None:
        req.acceptance = adaptive.RequestAcceptance(self.population)
        self.scheduler.add(req)

    def abort(self, request_id: int, reason: str = "cancelled", error: str | None = None,
              error_kind: str | None = None) -> RequestOutput | None:
        """Remove a request wherever it is; its slot is free for the next step; its final output carries the text
        not yet sent. None if it is not here."""
        req = self.scheduler.find(request_id)
        if req is None:
            return None
        if req.pending_grammar is not None:
            req.pending_grammar.cancel()            # no request waiting: its compile stops
        req.finish_reason = reason
        return self._finish(req, self.output.final(req, [], self.output.unsent(req), error, error_kind))

    def close(self) -> None:
        """Stop what runs beside the engine (the grammar compile workers)."""
        self.grammar.close()

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def only_waiting_for_grammars(self) -> bool:
        """Nothing to step but requests whose grammar is compiling (the loop may then sleep briefly)."""
        return self.scheduler.only_waiting_for_grammars()

    def _finish(self, req: Request, out: RequestOutput) -> RequestOutput:
        """out: req's response; when it is the final one, the request leaves the scheduler and its drafter."""
        if out.finished and self.scheduler.remove(req):
            self.drafters[req.params.drafter].release(req)
        return out

    def _commit(self, req: Request, tokens: list[int]) -> RequestOutput:
        return self._finish(req, self.output.commit(req, tokens))

    def _commit_each(self, reqs: list[Request], tokens: list[list[int]]) -> list[RequestOutput]:
        """Commit each request's tokens; a failure while committing one fails that request alone (the others'
        responses, final ones included, still go out)."""
        outs = []
        for r, toks in zip(reqs, tokens):
            try:
                outs.append(self._commit(r, toks))
            except Exception as e:  # noqa: BLE001 - reported to the affected client
                outs += self._fail([r], e)
        return outs

    # ---- the step ---------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        decoding = [r for r in self.scheduler.running.values() if not r.prefilling]
        admitted, failed = self.scheduler.admit()
        outputs = []
        for req, error in failed:                  # the request's grammar did not compile
            req.finish_reason = "error"
            outputs.append(self._finish(req, self.output.final(req, [], "", error, "invalid")))
        for req in admitted:
            self.output.start(req)
        chunks = self.scheduler.prefill_chunks()
        if chunks and decoding and self.fuse_prefill:
            # one forward for both: the decode rows ride along a compute-bound prefill for ~1 ms a row
            # instead of a forward of their own that streams every weight again
            return outputs + self._prefill_and_decode(chunks, decoding)
        if chunks:
            outputs += self._guarded([r for r, _ in chunks], lambda reqs: self._prefill(chunks))
        if decoding:
            outputs += self._guarded(decoding, self._decode)
        return outputs

    def _guarded(self, reqs: list[Request], phase) -> list[RequestOutput]:
        """A failure inside a forward fails the requests of that forward, not the engine."""
        try:
            return phase(reqs)
        except Exception as e:  # noqa: BLE001 - reported to each affected client
            return self._fail(reqs, e)

    def _fail(self, reqs: list[Request], e: Exception) -> list[RequestOutput]:
        """Final error responses for the requests of a failed phase that have not finished yet."""
        outs = []
        for r in reqs:
            if not r.finished:
                r.finish_reason = "error"
                error = f"internal error during generation: {e!r}"
                outs.append(self._finish(r, self.output.final(r, [], "", error)))
        return outs

    def _prefill(self, chunks: list[tuple[Request, int]]) -> list[RequestOutput]:
        """One forward over this step's prompt chunks; a request whose prompt is now complete gets its first
        token (from its last prompt position) and its drafters see it."""
        rows, slots, starts = _chunk_rows(chunks)
        return self._prefilled(chunks, self.target.forward_rows(rows, slots, starts, last_only=True))   # [B, V]

    def _prefill_and_decode(self, chunks: list[tuple[Request, int]], decoding: list[Request]) -> list[RequestOutput]:
        """_prefill and _decode with one target forward (the prompt chunks' rows first, then the verify rows).
        The decode requests draft and seal before the forward exactly as in _decode; each row's logits are
        what its own forward would give, so outputs equal those of the two forwards. Failures stay on their
        side: drafting or accepting fails only the decoding requests, committing first tokens only the
        prompts' requests; the shared forward failing fails both."""
        prompts = [r for r, _ in chunks]
        reqs = [r for r in decoding if not r.finished]      # aborted between admission and now
        try:
            available, proposals = self._seal_and_cut(reqs, self._draft(reqs))
        except Exception as e:  # noqa: BLE001 - reported to each affected client
            return self._fail(reqs, e) + self._guarded(prompts, lambda _: self._prefill(chunks))
        if not reqs:
            return self._guarded(prompts, lambda _: self._prefill(chunks))
        rows, slots, starts = _chunk_rows(chunks)
        verify_rows, verify_slots, verify_starts = _verify_rows(reqs, proposals)
        try:                                                                          # [P, V], [B, 1 + k, V]
            first, logits = self.target.forward_split(rows + verify_rows, slots + verify_slots,
                                                      starts + verify_starts, n_last=len(chunks))
        except Exception as e:  # noqa: BLE001 - reported to each affected client
            return self._fail(prompts + reqs, e)
        outputs = self._guarded(prompts, lambda _: self._prefilled(chunks, first))
        # the step-cost model (auto draft length) learns from decode-only steps: this forward's time is mostly
        # the prefill's
        return outputs + self._guarded(reqs, lambda _: self._verified(reqs, proposals, available, logits, None))

    def _prefilled(self, chunks: list[tuple[Request, int]], logits: torch.Tensor) -> list[RequestOutput]:
        """After the chunks' forward (logits [P, V] at each chunk's last token): advance the prompts, and give
        each completed prompt its first token."""
        for r, n in chunks:
            r.cache_len += n
            if self.prefix:
                self.prefix.prefilled(r.slot, r.prompt_ids, r.cache_len)
        done = [b for b, (r, _) in enumerate(chunks) if not r.prefilling]
        if not done:
            return []
        reqs = [chunks[b][0] for b in done]
        logits = logits[torch.tensor(done)] if len(done) < len(chunks) else logits
        for name, drafter in self.drafters.items():
            users = [r for r in reqs if r.params.speculates and r.params.drafter == name]
            if users:
                drafter.admit(users)
        first = self._pick(logits, reqs, [0] * len(reqs))[0].tolist()
        return self._commit_each(reqs, [[t] for t in first])

    def _decode(self, reqs: list[Request]) -> list[RequestOutput]:
        reqs = [r for r in reqs if not r.finished]          # aborted between admission and now
        proposals = self._draft(reqs)
        start = time.perf_counter()
        if self.overlap_grammar:
            # The verify forward is queued before the grammar work only the masking needs: the matchers check
            # the drafts and fill the bonus rows on the CPU while the GPU computes. Drafts that seal() cuts were
            # verified anyway: causal attention keeps the logits before the cut exact, and the KV written past
            # it lies beyond cache_len (overwritten later).
            available = proposals
            proposals = self._choose_cuts(reqs, proposals)
            logits = self._verify_forward(reqs, proposals)  # [B, 1 + max k, V], not yet masked
            proposals = self._seal(reqs, proposals)
        else:
            available, proposals = self._seal_and_cut(reqs, proposals)
            logits = self._verify_forward(reqs, proposals)
        return self._verified(reqs, proposals, available, logits, start)

    def _seal_and_cut(self, reqs: list[Request], proposals: list[Proposal]) -> tuple[list[Proposal], list[Proposal]]:
        """Where the forward blocks (CPU) there is nothing to overlap, and verifying a draft that the grammar
        cuts would cost real work: seal first, then cut to what this step verifies -> (drafts before the cuts,
        proposals to verify)."""
        available = self._seal(reqs, proposals)
        return available, self._choose_cuts(reqs, available)

    def _verified(self, reqs: list[Request], proposals: list[Proposal], available: list[Proposal],
                  logits: torch.Tensor, start: float | None) -> list[RequestOutput]:
        """After the verify forward (logits [B, 1 + max k, V]): mask, accept, commit. start: when the forward
        began, for the step-cost model (None: the forward also served prompt chunks, so its time is not a
        decode step's)."""
        self._mask_verify(reqs, proposals, logits)
        accepted = self._accept(reqs, proposals, available, logits)
        if start is not None:
            self.costs.record(sum(1 + len(p.tokens) for p in proposals), time.perf_counter() - start)
        return self._commit_each(reqs, accepted)

    def draft_len(self, req: Request) -> int:
        """This step's most drafts: the request's num_draft_tokens (max_draft_len when auto), cut so that the
        k + 1 tokens a verify step may commit fit in max_tokens and in the context (k = 0 near the end costs
        nothing)."""
        k = self.config.max_draft_len if req.params.auto_draft else req.params.num_draft_tokens
        k = min(k, self.config.max_draft_len, req.params.max_tokens - len(req.output_ids) - 1,
                self.config.max_seq_len - req.num_tokens - 1)
        return max(k, 0)

    def _draft(self, reqs: list[Request]) -> list[Proposal]:
        """Grammar-forced tokens first (free), then each drafter continues the proposals of the requests that
        use it, batched across them; draft logits are masked with the rows the target will use. Proposals are
        cut to this step's k; guided ones stay tentatively accepted in their matchers until _seal()."""
        ks = [self.draft_len(r) for r in reqs]
        strings = self.config.forced_strings
        prefixes = [self.masks.forced_prefix(r.slot, r.guide, k, strings) if r.guide and k else []
                    for r, k in zip(reqs, ks)]
        ks = self._draft_model_depths(reqs, ks, prefixes)
        proposals = [Proposal(p, sources=["forced"] * len(p)) for p in prefixes]
        for name, drafter in self.drafters.items():
            idx = [i for i, r in enumerate(reqs) if ks[i] > len(prefixes[i]) and r.params.drafter == name]
            if idx:
                start = time.perf_counter()
                props = drafter.propose([reqs[i] for i in idx], [ks[i] for i in idx], self._draft_pick,
                                        [prefixes[i] for i in idx])
                if name == "draft_model":
                    self.costs.record_draft(max(ks[i] - len(prefixes[i]) for i in idx), time.perf_counter() - start)
                for i, prop in zip(idx, props):
                    proposals[i] = _tagged(prop, len(prefixes[i]), name)
        return [_cut(p, k) for p, k in zip(proposals, ks)]

    def _draft_model_depths(self, reqs: list[Request], ks: list[int], prefixes: list[list[int]]) -> list[int]:
        """Auto requests drafting with the draft model: their k is chosen before drafting (each draft costs a
        draft forward), from their acceptance estimates; the other requests count as one verify row each."""
        auto = [r.params.auto_draft and r.params.drafter == "draft_model" for r in reqs]
        if not any(auto):
            return ks
        chances = [r.acceptance.chances(["forced"] * len(pre) + ["draft_model"] * (k - len(pre))) if a else []
                   for r, k, pre, a in zip(reqs, ks, prefixes, auto)]
        cuts = adaptive.allocate(chances, auto, self.costs)
        return [max(c, len(pre), min(1, k) if r.acceptance.probe_due else 0) if a else k
                for r, k, pre, a, c in zip(reqs, ks, prefixes, auto, cuts)]

    def _choose_cuts(self, reqs: list[Request], proposals: list[Proposal]) -> list[Proposal]:
        """Auto requests: how many of their available drafts this step verifies (adaptive.allocate over the
        whole batch; fixed-k requests count with all their drafts)."""
        if not any(r.params.auto_draft for r in reqs):
            return proposals
        chances = [r.acceptance.chances(p.sources) if r.params.auto_draft else [1.0] * len(p.tokens)
                   for r, p in zip(reqs, proposals)]
        cuts = adaptive.allocate(chances, [r.params.drafter == "draft_model" for r in reqs], self.costs)
        out = []
        for r, p, c in zip(reqs, proposals, cuts):
            if r.params.auto_draft:
                # a draft model's estimate learns only from verified drafts: probe now and then
                probe = r.params.drafter == "draft_model" and r.acceptance.probe_due
                p = _cut(p, max(c, min(1, len(p.tokens)) if probe else 0))
                r.acceptance.idle_steps = 0 if p.tokens else r.acceptance.idle_steps + 1
            out.append(p)
        return out

    def _seal(self, reqs: list[Request], proposals: list[Proposal]) -> list[Proposal]:
        """Guided requests: drafts cut at the first one the grammar rejects (n-gram drafts are unmasked), the
        bonus row filled, the matcher rolled back. After this every guided request has its mask rows for
        positions 0..len(proposal)."""
        return [_cut(p, self.masks.seal(r.slot, r.guide, p.tokens)) if r.guide is not None else p
                for r, p in zip(reqs, proposals)]

    def _verify_forward(self, reqs: list[Request], proposals: list[Proposal]) -> torch.Tensor:
        """One batched target forward over [last committed token, d_0 .. d_{k-1}] for every request."""
        return self.target.forward_rows(*_verify_rows(reqs, proposals), last_only=False)

    def _mask_verify(self, reqs: list[Request], proposals: list[Proposal], logits: torch.Tensor) -> None:
        """Mask the verify logits [B, T, V] in place: row (b, i) gets mask row (slot, i), as the drafts did,
        then EOS banned where output position len(output_ids) + i is below min_tokens (as the drafts were)."""
        width = logits.shape[1]
        flat = logits.view(-1, logits.shape[-1])                                      # [B * T, V]
        entries = [(b * width + i, r.slot, i) for b, r in enumerate(reqs) if r.guide is not None
                   for i in range(1 + len(proposals[b].tokens))]
        self.masks.apply(flat, entries)
        min_tokens.apply(flat, [min_tokens.eos_banned(r, i) for r in reqs for i in range(width)], self.eos_ids)

    def _accept(self, reqs: list[Request], proposals: list[Proposal], available: list[Proposal],
                logits: torch.Tensor) -> list[list[int]]:
        """-> per request the tokens to commit: its accepted drafts, then one token from the target.
        available: the drafts before this step's cuts (a legal draft past the cut is a free observation)."""
        accepted, nxt = choose.accept(reqs, proposals, logits)
        out = []
        for r, p, full, a, t in zip(reqs, proposals, available, accepted, nxt):
            r.cache_len += 1 + a          # the fed last token and the accepted drafts now have valid KV
            k = len(p.tokens)             # every proposal carries its sources from _draft() on
            r.spec.record(p.sources, a)
            beyond = full.tokens[k] == t if a == k and len(full.tokens) > k else None
            r.acceptance.observe(full.sources[:k + 1], k, a, beyond)
            self.drafters[r.params.drafter].committed(r, a)
            out.append(p.tokens[:a] + [t])
        return out

    def _pick(self, logits: torch.Tensor, reqs: list[Request], offsets: list[int],
              tentative: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits: [B, V], row b for reqs[b]'s token at output position len(output_ids) + offsets[b] ->
        choose.pick under each guided request's grammar mask at its current position, row (slot,
        guide.tentative), and with EOS banned below min_tokens; with `tentative` (drafting) the picked tokens
        are then accepted tentatively."""
        guided = [(j, r) for j, r in enumerate(reqs) if r.guide is not None and not r.guide.terminated]
        for _, r in guided:
            self.masks.fill(r.slot, r.guide)
        self.masks.apply(logits, [(j, r.slot, r.guide.tentative) for j, r in guided])
        min_tokens.apply(logits, [min_tokens.eos_banned(r, o) for r, o in zip(reqs, offsets)], self.eos_ids)
        ids, probs = choose.pick(logits, reqs)
        if tentative:
            for j, r in guided:
                accepted = r.guide.try_tentative(int(ids[j]))
                assert accepted, "a token drawn under its grammar mask was rejected by the matcher"
        return ids, probs

    def _draft_pick(self, logits: torch.Tensor, reqs: list[Request],
                    offsets: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The drafters' PickFn: _pick with the picks accepted tentatively."""
        return self._pick(logits, reqs, offsets, tentative=True)
