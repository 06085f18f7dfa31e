"""The engine's step. Single-threaded: one thread owns it (serving/loop.py); nothing here locks.

One step path serves every mix of work: admit (scheduler.py) -> plan: this step's prompt chunks, and drafts for
the decoding requests (speculation/planner.py; none for auto requests where speculation/fallback.py holds them)
-> one target forward over every row (step.py) -> completed prompts take their first token; verify rows are
masked and accepted (verify.py) and committed (output.py).
A request with k = 0 drafts nothing: its verify row is a plain decode over [last token]; a row may branch into a
tree of drafts (speculation/trees.py). Guided requests carry a Guide (grammar/guide.py); grammar/masks.py holds
the bitmask rows, by (slot, row), and logits.py applies them with the min_tokens EOS ban wherever a token is chosen.

Failure belongs to a request (faults.py): a request's own work in any phase runs under the step's Faults, and a
request whose work raised ends with its own error after that phase (_end_failed) while the step goes on for the
others. A failure of a phase's shared work (the target forward) fails that phase's requests alone (_contained).
"""

from __future__ import annotations

import logging
import time

from ..config import EngineConfig
from ..errors import InvalidRequest
from ..faults import Faults
from ..grammar.compiler import GrammarCompiler
from ..grammar.masks import StepMasks
from ..model.runner import ModelRunner
from ..request import Request, RequestOutput, SamplingParams
from ..speculation import trees
from ..speculation.drafter import Drafter, build_drafters
from ..speculation.fallback import Fallback
from ..speculation.planner import DraftPlanner
from ..speculation.rows import VerifyRow
from ..wire import ErrorKind, FinishReason
from . import loading, warmup
from .intake import Intake
from .logits import LogitsProcessor
from .logprobs import LogprobTaker
from .output import Outputs
from .prefix_cache import PrefixCache
from .scheduler import Scheduler
from .settings import Settings, reasoning_end_of, resolve
from .step import StepPlan, StepResult
from .verify import Verifier

log = logging.getLogger(__name__)

