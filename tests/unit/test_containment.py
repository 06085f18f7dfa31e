"""A failure belongs to one request: whatever one request's values do, and wherever in the step its own work fails,
that request ends with its own error and every batch-mate's output is what it is alone."""

import time

import pytest

from specgram import faults as faults_mod
from specgram.engine import penalties
from specgram.request import SamplingParams
from specgram.sample import sampling

from .helpers import target_and_draft, tokens_of

MATES = [
    ("The quick brown fox jumps", {}),
    ("abcabc abcabc abc", {"num_draft_tokens": 3}),
    ("Hello there", {"guide_type": "regex", "guide": "[a-z ]{4,30}", "num_draft_tokens": 2}),
]


def _req(engine, text, **kw):
    kw.setdefault("max_tokens", 24)
    return engine.make_request(SamplingParams(**kw), text=text)


def _drive(engine, reqs):
    """Step until every request ends -> {request id: [outputs]}; each request must get exactly one final."""
    for r in reqs:
        engine.add(r)
    outs = {r.request_id: [] for r in reqs}
    deadline = time.monotonic() + 120  # a bound in time, not steps: a step that only waits on compiles is instant
    while engine.has_work() and time.monotonic() < deadline:
        for o in engine.step():
            outs[o.request_id].append(o)
        if engine.only_waiting_for_grammars():
            time.sleep(0.001)  # the grammar compiles run in their own threads
    assert not engine.has_work()
    for rid, got in outs.items():
        assert [o.finished for o in got].count(True) == 1 and got[-1].finished, rid
    return outs


def _solo(engine, mates=MATES, **common):
    return [
        tokens_of(_drive(engine, [r])[r.request_id]) for r in [_req(engine, t, **{**common, **kw}) for t, kw in mates]
    ]


