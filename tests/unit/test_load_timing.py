"""Timing at load (engine/warmup.py): a draft_checkpoint with the target's copy beside it is timed, and its
acceptance seen, before the first request, so that request pays no trial of a draft model that loses."""

from __future__ import annotations

import logging
from contextlib import closing

from specgram.engine import warmup
from specgram.request import AUTO_DRAFT, PRIVATE, SamplingParams

from .helpers import PROMPTS, run, run_to_end, tokens_of
from .test_copy_beside import _by_source, _pair, _reads


def test_a_pair_is_timed_at_load_and_its_first_request_pays_no_trial(tmp_path, monkeypatch):
    # a draft model of other random weights (mostly wrong) beside the target's int8 copy (every draft right)
    with closing(_pair(tmp_path, 11)) as engine:
        costs, population = engine.planner.costs, engine.planner.population
        assert costs.known and costs.read_token_s > 0
        for own in (costs, costs.of("copy")):  # both models' depths timed
            assert own.draft_calls > 0 and own.draft_depth_s > 0
        assert population.rate("draft_model", 0.6) < 0.4 and population.rate("copy", 0.6) > 0.8
        base = run(engine, PROMPTS[:2], max_tokens=24)
        seen = _reads(monkeypatch, engine)
        auto = run(engine, PROMPTS[:2], max_tokens=24, num_draft_tokens=AUTO_DRAFT)
        assert [tokens_of(o) for o in auto] == [tokens_of(o) for o in base]
        # the wrong model neither reads the prompts nor drafts (whether the copy drafts is the step costs' call)
        assert seen == [False] and "draft_model" not in _by_source(auto)


def test_untimed_the_copy_drafts_first_and_then_the_draft_model_is_tried(tmp_path, monkeypatch):
    # the same pair without the timing at load: both untimed, a tie, and the copy needs no read; once the copy is
    # timed, the untimed draft model is expected to pay whatever its acceptance, and reads the next prompt
    monkeypatch.setattr(warmup, "time_models", lambda engine: False)
    with closing(_pair(tmp_path, 11)) as engine:
        seen = _reads(monkeypatch, engine)
        first = run(engine, PROMPTS[:1], max_tokens=24, num_draft_tokens=AUTO_DRAFT)
        assert seen == [False] and "draft_model" not in _by_source(first)
        assert engine.planner.costs.of("copy").draft_calls > 0 and engine.planner.costs.draft_calls == 0
        second = run(engine, PROMPTS[1:2], max_tokens=24, num_draft_tokens=AUTO_DRAFT)
        assert seen == [False, True] and _by_source(second).get("draft_model", 0) > 0


def test_the_warm_up_drafts_at_most_max_draft_len(tmp_path):
    with closing(_pair(tmp_path, 11, max_draft_len=1)) as engine:  # depth 3 would be refused
        costs = engine.planner.costs
        assert costs.known and min(costs.draft_calls, costs.of("copy").draft_calls) > 0


def test_a_context_too_short_for_the_warm_up_and_a_failing_warm_up_leave_the_costs_untimed(tmp_path, caplog):
    for window in (24, 16):  # room for 3 prompt tokens; none
        with closing(_pair(tmp_path / f"short-{window}", 11, max_seq_len=window)) as engine:
            assert not engine.planner.costs.known and not engine.planner.population.counts
            assert "timing the draft models" not in caplog.text  # skipped, not failed
    with closing(_pair(tmp_path / "failing", 11)) as engine:
        copy = engine.drafters["copy"]

        def broken(*args, **kwargs):
            raise RuntimeError("copy failed")

        copy.propose = broken
        with caplog.at_level(logging.WARNING, logger=warmup.__name__):
            assert not warmup.time_models(engine)
        assert "timing the draft models at load failed" in caplog.text and "copy failed" in caplog.text
        assert not engine.planner.costs.known and not engine.planner.population.counts
        del copy.propose  # the engine serves on
        out = run(engine, PROMPTS[:1], max_tokens=8, num_draft_tokens=AUTO_DRAFT)
        assert tokens_of(out[0]) and not out[0][-1].error


def test_no_request_reaches_the_warm_ups_cache_entries(tmp_path, suffix_store):
    """The warm-up's requests are engine-private: their suffix-store outputs and prefix-cache KV sit under a scope
    that no cache_salt names, whatever the salt (a warm-up's own name among those tried)."""
    with closing(_pair(tmp_path, 11)) as engine:
        private = (-1, PRIVATE)
        stored = {e.scope for e in engine.drafters["suffix"].store.entries.values()}
        assert stored == {private}  # the warm-up's answers, and nothing else yet
        if engine.settings.prefix_cache:
            assert private in engine.scheduler.prefix.owner.values()
        ids = engine.tokenizer.encode(warmup.PROMPT, add_special_tokens=False)[:64]
        for salt in (None, "specgram-load-timing", "engine", str(PRIVATE)):
            req = engine.make_request(SamplingParams(max_tokens=4, cache_salt=salt), prompt_ids=ids)
            assert req.scope != private
            out = run_to_end(engine, [req])[req.request_id]
            assert out[-1].num_cached_tokens == 0, salt  # the warm-up's prompt KV is not theirs to reuse
