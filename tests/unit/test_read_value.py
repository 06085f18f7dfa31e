"""What a draft model's prompt read has been worth (speculation/read_value.py): learned per kind of request from
the model's drafts against the lookup drafts they displaced, and a new auto request's prompt read only where that
worth over its tokens exceeds the read (one in PROBE_EVERY read anyway). Output stays exact whatever is read."""

from __future__ import annotations

from contextlib import closing

import pytest

from specgram.drafting.proposal import Proposal
from specgram.request import AUTO_DRAFT, Request, SamplingParams
from specgram.speculation import read_value
from specgram.speculation.read_value import MIN_TOKENS, PROBE_EVERY, ReadValue, lookup_hits
from specgram.speculation.rows import VerifyRow

from .helpers import PROMPTS, cheap_draft_model, run, target_and_draft, tokens_of


class _Reading:  # a forward drafter with a cache of its own (the draft model's declaration)
    reads_prompts = True


READING = {"draft_model": _Reading()}

# ---- pure parts ---------------------------------------------------------------------------------------------


def _req(outputs: int = 0) -> Request:
    r = Request(prompt_ids=[1, 2, 3], params=SamplingParams())
    r.output_ids = list(range(10, 10 + outputs))
    return r


def _row(req, drafts, sources, accepted, token, shadow=None) -> VerifyRow:
    v = VerifyRow(req, proposal=Proposal(drafts, sources=sources), shadow=shadow)
    v.accepted, v.token, v.path = accepted, token, list(range(1, accepted + 1))
    return v


def test_lookup_hits_counts_the_drafts_that_lead_the_committed_tokens():
    assert lookup_hits([5, 6, 9], [5, 6, 8]) == 2
    assert lookup_hits([5, 6], [5, 6, 8]) == 2
    assert lookup_hits([4], [5]) == 0
    assert lookup_hits([], [5]) == 0


def test_a_model_line_gains_its_accepted_drafts_less_what_its_shadow_lookup_would_have_had_accepted():
    worth, r = ReadValue(), _req()
    worth.started([r])
    model = ["forced", "draft_model", "draft_model"]
    # model: forced 5, then 6 (accepted) and 7 (rejected; the target said 8): one model draft accepted
    worth.settle(
        [_row(r, [5, 6, 7], model, 2, 8, shadow=Proposal([5, 6, 9], sources=["forced", "prompt", "prompt"]))],
        0.03,
        READING,
    )
    assert worth.open[r.request_id][0] == pytest.approx(0.0)  # the lookup had the same 6: nothing gained
    worth.settle(
        [_row(r, [5, 6, 7], model, 3, 8, shadow=Proposal([5, 9], sources=["forced", "prompt"]))], 0.03, READING
    )
    assert worth.open[r.request_id][0] == pytest.approx(0.06)  # two model drafts the lookup did not have
    worth.settle([_row(r, [6], ["draft_model"], 0, 4, shadow=Proposal([4, 4], sources=["prompt"] * 2))], 0.03, READING)
    assert worth.open[r.request_id][0] == pytest.approx(0.03)  # the lookup would have had 4 accepted: a loss
    worth.settle([_row(r, [4, 4], ["prompt"] * 2, 2, 1)], 0.03, READING)  # a lookup line: not the model's
    assert worth.open[r.request_id][0] == pytest.approx(0.03)
    worth.settle([_row(r, [6, 7], ["copy"] * 2, 2, 1)], 0.03, READING)  # the copy beside it: no read's
    assert worth.open[r.request_id][0] == pytest.approx(0.03)
    other = _req()  # a request the model did not read: not tallied
    worth.settle([_row(other, [6], ["draft_model"], 1, 4)], 0.03, READING)
    assert other.request_id not in worth.open


def test_a_kinds_worth_is_its_requests_net_seconds_per_output_token_and_decides_the_next_read():
    worth, a = ReadValue(), _req(outputs=100)
    assert worth.pays(_req(), 100, 1.0)  # nothing learned yet: read
    worth.started([a])
    worth.gained(a, 10, 0.03)  # 0.3 s saved
    worth.spent(a, 0.5)  # 0.5 s drafting
    worth.finished(a)
    assert worth.worth("free") == pytest.approx(-0.002) and not worth.open
    assert not worth.pays(_req(), 100, 0.01)  # drafts cost more than they saved: no read, however cheap
    guided = _req()
    guided.guide = object()
    assert worth.pays(guided, 100, 0.01)  # another kind: nothing learned for it
    b = _req(outputs=50)
    worth.started([b])
    worth.gained(b, 50, 0.03)  # 1.5 s saved for 0 spent: 0.03 s a token
    worth.finished(b)
    # token-weighted: (0.8 x -0.2 + 1.5) s over (0.8 x 100 + 50) tokens = 0.0103 s a token
    assert worth.worth("free") == pytest.approx((0.8 * -0.2 + 1.5) / (0.8 * 100 + 50))
    assert worth.pays(_req(), 100, 1.0) and not worth.pays(_req(), 100, 1.1)