def _with_victim(engine, victim, mates=MATES, **common):
    """The victim among the mates, submitted together -> (victim's outputs, the mates' tokens)."""
    reqs = [_req(engine, t, **{**common, **kw}) for t, kw in mates]
    outs = _drive(engine, [victim, *reqs])
    assert not engine.scheduler.running and len(engine.scheduler.free_slots) == engine.config.max_slots
    return outs[victim.request_id], [tokens_of(outs[r.request_id]) for r in reqs]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A tiny target with a draft model of other random weights, 4 slots (the victim and three mates)."""
    return target_and_draft(tmp_path_factory.mktemp("containment"), 256, max_slots=4)


def _digits(engine):
    return engine.tokenizer.convert_tokens_to_ids(list("0123456789"))


@pytest.mark.parametrize("drafter,k", [("draft_model", 3), ("ngram", 3), ("draft_model", 0)])
def test_a_guide_whose_token_list_leaves_nothing_ends_that_request_alone(engine, drafter, k):
    """Regex [0-9]{3}x with only the digits allowed: after three digits nothing may follow. The request ends with
    one INVALID error naming the cause; it never holds a token it excluded; the mates are as alone."""
    alone = _solo(engine, drafter=drafter)
    victim = _req(
        engine,
        "Give me a code",
        guide_type="regex",
        guide="[0-9]{3}x",
        allowed_token_ids=_digits(engine),
        drafter=drafter,
        num_draft_tokens=k,
    )
    got, mates = _with_victim(engine, victim, drafter=drafter)
    assert mates == alone
    final = got[-1]
    assert final.finish_reason == "error" and final.error_kind == "invalid"
    assert "allowed_token_ids" in final.error
    assert set(tokens_of(got)) <= set(_digits(engine)) and len(tokens_of(got)) == 3


def test_bad_words_that_cover_the_grammar_end_that_request_alone(engine):
    alone = _solo(engine)
    victim = _req(engine, "Say yes", guide_type="regex", guide="(yes|no)", bad_words=["y", "n"], num_draft_tokens=2)
    got, mates = _with_victim(engine, victim)
    assert mates == alone
    assert got[-1].error_kind == "invalid" and not tokens_of(got)


# where each phase's failure is injected: a stand-in that raises (1 / 0) for the victim alone
def _inject(monkeypatch, engine, phase, victim):
    if phase == "admission":
        real = engine.output.start
        monkeypatch.setattr(engine.output, "start", lambda r: real(r) if r is not victim else 1 / 0)
    elif phase == "prefill":  # the first token's logits processors
        real = penalties.apply
        monkeypatch.setattr(
            penalties,
            "apply",
            lambda logits, rows: real(logits, rows) if all(r is not victim for _, r, _ in rows) else 1 / 0,
        )
    elif phase == "drafting":  # the drafter over a batch holding the victim, after two tokens
        drafter = engine.drafters["ngram"]
        real = drafter.propose
        monkeypatch.setattr(
            drafter,
            "propose",
            lambda reqs, *a: real(reqs, *a) if victim not in reqs or len(victim.output_ids) < 2 else 1 / 0,
        )
    elif phase == "grammar":  # the victim's matcher, after three tokens
        real = engine.planner.masks.fill
        monkeypatch.setattr(
            engine.planner.masks,
            "fill",
            lambda slot, guide: real(slot, guide) if guide is not victim.guide or len(victim.output_ids) < 3 else 1 / 0,
        )
    elif phase == "verify":  # the verify rows' processors, after four tokens
        real = penalties.apply
        monkeypatch.setattr(
            penalties,
            "apply",
            lambda logits, rows: (
                real(logits, rows) if all(r is not victim for _, r, _ in rows) or len(victim.output_ids) < 4 else 1 / 0
            ),
        )
    elif phase == "sampling":  # the verify's token choice over a batch holding the victim
        real = sampling.accept
        monkeypatch.setattr(
            sampling,
            "accept",
            lambda reqs, *a: real(reqs, *a) if victim not in reqs or len(victim.output_ids) < 3 else 1 / 0,
        )
    elif phase == "settle":  # the drafter's bookkeeping after the verify
        drafter = engine.drafters["ngram"]
        real = drafter.committed
        monkeypatch.setattr(
            drafter, "committed", lambda r, a: real(r, a) if r is not victim or len(victim.output_ids) < 2 else 1 / 0
        )
    elif phase == "logprobs":
        real = engine.logprobs._entry
        monkeypatch.setattr(engine.logprobs, "_entry", lambda lp, n, toks: real(lp, n, toks) if n != 3 else 1 / 0)
    elif phase == "commit":  # the victim's text and stop checks
        real = engine.output.commit
        monkeypatch.setattr(
            engine.output,
            "commit",
            lambda r, *a: real(r, *a) if r is not victim or len(victim.output_ids) < 5 else 1 / 0,
        )


PHASES = ["admission", "prefill", "drafting", "grammar", "verify", "sampling", "settle", "logprobs", "commit"]


@pytest.mark.parametrize("phase", PHASES)
def test_a_failure_in_any_phase_ends_its_request_alone(engine, monkeypatch, phase):
    """Each phase's per-request work fails for one request (a stand-in that raises): that request ends with an
    internal error, the mates (one plain, one drafting by lookup, one guided) stream what they stream alone."""
    common = {"drafter": "ngram"}
    alone = _solo(engine, **common)
    victim = _req(
        engine,
        "abcabc abcabc abc",
        guide_type="regex",
        guide="[a-c ]{8,40}",
        repetition_penalty=1.1,
        num_draft_tokens=3,
        logprobs=3,
        **common,
    )
    _inject(monkeypatch, engine, phase, victim)
    got, mates = _with_victim(engine, victim, **common)
    assert mates == alone
    final = got[-1]
    assert final.finish_reason == "error" and final.error_kind == "internal"
    assert "ZeroDivisionError" in final.error


def test_each_or_alone_blames_the_request_whose_own_call_fails():
    class R:
        def __init__(self, i):
            self.request_id = i

    reqs = [R(1), R(2), R(3)]
    f = faults_mod.Faults()

    def fn(sub):
        if any(r.request_id == 2 for r in sub):
            raise ValueError("two")
        return [r.request_id * 10 for r in sub]

    assert f.each_or_alone(reqs, fn, -1) == [10, -1, 30]
    assert [(r.request_id, str(e)) for r, e in f.take()] == [(2, "two")]
    assert not f


def test_a_failed_request_leaves_its_batch_mates_logprobs_their_own(engine, monkeypatch):
    """The victim (verify row 0) fails in the token choice; the mate after it asked for logprobs: they are its
    own tokens' logprobs, as alone (the rows that go on are renumbered, their logprobs with them)."""
    mate = [("The quick brown fox jumps", {"logprobs": 2, "drafter": "ngram", "num_draft_tokens": 3})]

    def logprobs(outs):
        return [(row[0].token_id, round(row[0].logprob, 4)) for o in outs for row in o.logprobs]

    r = _req(engine, *mate[0][:1], **mate[0][1])
    alone = logprobs(_drive(engine, [r])[r.request_id])
    victim = _req(engine, "abcabc abcabc abc", drafter="ngram", num_draft_tokens=3)
    real = sampling.accept
    monkeypatch.setattr(
        sampling,
        "accept",
        lambda reqs, *a: real(reqs, *a) if victim not in reqs or len(victim.output_ids) < 3 else 1 / 0,
    )
    other = _req(engine, *mate[0][:1], **mate[0][1])
    outs = _drive(engine, [victim, other])
    assert outs[victim.request_id][-1].error_kind == "internal"
    assert logprobs(outs[other.request_id]) == alone
    assert [t for t, _ in alone] == tokens_of(outs[other.request_id])
