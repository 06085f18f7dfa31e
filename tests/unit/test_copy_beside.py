"""The target's copy beside a named draft model (drafter `copy`): under draft_quantization auto a draft_checkpoint
loads with the target's own copy, and an auto request of `draft_model` drafts each step with whichever of the two
models expects more tokens per second (speculation/forward_depths.py: choose), the draft model reading its prompt
only where it is that model at admission. Output stays exact whichever drafts."""

from __future__ import annotations

import os
from contextlib import closing

import pytest

from specgram.config import EngineConfig
from specgram.drafting.acceptance import Population, RequestAcceptance
from specgram.engine.engine import Engine
from specgram.engine.loading import footprint_of
from specgram.engine.settings import resolve
from specgram.errors import ModelLoadError
from specgram.request import AUTO_DRAFT, SamplingParams
from specgram.speculation import forward_depths
from specgram.speculation.costs import StepCosts, read_pays

from .helpers import PROMPTS, freeze, run, tokens_of
from .tiny import save_checkpoint


def _pair(root, draft_seed: int, **settings) -> Engine:
    """A tiny target (seed 0) with a draft model of seed draft_seed (0: the target's own weights, every draft
    right; else other random weights, mostly wrong), draft_quantization auto: the target's int8 copy beside it."""
    target = save_checkpoint(root / "target", seed=0)
    draft = save_checkpoint(root / f"draft-{draft_seed}", seed=draft_seed)
    config = dict(
        draft_quantization="auto", max_slots=4, max_seq_len=96, linear=os.environ.get("SPECGRAM_TEST_LINEAR", "auto")
    )
    config.update(settings)
    return Engine.from_config(EngineConfig(checkpoint=str(target), draft_checkpoint=str(draft), **config))


@pytest.fixture(scope="module")
def wrong(tmp_path_factory):
    with closing(_pair(tmp_path_factory.mktemp("wrong"), 11)) as engine:
        yield engine


@pytest.fixture(scope="module")
def right(tmp_path_factory):
    with closing(_pair(tmp_path_factory.mktemp("right"), 0)) as engine:
        yield engine


def _costs(monkeypatch, engine, draft_s: float, copy_s: float) -> None:
    """Freeze the planner's costs: a 30 ms step, the draft model's depth draft_s, the copy's copy_s, prompt
    reads at 0.2 ms a token; the engine-wide acceptance back at the declared priors (0.6 for either model)."""
    monkeypatch.setattr(engine.planner, "population", Population())
    costs = StepCosts()
    for _ in range(50):
        for n in (1, 2, 4, 8, 16):
            costs.record(n, 0.030 + 1e-4 * n)
    costs.draft_depth_s, costs.read_token_s = draft_s, 0.0002
    copy = costs.of("copy")
    copy.draft_depth_s = copy_s
    costs.draft_calls = copy.draft_calls = 1  # both timed
    monkeypatch.setattr(copy, "record_draft", lambda *a: None)
    freeze(monkeypatch, engine, costs)


def _reads(monkeypatch, engine) -> list[bool]:
    """Records, per admission of the draft model, whether it read the prompts (admit's `now`)."""
    drafter, seen = engine.drafters["draft_model"], []
    admit = drafter.admit
    monkeypatch.setattr(drafter, "admit", lambda reqs, now=True: seen.append(now) or admit(reqs, now))
    return seen


def _by_source(outputs) -> dict[str, int]:
    """Drafts verified per source over the outputs' requests."""
    out: dict[str, int] = {}
    for o in outputs:
        for source, (drafted, _) in o[-1].spec.by_source.items():
            out[source] = out.get(source, 0) + drafted
    return out


def test_auto_with_a_draft_checkpoint_loads_the_targets_copy_beside_it(lib, tmp_path):
    target, draft = save_checkpoint(tmp_path / "t", seed=0), save_checkpoint(tmp_path / "d", seed=3)
    pair = resolve(EngineConfig(checkpoint=str(target), draft_checkpoint=str(draft), draft_quantization="auto"))
    assert pair.draft.source == "checkpoint" and pair.drafter == "draft_model"
    assert pair.copy is not None and (pair.copy.source, pair.copy.shares_cache) == ("target", True)
    config = EngineConfig(checkpoint=str(target), draft_checkpoint=str(draft), draft_quantization="auto")
    labels = [p.what for p in footprint_of(config, pair)[0]]
    assert any("draft copy" in label for label in labels)  # the copy's bytes count before the load
    for quantization in ("int4", "int8", "none"):  # a draft quantized as named: no copy beside it
        named = EngineConfig(checkpoint=str(target), draft_checkpoint=str(draft), draft_quantization=quantization)
        assert resolve(named).copy is None
        with pytest.raises(ModelLoadError, match="drafter 'copy' needs a draft_checkpoint beside which"):
            resolve(EngineConfig(**{**named.__dict__, "drafter": "copy"}))
    alone = resolve(EngineConfig(checkpoint=str(target), draft_quantization="auto"))
    assert alone.copy is None and alone.draft.source == "target"  # no draft_checkpoint: the copy is draft_model


