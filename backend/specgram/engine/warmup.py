"""Timing at load: where an auto request may draft with either of two models (a draft_checkpoint and the target's
copy beside it), each model drafts a short built-in prompt before the first request, so that the rule choosing
between them (forward_depths.choose: the model expecting more tokens per second, from its measured depth cost and
acceptance) has both measures from the first request on. Untimed, a model is expected to pay whatever its
acceptance (forward_depths.value), so without this, once the copy (which needs no read) has drafted and is timed,
the next requests would read their prompts with the untimed draft model and draft with it until its timings and
acceptance showed it losing: a trial paid by those requests.

What carries over: each model's draft depth and prompt read and the verify step's seconds (the planner's
StepCosts), and the warm-up's acceptance as the engine-wide rates' first evidence (one 16-token answer's worth,
which the workload's own observations soon outweigh). On any text the target's own copy follows the target far
more often than a smaller model does (plain prose, Qwen2.5-Coder 1.5B: its int4 copy's drafts all accepted, the
0.5B's first drafts half), which orders the two before the workload's own observations arrive. The warm-up
requests are engine-private (Request.private: a scope that no cache_salt names), so no client's request reaches
their prefix-cache or suffix-store entries.
"""

from __future__ import annotations

import logging
import time

from ..drafting import registry
from ..drafting.acceptance import Population
from ..errors import InvalidRequest
from ..request import SamplingParams
from ..speculation.costs import StepCosts

log = logging.getLogger(__name__)

# plain English that most tokenizers cut into 50-70 tokens: a prompt read long enough to time per token
PROMPT = (
    "The river runs past the old mill, under the stone bridge and out through the fields to the sea. In spring "
    "the water is high and fast; in late summer it slows, and children wade across to the island where the "
    "herons nest. The miller kept a log of the river's height for forty years."
)
TOKENS = 16  # output tokens per warm-up request: at depth DEPTH, four or more timed draft calls per model
DEPTH = 3  # drafts per step (a fixed k; max_draft_len where less): the verify step is timed at DEPTH + 1 rows


def models(engine) -> list[str]:
    """The models an auto request may choose between: each forward drafter's options (registry.forward_options:
    it and the models declared beside it) where the engine has two or more; none elsewhere."""
    groups = [registry.forward_options(n, True, engine.drafters) for n in engine.drafters]
    return list(dict.fromkeys(n for g in groups if len(g) > 1 for n in g))


def time_models(engine) -> bool:
    """Time each model an auto request may choose between (models(): where there are two or more), twice: the
    first pass pays one-time costs (first touches of the weights' pages, lazy initialisations) and is dropped, the
    second is kept: a model's first calls are never weighed. -> whether the timings were taken. A config
    whose context cannot hold the warm-up, or a warm-up request that fails, leaves the costs untimed and the rates
    at the declared priors (the first requests then time them), with a warning."""
    names, depth = models(engine), min(DEPTH, engine.config.max_draft_len)
    if not names or depth < 1:
        return False
    room = max(engine.config.max_seq_len - TOKENS - depth - 2, 0)  # the prompt's most tokens
    ids = engine.tokenizer.encode(PROMPT, add_special_tokens=False)[:room]
    if len(ids) < 8:
        return False
    started = time.perf_counter()
    for _ in ("dropped", "kept"):
        _untimed(engine.planner)
        for name in names:
            params = SamplingParams(max_tokens=TOKENS, num_draft_tokens=depth, drafter=name, ignore_eos=True)
            try:
                req = engine.make_request(params, prompt_ids=ids)
                req.private = True  # its prefix-cache and suffix-store entries: no client's request reaches them
                errors = _run(engine, req)
            except InvalidRequest as e:  # a config whose limits refuse the warm-up request
                errors = [str(e)]
            if errors:
                log.warning("timing the draft models at load failed (%s): the first requests time them", errors)
                _untimed(engine.planner)
                return False
    log.info("draft models %s timed at load in %.1f s", names, time.perf_counter() - started)
    return True


def _untimed(planner) -> None:
    """The planner as a fresh engine's: no step timed, the engine-wide rates at the declared priors."""
    planner.costs, planner.population = StepCosts(), Population()


def _run(engine, req) -> list[str]:
    """Step the engine (idle but for req) until req finishes -> its errors (one if it does not finish). Not
    generate.generate(): a load must not wait on a request that never finishes."""
    engine.add(req)
    errors: list[str] = []
    for _ in range(4 * TOKENS):  # a step commits at least one token
        if not engine.has_work():
            return errors
        errors += [o.error for o in engine.step() if o.error]
    engine.abort(req.request_id)
    return [*errors, f"not finished in {4 * TOKENS} steps"]