def test_a_kind_whose_reads_do_not_pay_still_reads_one_request_in_probe_every():
    worth = ReadValue()
    worth.sums["free"] = (-1.0, 100.0)
    decisions = [worth.pays(_req(), 100, 0.1) for _ in range(2 * PROBE_EVERY)]
    assert decisions == ([False] * (PROBE_EVERY - 1) + [True]) * 2


def test_a_request_ended_with_few_tokens_teaches_nothing():
    worth, r = ReadValue(), _req(outputs=MIN_TOKENS - 1)
    worth.started([r])
    worth.spent(r, 1.0)
    worth.finished(r)
    assert worth.worth("free") is None and not worth.open


# ---- through the engine -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def right(tmp_path_factory):
    with closing(target_and_draft(tmp_path_factory.mktemp("read-value"), 96, draft_seed=0)) as engine:
        yield engine


def _reads(monkeypatch, engine) -> list[bool]:
    drafter, seen = engine.drafters["draft_model"], []
    admit = drafter.admit
    monkeypatch.setattr(drafter, "admit", lambda reqs, now=True: seen.append(now) or admit(reqs, now))
    return seen


def test_reads_that_did_not_pay_are_skipped_but_for_a_probe_and_output_stays_exact(right, monkeypatch):
    engine = right
    if engine.drafters["draft_model"].runner.native is None:
        pytest.skip("a prompt read is skipped on native draft runners only (their rows are packed, not padded)")
    cheap_draft_model(monkeypatch, engine)  # by the step costs alone, every read pays
    worth = ReadValue()
    worth.sums["free"] = (-0.2, 20.0)  # as learned: the model's drafts cost more than they saved over the lookups
    monkeypatch.setattr(engine.planner, "read_value", worth)
    seen = _reads(monkeypatch, engine)
    n = MIN_TOKENS + 8  # enough for the probe to teach
    base = run(engine, PROMPTS[:1], max_tokens=n)
    outs = [run(engine, PROMPTS[:1], max_tokens=n, num_draft_tokens=AUTO_DRAFT, drafter="draft_model")[0]]
    assert seen == [False] and "draft_model" not in outs[0][-1].spec.by_source  # not read: no model drafts
    for _ in range(PROBE_EVERY - 1):
        outs.append(run(engine, PROMPTS[:1], max_tokens=n, num_draft_tokens=AUTO_DRAFT, drafter="draft_model")[0])
    assert seen == [False] * (PROBE_EVERY - 1) + [True]  # the probe
    assert outs[-1][-1].spec.by_source.get("draft_model", (0, 0))[1] > 0  # the probe drafted with the model
    assert all(tokens_of(o) == tokens_of(base[0]) for o in outs)
    # the probe's drafts (the target's own weights: all accepted, a lookup rarely has them) raised the worth
    assert worth.worth("free") > -0.01 and not worth.open
    fixed = run(engine, PROMPTS[:1], max_tokens=n, num_draft_tokens=3, drafter="draft_model")
    assert seen[-1] is True and tokens_of(fixed[0]) == tokens_of(base[0])  # a fixed k: always read


def test_the_worth_is_learned_from_the_requests_the_model_read(right, monkeypatch):
    engine = right
    cheap_draft_model(monkeypatch, engine)
    worth = ReadValue()
    monkeypatch.setattr(engine.planner, "read_value", worth)
    seen = _reads(monkeypatch, engine)
    base = run(engine, PROMPTS, max_tokens=MIN_TOKENS + 8)
    auto = run(engine, PROMPTS, max_tokens=MIN_TOKENS + 8, num_draft_tokens=AUTO_DRAFT, drafter="draft_model")
    assert [tokens_of(o) for o in auto] == [tokens_of(o) for o in base]
    assert all(seen) and sum(o[-1].spec.by_source.get("draft_model", (0, 0))[1] for o in auto) > 0
    assert set(worth.sums) == {read_value.kind(Request(prompt_ids=[1], params=SamplingParams()))}
    assert not worth.open  # every read request's tally closed at its release