# a CPU forward is compute-bound from a few dozen rows (a row's arithmetic outweighs its share of streaming the
# weights; docs/performance.md, Prefill scheduling), so a prefill step's cost follows its tokens
PREFILL_PACK_TOKENS_CPU = 64


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        settings: Settings,
        target: ModelRunner,
        tokenizer,
        drafters: dict[str, Drafter] | None = None,
    ):
        """settings: config resolved (settings.resolve); target and drafters: loaded as they say (loading.load)."""
        self.config, self.settings = config, settings
        self.target, self.tokenizer, self.device = target, tokenizer, target.device
        # verify forward before the matchers' seal (StepPlan.sealed): worth it where forwards run asynchronously
        self.overlap_grammar = self.device.type == "cuda"
        eos = loading.eos_ids(tokenizer, getattr(target.model, "generation_config", None), target.config)
        all_drafters = build_drafters(config, drafters or {})  # the registry's (drafting/registry.py) and loaded
        self.grammar = GrammarCompiler(
            tokenizer,
            target.vocab_size,
            sorted(eos),
            cache_bytes=config.grammar_cache_mb << 20,
            timeout_s=config.grammar_compile_timeout_s,
            json_strict=bool(config.json_strict),
            json_any_whitespace=bool(config.json_any_whitespace),
            workers=config.grammar_compile_workers,
            queue_limit=config.grammar_compile_queue,
            unsupported_keywords=config.json_unsupported_keywords,
        )
        self.intake = Intake(
            config,
            settings.drafter,
            tokenizer,
            self.grammar,
            all_drafters,
            target.vocab_size,
            reasoning_end_of(config.reasoning_end, tokenizer),
            target.adapters.index if target.adapters is not None else None,
        )
        tree_budget = trees.budget(config.tree_nodes, config.max_draft_len)
        native = getattr(target, "native", None)  # the target's native CPU forward, whose kernels also apply masks
        lib = native.lib if native is not None else None
        masks = StepMasks(target.vocab_size, config.max_slots, config.max_draft_len, self.device, tree_budget, lib)
        self.faults = Faults()  # the requests whose own work failed in the phase that is running
        self.planner = DraftPlanner(
            all_drafters, masks, config.max_draft_len, config.max_seq_len, config.forced_strings, self.faults
        )
        coupled = config.speculative_sampling == "coupled"
        self.fallback = Fallback(config.spec_fallback)  # plain decoding where drafting realises less
        self.trees = trees.TreePlanner(  # its verify rows' K and V: the target's
            all_drafters, masks, tree_budget, self.faults, coupled, not self.overlap_grammar, target
        )
        self.logits = LogitsProcessor(masks, eos, self.faults, coupled=coupled)
        runners = [d.runner for d in all_drafters.values() if hasattr(d, "runner")]  # the draft models'
        self.logits.reduced_drafts = any(r.head_ids is not None for r in runners)
        self.logprobs = LogprobTaker(config.logprobs_mode, tokenizer)
        self.verifier = Verifier(self.planner, self.logits, self.logprobs, self.faults, self.trees)
        self.prefix = PrefixCache(target.cache) if settings.prefix_cache else None
        # CPU: a prefill forward costs in proportion to its tokens, so a step ends at a prompt's end once it has
        # enough tokens to be compute-bound (scheduler.py); CUDA: steps are packed to the budget
        pack = PREFILL_PACK_TOKENS_CPU if self.device.type == "cpu" else None
        self.scheduler = Scheduler(config.max_slots, config.max_prefill_tokens, self.prefix, pack)
        self.output = Outputs(tokenizer, eos, config.max_seq_len)

    @classmethod
    def from_config(cls, config: EngineConfig) -> "Engine":
        settings = resolve(config)
        engine = cls(config, settings, *loading.load(config, settings))
        warmup.time_models(engine)  # where two models may draft: timed before the first request
        return engine

    eos_ids = property(lambda self: self.output.eos_ids)
    drafters = property(lambda self: self.planner.drafters)  # name -> Drafter

    # ---- requests in and out ----------------------------------------------------------------------------

    def make_request(self, params: SamplingParams, **prompt) -> Request:
        """Validate and tokenize (Intake.make_request: the prompt as text=, messages= with chat= and
        template_kwargs=, or prompt_ids=); raises InvalidRequest with a user-facing message. Thread-safe."""
        return self.intake.make_request(params, **prompt)

    def add(self, req: Request) -> None:
        self.planner.start(req)
        self.scheduler.add(req)

    def abort(
        self,
        request_id: int,
        reason: str = FinishReason.CANCELLED,
        error: str | None = None,
        error_kind: str | None = None,
    ) -> RequestOutput | None:
        """Remove a request wherever it is (its slot free next step) -> its final output (the unsent text), or None."""
        req = self.scheduler.find(request_id)
        if req is None:
            return None
        if req.pending_grammar is not None:
            req.pending_grammar.cancel()  # no request waiting: its compile stops
        req.finish_reason = reason
        return self._finish(req, self.output.final(req, [], self.output.unsent(req), error, error_kind))

    def close(self) -> None:  # stop what runs beside the engine (the grammar compile workers)
        self.grammar.close()

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def only_waiting_for_grammars(self) -> bool:
        """Nothing to step but requests whose grammar is compiling (the loop may then sleep briefly)."""
        return self.scheduler.only_waiting_for_grammars()

    def waiting_ids(self) -> list[int]:  # requests without a KV slot yet, in arrival order
        return [r.request_id for r in self.scheduler.waiting]

    def is_running(self, request_id: int) -> bool:  # whether the request holds a KV slot
        return request_id in self.scheduler.running

    def load(self) -> tuple[int, int, frozenset[int]]:
        """-> (requests holding a KV slot, waiting requests whose grammar is still compiling, the LoRA adapters of
        the requests holding a slot: ids, the base model left out)."""
        running = self.scheduler.running.values()
        compiling = sum(r.pending_grammar is not None for r in self.scheduler.waiting)
        return len(running), compiling, frozenset(r.adapter for r in running if r.adapter >= 0)

    # ---- the step ---------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        started, decoding = time.perf_counter(), [r for r in self.scheduler.running.values() if not r.prefilling]
        outputs = self._admit()
        plan = StepPlan(self.scheduler.prefill_chunks())
        held = self.fallback.begin(decoding, not plan.chunks, started)  # auto requests draft nothing this step
        self._contained(decoding, outputs, self._draft, plan, decoding, held)
        plan.drop_finished()  # requests that failed while drafting verify nothing
        result = None if plan.empty else self._contained(plan.requests, outputs, self._forward, plan)
        if result is not None:
            outputs += self._contained(plan.prompts, outputs, self._prefilled, plan, result) or []
            outputs += self._contained(plan.decoding, outputs, self._verified, plan, result) or []
        self.fallback.end(self.has_work())
        return outputs

    def _contained(self, reqs: list[Request], outputs: list[RequestOutput], phase, *args):
        """phase(*args), or None when it raised: then each of reqs that has not finished ends with an error
        (appended to outputs), and the other requests of the step go on. Either way, the requests whose own work
        failed in the phase (self.faults) end with their own errors."""
        try:
            return phase(*args)
        except Exception as e:  # noqa: BLE001 - reported to each affected client
            outputs += self._end_failed()
            outputs += self._fail(reqs, e)
            return None
        finally:
            outputs += self._end_failed()

    def _end_failed(self) -> list[RequestOutput]:
        """End each request whose own work failed (self.faults) with its error: INVALID_ARG where the request
        itself is at fault (e.g. faults.DeadEnd), else internal."""
        outs = []
        for req, e in self.faults.take():
            outs += self._fail([req], e, ErrorKind.INVALID if isinstance(e, InvalidRequest) else None)
        return outs

    def _admit(self) -> list[RequestOutput]:
        """Waiting requests into free slots; a request whose grammar did not compile ends here."""
        admitted, failed = self.scheduler.admit()
        outputs = []
        for req, error in failed:
            req.finish_reason = FinishReason.ERROR
            outputs.append(self._finish(req, self.output.final(req, [], "", error, ErrorKind.INVALID)))
        for req in admitted:
            self.faults.guard(req, self.output.start, req)
        return outputs + self._end_failed()

    def _draft(self, plan: StepPlan, decoding: list[Request], held: bool) -> None:
        """The decoding requests' drafts for this step, cut (adaptive k) and, where the forward blocks, sealed by
        the grammar: verifying a draft the grammar cuts would cost real work there. Where it does not (CUDA),
        the seal runs after the forward is queued: drafts it cuts were verified anyway, and causal attention
        keeps the logits before the cut exact (the KV written past it lies beyond cache_len)."""
        rows = [VerifyRow(r) for r in decoding if not r.finished]  # aborted between admission and now
        drafted_s = self.planner.draft(rows, self.logits.draft_pick, held)
        if not self.overlap_grammar:
            for v in rows:
                v.available = self.planner.seal(v.req, v.available)
        self.planner.choose_cuts(rows, drafted_s)
        self.trees.plan(rows, self.planner.costs, drafted_s)  # branches off the lines (trees of drafts)
        plan.verify, plan.sealed = rows, not self.overlap_grammar

    def _forward(self, plan: StepPlan) -> StepResult:
        started = time.perf_counter()
        first, verify = self.target.forward_step(*plan.rows(), len(plan.chunks), plan.trees(), plan.adapters())
        return StepResult(first, verify, started)

    def _prefilled(self, plan: StepPlan, result: StepResult) -> list[RequestOutput]:
        """Prompts advance by their chunks; a completed one gets its first token, and its drafters see it."""
        for r, n in plan.chunks:
            r.cache_len += n
            if self.prefix:
                self.faults.guard(r, self.prefix.prefilled, r.slot, r.prompt_ids, r.cache_len)
        done = [b for b, r in enumerate(plan.prompts) if not r.prefilling and not self.faults.has(r)]
        if not done:
            return []
        reqs = [plan.prompts[b] for b in done]
        logits = result.first[done] if len(done) < len(plan.chunks) else result.first  # [D, V]
        self.planner.admitted(reqs, list(self.scheduler.running.values()))
        rows = logits[:, None]  # [D, 1, V]
        raw = self.logprobs.capture(rows, reqs, "raw")
        first = [[t] for t in self.logits.pick(logits, reqs, [0] * len(reqs))[0].tolist()]  # masks in place
        captured = raw if raw is not None else self.logprobs.capture(rows, reqs, "processed")
        return self._commit_each(reqs, first, self.logprobs.entries(captured, reqs, first, self.faults))

    def _verified(self, plan: StepPlan, result: StepResult) -> list[RequestOutput]:
        """The verify rows masked, accepted and settled (verify.py), then committed."""
        kept, logprobs = self.verifier.verify(plan, result)
        before = [len(v.req.output_ids) for v in kept]
        outs = self._commit_each([v.req for v in kept], [v.committed for v in kept], logprobs)
        for v, n in zip(kept, before, strict=True):
            self.faults.guard(v.req, v.record, len(v.req.output_ids) - n)  # (its outputs above go out whatever)
        return outs

    # ---- endings ----------------------------------------------------------------------------------------

    def _finish(self, req: Request, out: RequestOutput) -> RequestOutput:
        """out: req's response; when it is the final one, the request leaves the scheduler and its drafter."""
        if out.finished and self.scheduler.remove(req):
            self.planner.release(req)
        return out

    def _commit_each(self, reqs: list[Request], tokens: list[list[int]], logprobs: list) -> list[RequestOutput]:
        """Commit each request's tokens (with their logprobs, None where not asked); a failure while committing
        one fails that request alone (the others' responses, final ones included, still go out)."""
        outs = []
        for r, toks, lps in zip(reqs, tokens, logprobs, strict=True):
            out = self.faults.guard(r, self.output.commit, r, toks, lps)
            if out is not None:
                outs.append(self._finish(r, out))
        return outs

    def _fail(self, reqs: list[Request], e: Exception, kind: ErrorKind | None = None) -> list[RequestOutput]:
        """Final error responses for the requests of a failed phase that have not finished yet. kind INVALID: the
        request's own fault, its message for the client; else an internal error, its traceback logged."""
        failed = [r for r in reqs if not r.finished]
        if failed and kind is None:  # the client sees the message; the server log keeps the traceback
            log.error("requests %s failed: %r", [r.request_id for r in failed], e, exc_info=e)
        error = str(e) if kind == ErrorKind.INVALID else f"internal error during generation: {e!r}"
        outs = []
        for r in failed:
            r.finish_reason = FinishReason.ERROR
            outs.append(self._finish(r, self.output.final(r, [], "", error, kind)))
        return outs