def test_output_is_identical_whichever_model_drafts(wrong):
    assert set(wrong.drafters) >= {"draft_model", "copy"}
    base = run(wrong, PROMPTS, max_tokens=16)
    for params in (
        dict(num_draft_tokens=AUTO_DRAFT),
        *(dict(num_draft_tokens=k, drafter=d) for k in (1, 3, 6) for d in ("copy", "draft_model")),
    ):
        got = run(wrong, PROMPTS, max_tokens=16, **params)
        assert [tokens_of(o) for o in got] == [tokens_of(o) for o in base], params
    fixed = _by_source(run(wrong, PROMPTS, max_tokens=16, num_draft_tokens=3, drafter="copy"))
    assert fixed.get("copy", 0) > 0 and "draft_model" not in fixed  # a fixed k drafts with the named model only
    fixed = _by_source(run(wrong, PROMPTS, max_tokens=16, num_draft_tokens=3, drafter="draft_model"))
    assert fixed.get("draft_model", 0) > 0 and "copy" not in fixed


def test_auto_drafts_with_the_copy_where_the_draft_model_misses(wrong, monkeypatch):
    _costs(monkeypatch, wrong, draft_s=0.002, copy_s=0.002)  # both cheap: acceptance decides
    base = run(wrong, PROMPTS, max_tokens=24)
    auto = run(wrong, PROMPTS, max_tokens=24, num_draft_tokens=AUTO_DRAFT)
    assert [tokens_of(o) for o in auto] == [tokens_of(o) for o in base]
    drafted = _by_source(auto)
    # the wrong draft model is tried first (the request's own drafter) and then loses to the copy
    assert drafted.get("copy", 0) > 3 * drafted.get("draft_model", 0), drafted
    # the engine-wide rates now favour the copy: the draft model no longer reads a new auto prompt
    seen = _reads(monkeypatch, wrong)
    again = run(wrong, PROMPTS[:1], max_tokens=24, num_draft_tokens=AUTO_DRAFT)
    assert seen == [False] and tokens_of(again[0]) == tokens_of(base[0])
    assert "draft_model" not in again[0][-1].spec.by_source and again[0][-1].spec.by_source.get("copy", (0, 0))[0]


def test_the_draft_model_reads_no_prompt_where_the_copy_is_expected_to_draft_better(right, monkeypatch):
    _costs(monkeypatch, right, draft_s=0.004, copy_s=0.001)  # both right (the target's weights); the copy cheaper
    seen = _reads(monkeypatch, right)
    base = run(right, PROMPTS[:2], max_tokens=24)
    auto = run(right, PROMPTS[:2], max_tokens=24, num_draft_tokens=AUTO_DRAFT)
    assert seen == [False] and [tokens_of(o) for o in auto] == [tokens_of(o) for o in base]
    drafted = _by_source(auto)
    assert drafted.get("copy", 0) > 0 and "draft_model" not in drafted, drafted


def test_auto_drafts_with_the_draft_model_where_the_copy_costs_more(right, monkeypatch):
    _costs(monkeypatch, right, draft_s=0.002, copy_s=0.020)  # a right draft model, cheap; the copy dear
    base = run(right, PROMPTS, max_tokens=24)
    auto = run(right, PROMPTS, max_tokens=24, num_draft_tokens=AUTO_DRAFT)
    assert [tokens_of(o) for o in auto] == [tokens_of(o) for o in base]
    drafted = _by_source(auto)
    assert drafted.get("draft_model", 0) > 0 and "copy" not in drafted, drafted


def _timed(draft_s: float, copy_s: float) -> StepCosts:
    """A 30 ms step at 1-4 rows; the draft model's depth draft_s, the copy's copy_s, each timed."""
    costs = StepCosts()
    for n in (1, 2, 4):
        costs.record(n, 0.030)
    costs.draft_depth_s, costs.of("copy").draft_depth_s = draft_s, copy_s
    costs.draft_calls = costs.of("copy").draft_calls = 1
    return costs


