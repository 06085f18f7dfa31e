"""A guided auto request's draft-model read put off (speculation/deferred_reads.py): not read at admission, read
once its own steps say the model pays and not while its free drafts carry it, greedy output unchanged."""

import pytest

from specgram.request import AUTO_DRAFT, SamplingParams
from specgram.speculation.costs import StepCosts
from specgram.speculation.deferred_reads import CHECK_STEPS, DeferredReads, Tally, free_rate

from .helpers import cheap_draft_model, run_to_end, target_and_draft

REGEX = r"[a-z]{2,5}( [a-z]{2,5}){0,20}"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("deferred")


def request(engine, guided: bool, **kw):
    """A request on "Hello there"; a guided one's grammar compiled before it is added (compiles run elsewhere)."""
    r = engine.make_request(params(guided, **kw), text="Hello there")
    if r.pending_grammar is not None:
        r.pending_grammar.future.result()
    return r


def params(guided: bool, k=AUTO_DRAFT, max_tokens=24) -> SamplingParams:
    guide = dict(guide_type="regex", guide=REGEX) if guided else {}
    return SamplingParams(max_tokens=max_tokens, num_draft_tokens=k, drafter="draft_model", **guide)


def test_a_tally_is_due_every_check_steps_and_priced_at_its_mean_rows():
    d = DeferredReads()

    class R:
        request_id = 7

    d.defer("draft_model", [R])
    dues = [d.observe(R, 3, 2) for _ in range(CHECK_STEPS)]
    assert dues[:-1] == [None] * (CHECK_STEPS - 1) and dues[-1] == Tally("draft_model", CHECK_STEPS, 8, 12)
    d.again(R)
    assert d.pending[7] == Tally("draft_model")
    costs = StepCosts()
    for _ in range(20):
        for n in (1, 2, 4, 8):
            costs.record(n, 0.020 + 0.001 * n)
    cost = costs.curve()
    assert free_rate(Tally("m", 4, 8, 12), cost) == pytest.approx(8 / (4 * cost(3)))
    d.forget(R)
    assert d.observe(R, 1, 1) is None


def step_until(engine, done, limit=200) -> None:
    for _ in range(limit):
        if done():
            return
        engine.step()
    raise AssertionError("the engine did not get there")


def test_guided_reads_wait_and_free_reads_do_not(root, monkeypatch):
    """At admission the model reads the free request's prompt and not the guided one's; the guided one is
    weighed after CHECK_STEPS steps and, its lookups carrying little on a random model while the model is cheap
    and always right, read then; both outputs are what no speculation gives."""
    engine = target_and_draft(root, 128, draft_seed=0)  # the draft is the target: every draft right
    cheap_draft_model(monkeypatch, engine)
    model, planner = engine.drafters["draft_model"], engine.planner
    reads = []
    real_read = planner._read
    monkeypatch.setattr(planner, "_read", lambda name, reqs: (reads.extend(reqs), real_read(name, reqs)))
    guided, free = request(engine, True), request(engine, False)
    for r in (guided, free):
        engine.add(r)
    step_until(engine, lambda: guided.request_id in planner.deferred.pending and model.started(free))
    assert reads == [free] and not model.started(guided)
    step_until(engine, lambda: guided.finished and free.finished)
    assert reads == [free, guided]  # weighed, then read
    for r in (guided, free):
        ref = request(engine, r is guided, k=0)
        run_to_end(engine, [ref])
        assert r.output_ids == ref.output_ids and len(r.output_ids) > CHECK_STEPS
    assert guided.request_id not in planner.deferred.pending  # forgotten at release


def test_a_deferred_read_is_made_only_where_the_model_could_beat_the_requests_own_rate(root, monkeypatch):
    engine = target_and_draft(root, 128, draft_seed=0)
    cheap_draft_model(monkeypatch, engine)
    model, planner = engine.drafters["draft_model"], engine.planner
    r = request(engine, True, max_tokens=64)
    engine.add(r)
    step_until(engine, lambda: r.request_id in planner.deferred.pending)
    n = CHECK_STEPS * (planner.max_draft_len + 1)  # every step verified and took max_draft_len drafts
    planner._weigh(r, Tally("draft_model", CHECK_STEPS, n, n))
    assert not model.started(r) and r.request_id in planner.deferred.pending  # nothing for the model to beat
    planner._weigh(r, Tally("draft_model", CHECK_STEPS, CHECK_STEPS, CHECK_STEPS))  # a token a step
    assert model.started(r) and r.request_id not in planner.deferred.pending
    step_until(engine, lambda: r.finished)
