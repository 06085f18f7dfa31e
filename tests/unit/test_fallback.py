"""The fallback to plain decoding (speculation/fallback.py): which side it runs from the rates steps realise, how it
probes the other, which steps it measures; and that the engine's output does not depend on what it chooses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specgram.speculation import fallback as fb
from specgram.speculation.fallback import Fallback


def reqs(n: int, auto: bool = True) -> list:
    return [SimpleNamespace(params=SimpleNamespace(auto_draft=auto), output_ids=[]) for _ in range(n)]


def drive(check: Fallback, rs: list, steps: int, rate, decode_only=lambda i: True, more=True) -> list[bool]:
    """Run `steps` steps on the check's fake clock: a free step commits rate(False) tokens per request in 10 ms, a
    held step rate(True); -> each step's choice (True: held)."""
    now, out = getattr(check, "clock", 0.0), []
    for i in range(steps):
        held = check.begin(rs, decode_only(i), now)
        for r in rs:
            r.output_ids += [0] * rate(held)
        check.end(more)
        out.append(held)
        now += 0.01
    check.clock = now
    return out


def test_speculation_that_pays_runs_almost_every_step():
    check = Fallback()
    choices = drive(check, reqs(1), 400, lambda held: 1 if held else 3)
    free, held = check.rates(1)
    assert free == pytest.approx(300) and held == pytest.approx(100)
    late = choices[100:]
    assert late.count(True) <= len(late) * fb.RUN / fb.WIDE_EVERY + fb.RUN  # probes only
    assert any(late)  # the held side is measured again now and then


def test_speculation_that_loses_is_held_and_probed():
    check = Fallback()
    # drafting steps commit 2 tokens per request in the interval where plain ones commit... 2.2 (a loss)
    n = 8
    rs = reqs(n)
    now, choices = 0.0, []
    for _ in range(400):
        held = check.begin(rs, True, now)
        for r in rs:
            r.output_ids += [0] * (1 if held else 2)
        check.end(True)
        choices.append(held)
        now += 0.010 if held else 0.022  # a free step: 2 tokens in 22 ms < a held one: 1 token in 10 ms
    free, held = check.rates(n)
    assert held > free
    late = choices[100:]
    assert late.count(False) <= len(late) * fb.RUN / fb.PROBE_EVERY + fb.RUN
    assert not all(late)  # drafting is tried again now and then
    assert check.held_steps == sum(choices)


def test_rates_are_kept_per_number_of_streams():
    check = Fallback()
    drive(check, reqs(1), 60, lambda held: 1 if held else 3)
    drive(check, reqs(4), 60, lambda held: 2 if held else 1)
    assert check.rates(1)[0] > check.rates(1)[1]
    assert check.rates(4)[1] > check.rates(4)[0]
    assert check.rates(2) is None


def test_prefill_steps_fixed_k_requests_and_idle_ends_are_not_measured():
    check = Fallback()
    assert drive(check, reqs(2), 50, lambda held: 1, decode_only=lambda i: False) == [False] * 50
    assert drive(check, reqs(2, auto=False), 50, lambda held: 1) == [False] * 50
    drive(check, reqs(2), 50, lambda held: 1, more=False)  # the engine goes idle after every step
    assert check.rates(2) == (0.0, 0.0)


def test_first_step_of_a_run_is_not_measured():
    check = Fallback()
    rs = reqs(1)
    now = 0.0
    seen = []
    for _ in range(40):
        held = check.begin(rs, True, now)
        before = (check.at[1].free.samples, check.at[1].held.samples)
        seen.append((held, before))
        rs[0].output_ids.append(0)
        check.end(True)
        now += 0.01
    # a step is measured when the next one begins, and only if the step before it ran the same side
    switches = sum(1 for a, b in zip(seen, seen[1:], strict=False) if a[0] != b[0])
    total = check.at[1].free.samples + check.at[1].held.samples
    assert total <= 40 - 1 - switches


def test_off_never_holds():
    check = Fallback(enabled=False)
    assert not any(drive(check, reqs(8), 100, lambda held: 2 if held else 1))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from .helpers import target_and_draft

    return target_and_draft(tmp_path_factory.mktemp("fallback"), 128, draft_seed=0)  # the drafts are right


PROMPTS = ["the cat sat on the mat. the cat sat on", "abc abc abc abd abc ab", "one two three one two"]


@pytest.mark.parametrize("drafter", ["draft_model", "ngram"])
@pytest.mark.parametrize("sampled", [False, True])
def test_output_does_not_depend_on_what_the_fallback_chooses(engine, monkeypatch, drafter, sampled):
    from .helpers import run, tokens_of

    params = dict(max_tokens=24, ignore_eos=True, drafter=drafter, num_draft_tokens=-1)
    if sampled:
        params.update(temperature=1.0, seed=[5, 6, 7])
    plain = [tokens_of(o) for o in run(engine, PROMPTS, **{**params, "num_draft_tokens": 0})]
    free = [tokens_of(o) for o in run(engine, PROMPTS, **params)]
    choices = []
    real = engine.fallback.begin

    def every_other(decoding, decode_only, now):
        real(decoding, decode_only, now)
        choices.append(len(choices) % 3 != 0)
        return choices[-1]

    monkeypatch.setattr(engine.fallback, "begin", every_other)
    mixed = [tokens_of(o) for o in run(engine, PROMPTS, **params)]
    assert plain == free == mixed
    assert any(choices) and not all(choices)


def test_held_steps_draft_nothing_for_auto_requests_only(engine, monkeypatch):
    from .helpers import run

    monkeypatch.setattr(engine.fallback, "begin", lambda decoding, decode_only, now: True)
    auto, fixed = run(engine, PROMPTS[:2], max_tokens=16, ignore_eos=True, num_draft_tokens=[-1, 3])
    assert auto[-1].spec.drafted == 0
    assert fixed[-1].spec.drafted > 0  # a fixed k is the client's choice