def test_an_untimed_model_is_tried_and_a_behind_one_pays_its_catch_up(right, monkeypatch):
    costs = _timed(0.002, 0.002)
    costs.of("copy").draft_calls, costs.of("copy").draft_depth_s = 0, 0.0  # the copy untimed
    req = right.make_request(SamplingParams(num_draft_tokens=AUTO_DRAFT), text="Hello there")
    req.acceptance = RequestAcceptance(None)  # the declared priors: 0.6 for either model
    drafters = right.drafters
    assert forward_depths.value("copy", drafters["copy"], req, 4, 0, costs) == float("inf")  # drafting times it
    costs.of("copy").draft_calls, costs.of("copy").draft_depth_s = 1, 0.002
    costs.read_token_s = 0.001
    monkeypatch.setattr(drafters["draft_model"], "behind", lambda r: 2)
    fresh = forward_depths.value("draft_model", drafters["draft_model"], req, 4, 0, costs)
    assert fresh == pytest.approx(forward_depths.value("copy", drafters["copy"], req, 4, 0, costs))
    monkeypatch.setattr(drafters["draft_model"], "behind", lambda r: 40)  # 38 tokens to read first
    assert forward_depths.value("draft_model", drafters["draft_model"], req, 4, 0, costs) < fresh
    costs.of("copy").draft_depth_s = 0.004  # a dearer copy: the fresh draft model expects more
    monkeypatch.setattr(drafters["draft_model"], "behind", lambda r: 2)
    for name in ("draft_model", "copy"):  # both have read the prompt (as if admitted)
        monkeypatch.setattr(drafters[name], "started", lambda r: True)
    assert forward_depths.choose(drafters, [req], [4], [[]], costs) == ["draft_model"]
    costs.of("copy").draft_depth_s = 0.001
    assert forward_depths.choose(drafters, [req], [4], [[]], costs) == ["copy"]
    monkeypatch.setattr(drafters["draft_model"], "started", lambda r: False)  # a prompt it never read
    costs.of("copy").draft_depth_s = 0.004
    assert forward_depths.choose(drafters, [req], [4], [[]], costs) == ["copy"]


def test_a_request_keeps_the_winning_model_until_its_own_acceptance_says_otherwise(right, monkeypatch):
    costs = _timed(0.002, 0.002)  # equal costs: acceptance decides
    drafters = right.drafters
    for name in ("draft_model", "copy"):
        monkeypatch.setattr(drafters[name], "started", lambda r: True)
        monkeypatch.setattr(drafters[name], "behind", lambda r: 1)

    def fresh():
        """A request with the engine-wide rates as the warm-up leaves them: the copy ahead (0.87 against 0.60)."""
        population = Population()
        population.observe("copy", 9, 10)
        population.observe("draft_model", 6, 10)
        req = right.make_request(SamplingParams(num_draft_tokens=AUTO_DRAFT), text="Hello there")
        req.acceptance = RequestAcceptance(population)
        return req

    def steps(req, n: int) -> list[str]:
        return [forward_depths.choose(drafters, [req], [4], [[]], costs)[0] for _ in range(n)]

    req = fresh()
    assert steps(req, 48) == ["copy"] * 48  # the winner at the engine-wide rates, and no step spent on the other
    for _ in range(3):  # the request's own evidence: the copy's first drafts rejected
        req.acceptance.observe(["copy"], 1, 0, None)
    assert steps(req, 4) == ["draft_model"] * 4  # now the draft model, at its engine-wide rate, expects more
    for _ in range(6):  # and its drafts rejected too: back to the copy
        req.acceptance.observe(["draft_model"], 1, 0, None)
    assert steps(req, 1) == ["copy"]
    req = fresh()  # the same evidence against the copy, where the draft model missed 38 tokens
    for _ in range(3):
        req.acceptance.observe(["copy"], 1, 0, None)
    monkeypatch.setattr(drafters["draft_model"], "behind", lambda r: 40)
    costs.read_token_s = 0.01  # reading them first costs more than its edge: the copy stays
    assert steps(req, 1) == ["copy"]


def test_the_draft_model_reads_a_prompt_only_where_it_expects_more_than_the_copy(right):
    costs = StepCosts()
    for _ in range(50):
        for n in (1, 2, 4, 8, 16):
            costs.record(n, 0.030 + 1e-4 * n)
    costs.draft_calls = costs.of("copy").draft_calls = 1
    costs.read_token_s = 1e-6  # a read that pays against no drafts at all: the copy alone decides
    drafters = right.drafters
    req = right.make_request(SamplingParams(num_draft_tokens=AUTO_DRAFT, max_tokens=64), text=PROMPTS[0])
    req.acceptance = RequestAcceptance(None)  # the declared priors: 0.6 for either model
    assert read_pays(1, costs, 0.6, 64, len(req.prompt_ids))
    costs.draft_depth_s = 0.002
    for copy_s, read in ((0.003, True), (0.002, False), (0.001, False)):  # the copy dearer, the same, cheaper
        costs.of("copy").draft_depth_s = copy_s
        got = forward_depths.readers("draft_model", drafters, [req], [req], [req], Population(), costs, 4)
        assert got == (([req], []) if read else ([], [req])), copy_s
    costs.of("copy").draft_calls = 0  # the copy untimed, the draft model timed: the copy is tried first
    costs.of("copy").draft_depth_s = 0.0
    assert forward_depths.readers("draft_model", drafters, [req], [req], [req], Population(), costs, 4) == ([], [req])
    costs.draft_calls = costs.draft_depth_s = 0  # both untimed: a tie, no read (the copy drafts and is timed)
    assert forward_depths.readers("draft_model", drafters, [req], [req], [req], Population(), costs, 4) == ([], [req])
