"""The EngineLoop's serving limits on a tiny model: the waiting bound, queue and run deadlines, the shutdown
drain and a dying engine.

Steps are slowed to at least STEP_S each, so a request of n tokens runs at least n * STEP_S: the tests rely on
such lower bounds only (a loaded machine makes steps slower, never faster), and wait generously for the rest.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from specgram.request import SamplingParams
from specgram.serving.loop import EngineLoop
from specgram.wire import ErrorKind, FinishReason

from .helpers import run, run_to_end

STEP_S = 0.01
WAIT_S = 120  # upper bounds on waits: far above what a busy 2-core machine needs


class Recorder:
    """A sink: the outputs of one request; `first` once one arrived, `done` once the final one did."""

    def __init__(self):
        self.outputs = []
        self.first, self.done = threading.Event(), threading.Event()
        self.done_at = None

    def __call__(self, out):
        self.outputs.append(out)
        self.first.set()
        if out.finished:
            self.done_at = time.monotonic()
            self.done.set()

    @property
    def final(self):
        assert self.done.wait(WAIT_S), "the request never ended"
        return self.outputs[-1]

    @property
    def tokens(self):
        return [t for o in self.outputs for t in o.token_ids]


@contextlib.contextmanager
def serving(make_engine, **config):
    """An EngineLoop over a tiny engine whose steps take at least STEP_S."""

    def factory():
        engine = make_engine(**config)
        step = engine.step
        engine.step = lambda: (time.sleep(STEP_S), step())[1]
        return engine

    loop = EngineLoop.build(factory)
    try:
        yield loop
    finally:
        loop.shutdown(grace_s=0)


def submit(loop, text="Hello there", timeout_s=None, **params):
    rec = Recorder()
    req = loop.engine.make_request(SamplingParams(ignore_eos=True, **params), text=text)
    rec.request_id = req.request_id
    rec.accepted = loop.submit(req, rec, timeout_s)
    return rec


def running(loop, **params):
    """A request that holds the (only) slot for a while: it has produced its first output."""
    rec = submit(loop, max_tokens=200, **params)
    assert rec.accepted and rec.first.wait(WAIT_S)
    return rec


def assert_refused(rec, *needles):
    assert not rec.accepted and rec.done.is_set(), "a refusal is the request's final output, at once"
    assert len(rec.outputs) == 1 and rec.final.finish_reason == FinishReason.ERROR
    assert rec.final.error_kind == ErrorKind.UNAVAILABLE
    for needle in needles:
        assert needle in rec.final.error, (needle, rec.final.error)


def test_over_the_waiting_bound_a_request_is_refused_at_once_and_never_reaches_the_engine(make_engine):
    """Only requests without a slot count: two running ones leave room for one waiting."""
    with serving(make_engine, max_slots=2, max_waiting_requests=1) as loop:
        added = []
        add = loop.engine.add
        loop.engine.add = lambda req: (added.append(req.request_id), add(req))[1]
        a1, a2 = running(loop), running(loop)
        b = submit(loop, max_tokens=2)  # waits for a slot
        c = submit(loop, max_tokens=2)
        assert b.accepted
        assert_refused(c, "at capacity", "max_waiting_requests = 1")
        loop.abort(a1.request_id)
        assert b.final.finish_reason == FinishReason.LENGTH
        d = submit(loop, max_tokens=2)  # b left the queue: there is room again
        assert d.accepted and d.final.finish_reason == FinishReason.LENGTH
        assert c.request_id not in added and {a1.request_id, a2.request_id, b.request_id, d.request_id} <= set(added)
        loop.abort(a2.request_id)


def test_the_waiting_prompt_tokens_are_bounded_but_a_long_prompt_alone_is_taken(make_engine):
    with serving(make_engine, max_slots=1, max_waiting_prompt_tokens=12) as loop:
        a = running(loop)
        long = submit(loop, text="x" * 20, max_tokens=2)  # longer than the bound, but nothing waits
        assert long.accepted
        assert_refused(submit(loop, text="y", max_tokens=2), "max_waiting_prompt_tokens = 12", "prompt tokens")
        loop.abort(long.request_id)
        assert long.final.finish_reason == FinishReason.CANCELLED
        assert submit(loop, text="z" * 5, max_tokens=2).accepted  # its tokens left with it
        assert_refused(submit(loop, text="w" * 8, max_tokens=2), "max_waiting_prompt_tokens")
        loop.abort(a.request_id)


def test_a_request_without_a_slot_within_max_queue_delay_ms_is_refused(make_engine):
    with serving(make_engine, max_slots=1, max_queue_delay_ms=300) as loop:
        a = running(loop)  # >= 199 more steps: >= 2 s
        t0 = time.monotonic()
        b = submit(loop, max_tokens=2)
        assert b.accepted and b.final.error_kind == ErrorKind.UNAVAILABLE
        assert "max_queue_delay_ms = 300" in b.final.error and b.done_at - t0 >= 0.3
        assert not a.done.is_set(), "the running request is not touched"
        loop.abort(a.request_id)


def test_run_limits_end_a_request_with_finish_reason_timeout_and_its_text_so_far(make_engine):
    """The client's timeout applies when shorter than request_timeout_s; the setting when the client's is longer."""
    with serving(make_engine, max_slots=2, max_seq_len=512, request_timeout_s=2) as loop:
        t0 = time.monotonic()
        short = submit(loop, max_tokens=400, timeout_s=0.5)  # 400 tokens take >= 4 s
        long = submit(loop, max_tokens=400, timeout_s=3600)  # without the setting: runs to its length
        assert short.final.finish_reason == long.final.finish_reason == FinishReason.TIMEOUT
        assert short.final.error is None and long.final.error is None
        assert short.done_at - t0 >= 0.5 and long.done_at - t0 >= 2.0
        assert len(short.tokens) < len(long.tokens) < 400
        assert short.tokens == long.tokens[: len(short.tokens)], "same prompt, greedy: the same stream, cut earlier"


def test_a_timeout_sends_the_text_held_back_for_a_possible_stop_string(make_engine):
    """A stop string that begins with the last two characters generated so far holds them back; ending the
    request from outside must still send them."""
    engine = make_engine()
    tok = engine.tokenizer
    [ref] = run(engine, ["Hello"], max_tokens=12, ignore_eos=True)
    ids = [t for o in ref for t in o.token_ids]
    full = tok.decode(ids, skip_special_tokens=True)
    j = next(
        j
        for j in range(4, 12)
        if len(so_far := tok.decode(ids[:j], skip_special_tokens=True)) >= 2 and "\ufffd" not in so_far[-2:]
    )
    so_far = tok.decode(ids[:j], skip_special_tokens=True)
    stop = so_far[-2:] + "\x07\x08\x07"
    assert stop not in full
    req = engine.make_request(SamplingParams(max_tokens=12, ignore_eos=True, stop=[stop]), text="Hello")
    engine.add(req)
    sent = ""
    while len(req.output_ids) < j:
        sent += "".join(o.text for o in engine.step())
    assert req.output_ids == ids[:j] and len(sent) <= len(so_far) - 2, "the last two characters were held back"
    final = engine.abort(req.request_id, FinishReason.TIMEOUT)
    assert final.finished and final.finish_reason == FinishReason.TIMEOUT
    assert sent + final.text == so_far


def test_shutdown_refuses_the_waiting_at_once_and_lets_the_running_finish(make_engine):
    with serving(make_engine, max_slots=1) as loop:
        a = submit(loop, max_tokens=30)
        assert a.first.wait(WAIT_S)
        b = submit(loop, max_tokens=2)
        loop.shutdown(grace_s=WAIT_S)
        assert b.final.error_kind == ErrorKind.UNAVAILABLE and "shutting down" in b.final.error
        assert a.final.finish_reason == FinishReason.LENGTH and len(a.tokens) == 30
        assert b.done_at < a.done_at
        assert_refused(submit(loop, max_tokens=2), "shutting down")


def test_shutdown_cuts_what_outlasts_the_grace_period(make_engine):
    with serving(make_engine, max_slots=1) as loop:
        a = running(loop)  # >= 199 more steps: >= 2 s
        t0 = time.monotonic()
        loop.shutdown(grace_s=0.3)
        assert a.final.finish_reason == FinishReason.CANCELLED and "grace period" in a.final.error
        assert a.done_at - t0 >= 0.3 and len(a.tokens) < 200


def test_a_dying_engine_fails_every_open_request_and_refuses_new_ones(make_engine):
    with serving(make_engine, max_slots=1) as loop:
        a = running(loop)
        b = submit(loop, max_tokens=2)
        assert loop.alive

        def broken_step():
            raise RuntimeError("scheduler state corrupted")

        loop.engine.step = broken_step
        for rec in (a, b):
            assert rec.final.finish_reason == FinishReason.ERROR and rec.final.error_kind == ErrorKind.INTERNAL
            assert "scheduler state corrupted" in rec.final.error
        assert not loop.alive and "scheduler state corrupted" in loop.failure
        assert loop.down() == loop.failure
        assert_refused(submit(loop, max_tokens=2), "engine stopped", "restarted")


def test_grammar_workers_that_cannot_restart_take_the_engine_down(make_engine, monkeypatch):
    """down() is the loop's one answer to whether it can serve: compile workers that cannot restart make it down as
    a stopped thread does, though the thread still runs. Every new request, guided or not, is then refused at once
    naming them; a request already running goes on to its end."""
    with serving(make_engine, max_slots=1) as loop:
        a = submit(loop, max_tokens=40)
        assert a.accepted and a.first.wait(WAIT_S) and loop.down() is None
        broken = "grammar compile workers keep failing to start (see the server log)"
        monkeypatch.setattr(type(loop.engine.grammar), "broken", property(lambda self: broken))
        assert loop.alive and broken in loop.down() and "restarted" in loop.down()
        assert_refused(submit(loop, max_tokens=2), broken, "restarted")
        assert a.final.finish_reason == FinishReason.LENGTH and len(a.tokens) == 40


@pytest.mark.parametrize(
    "setting, value",
    [
        ("max_waiting_requests", -2),
        ("max_queue_delay_ms", -1),
        ("request_timeout_s", -1),
        ("shutdown_grace_s", -1),
        ("max_waiting_prompt_tokens", -5),
    ],
)
def test_negative_limits_fail_the_load(tiny_ckpt, setting, value):
    from specgram.config import EngineConfig
    from specgram.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match=setting):
        EngineConfig(checkpoint=str(tiny_ckpt), **{setting: value})


def test_the_waiting_bound_defaults_to_four_per_slot(tiny_ckpt):
    from specgram.config import EngineConfig

    bound = lambda **kw: EngineConfig(checkpoint=str(tiny_ckpt), **kw).waiting_requests_bound  # noqa: E731
    assert bound(max_slots=3) == 12 and bound(max_slots=3, max_waiting_requests=0) is None
    assert bound(max_waiting_requests=5) == 5


def test_an_idle_loop_blocks_instead_of_polling(make_engine):
    """With nothing to do the engine thread waits on its inbox; it polls briefly only while requests wait for
    their grammars (no step to run, but one may become possible any moment)."""
    engine = make_engine()
    try:
        assert not engine.has_work() and not engine.only_waiting_for_grammars()
        slow = engine.make_request(SamplingParams(max_tokens=4, guide_type="regex", guide="[ab]{3}"), text="hi")
        engine.add(slow)
        assert slow.pending_grammar is not None and engine.only_waiting_for_grammars()  # until a step admits it
    finally:
        engine.close()


def test_the_final_output_says_how_long_the_request_waited_for_a_slot(make_engine):
    engine = make_engine(max_slots=1)
    try:
        first = engine.make_request(SamplingParams(max_tokens=6, ignore_eos=True), text="hi")
        second = engine.make_request(SamplingParams(max_tokens=2, ignore_eos=True), text="there")
        never = engine.make_request(SamplingParams(max_tokens=2), text="x")
        outs = run_to_end(engine, [first, second])
        engine.add(never)
        cut = engine.abort(never.request_id)
        q1, q2 = outs[first.request_id][-1].queue_s, outs[second.request_id][-1].queue_s
        assert 0 <= q1 < q2, "the second waited for the first's slot"
        assert cut.queue_s is None
    finally:
        engine.close()


def test_a_refused_guided_request_cancels_its_compile(make_engine):
    """A guide's compile starts when the request is read; refused at capacity, nothing waits for it: it stops and
    leaves the compile queue."""
    with serving(make_engine, max_slots=1, max_waiting_requests=1) as loop:
        a, b = running(loop), submit(loop, max_tokens=2)
        assert b.accepted
        rec = Recorder()
        schema = '{"type": "object", "properties": {"refused": {"type": "integer", "minimum": 7}}}'
        req = loop.engine.make_request(SamplingParams(guide_type="json_schema", guide=schema, max_tokens=4), text="x")
        assert req.pending_grammar is not None
        rec.accepted = loop.submit(req, rec)
        assert_refused(rec, "at capacity")
        grammar = loop.engine.grammar
        assert not any(key[1] == schema for key in grammar._inflight)  # no compile of it in flight
        loop.abort(a.request_id)
        loop.abort(b.request_id)
