"""Guide compiles in worker processes (grammar_pool.py): a cheap guide is not held up by slow ones, a compile
past its budget is stopped by killing its worker, the queue is bounded, cancelled compiles stop, and keywords
xgrammar would not enforce are refused or, on request, ignored.

The slow guide is a JSON schema with thousands of optional properties: xgrammar's compile time grows with the
square of their number (9000 take ~20 s even with the tests' 259-token vocabulary on a loaded 2-core machine, in
224 KB, within max_guide_bytes). The tests assert the order of events (a cheap guide is done while slow ones are
not), never how long something took."""

import json
import os
import time

import pytest

from specgram.errors import InvalidRequest, Overloaded
from specgram.grammar.compile import GuideType
from specgram.grammar.compiler import GrammarCompiler
from specgram.request import SamplingParams

from .helpers import run_to_end
from .tiny import build_tokenizer

CHEAP = (GuideType.REGEX, "[ab]{3}")


def slow_schema(salt: str = "", n: int = 9000) -> str:
    return json.dumps(
        {"type": "object", "properties": {f"{salt}{i}": {"type": "string"} for i in range(n)}}, separators=(",", ":")
    )


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def compiler(tokenizer, request):
    """A compiler with 2 workers, a short trial, and the settings a test gives as its indirect parameter."""
    settings = {**dict(timeout_s=60, trial_s=0.5, workers=2, queue_limit=8), **getattr(request, "param", {})}
    c = GrammarCompiler(tokenizer, len(tokenizer), [2], cache_bytes=1 << 24, **settings)
    yield c
    c.close()


def wait(pending, timeout_s: float = 120.0):
    """Poll like the scheduler does; -> the compiled grammar (or raises InvalidRequest)."""
    deadline = time.monotonic() + timeout_s
    while (compiled := pending.result()) is None:
        assert time.monotonic() < deadline, "the compile never finished"
        time.sleep(0.005)
    return compiled


def gone(pid: int, timeout_s: float = 5.0) -> bool:
    """The process exits within timeout_s (a killed one at once; a slow compile would take far longer)."""
    deadline = time.monotonic() + timeout_s
    while os.path.exists(f"/proc/{pid}"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def started(compiler, schema: str):
    """Submit and wait until a worker has taken it (the queue is empty again)."""
    pending = compiler.submit(GuideType.JSON_SCHEMA, schema)
    deadline = time.monotonic() + 10
    while compiler.pool.waiting() and time.monotonic() < deadline:
        time.sleep(0.005)
    return pending


def test_a_cheap_guide_does_not_wait_for_two_slow_ones(compiler):
    """Both workers are busy with slow schemas when the cheap guide arrives: after its trial one slow compile
    keeps a long lane, the other is stopped and queued, and the cheap guide gets a fresh worker: it is compiled
    while neither slow one has finished (a pool that made it wait would finish a slow one first)."""
    slow = [started(compiler, slow_schema(salt)) for salt in "ab"]
    wait(compiler.submit(*CHEAP))
    assert not any(p.future.done() for p in slow)
    assert compiler.pool.waiting() == 1, "one slow compile was stopped and queued again for a long lane"


@pytest.mark.parametrize("compiler", [dict(timeout_s=1.0)], indirect=True)
def test_a_compile_past_its_budget_fails_and_its_worker_is_killed(compiler):
    before = set(compiler.pool.worker_pids())
    t0 = time.monotonic()
    with pytest.raises(InvalidRequest, match="grammar_compile_timeout_s"):
        wait(compiler.submit(GuideType.JSON_SCHEMA, slow_schema()))
    assert time.monotonic() - t0 >= 1.0  # not stopped before its budget was spent
    [killed] = before - set(compiler.pool.worker_pids())
    assert gone(killed), "the timed-out compile's worker still runs"
    assert len(compiler.pool.worker_pids()) == 2  # replaced
    assert wait(compiler.submit(*CHEAP)) is not None


@pytest.mark.parametrize("compiler", [dict(queue_limit=1, trial_s=60)], indirect=True)
def test_the_queue_is_bounded_and_identical_guides_share_one_compile(compiler):
    running = [started(compiler, slow_schema(salt)) for salt in "ab"]  # both workers
    queued = compiler.submit(GuideType.JSON_SCHEMA, slow_schema("c"))  # the queue's one
    assert compiler.pool.waiting() == 1
    again = compiler.submit(GuideType.JSON_SCHEMA, slow_schema("c"))  # joins that compile, takes no place
    assert again.future is queued.future
    with pytest.raises(Overloaded, match="grammar_compile_queue 1"):
        compiler.submit(*CHEAP)
    assert not any(p.future.done() for p in running + [queued])


@pytest.mark.parametrize("compiler", [dict(trial_s=60)], indirect=True)
def test_cancelling_the_last_waiter_stops_the_compile(compiler, monkeypatch):
    cancelled = []
    pool_cancel = compiler.pool.cancel
    monkeypatch.setattr(compiler.pool, "cancel", lambda job, stop=True: (cancelled.append(job), pool_cancel(job, stop)))
    before = set(compiler.pool.worker_pids())
    first = started(compiler, slow_schema())
    second = compiler.submit(GuideType.JSON_SCHEMA, slow_schema())
    first.cancel()
    assert cancelled == [], "the compile was stopped although a request still waits for it"
    second.cancel()
    assert len(cancelled) == 1
    deadline = time.monotonic() + 10
    while set(compiler.pool.worker_pids()) >= before and time.monotonic() < deadline:
        time.sleep(0.01)
    [killed] = before - set(compiler.pool.worker_pids())
    assert gone(killed)


@pytest.mark.parametrize("compiler", [dict(trial_s=60)], indirect=True)
def test_a_withdrawn_compile_that_runs_finishes_and_is_cached(compiler):
    """What a request refused at capacity leaves behind (cancel(stop_running=False)): its running compile is not
    stopped (the worker stays), and the retry finds the grammar compiled."""
    before = set(compiler.pool.worker_pids())
    schema = slow_schema()
    started(compiler, schema).cancel(stop_running=False)
    deadline = time.monotonic() + 60
    while compiler.cache.get((GuideType.JSON_SCHEMA, schema, ())) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert compiler.cache.get((GuideType.JSON_SCHEMA, schema, ())) is not None
    assert set(compiler.pool.worker_pids()) == before
    assert compiler.submit(GuideType.JSON_SCHEMA, schema).future.done()


def test_close_stops_the_workers(tokenizer):
    c = GrammarCompiler(tokenizer, len(tokenizer), [2], cache_bytes=1 << 24)
    pids = c.pool.worker_pids()
    pending = c.submit(GuideType.JSON_SCHEMA, slow_schema())
    c.close()
    assert all(gone(p) for p in pids)
    with pytest.raises(InvalidRequest, match="shutting down"):
        wait(pending)
    with pytest.raises(Overloaded, match="unavailable"):
        c.submit(*CHEAP)


def test_results_are_cached_and_usable(compiler):
    from specgram.grammar.guide import Guide

    compiled = wait(compiler.submit(*CHEAP))
    assert compiler.cache_bytes() > 0
    assert compiler.submit(*CHEAP).result() is compiled  # a hit is ready at once
    a = build_tokenizer()("a", add_special_tokens=False)["input_ids"][0]
    guide = Guide(compiled)
    assert guide.try_tentative(a) and not guide.try_tentative(a + 2)  # "a" allowed, "c" not


# ---- through the engine ------------------------------------------------------------------------------------


def test_a_slow_guide_fails_alone_and_its_neighbour_runs(make_engine):
    eng = make_engine(grammar_compile_timeout_s=1)
    try:
        slow = eng.make_request(SamplingParams(max_tokens=5, guide_type="json_schema", guide=slow_schema()), text="hi")
        fast = eng.make_request(SamplingParams(max_tokens=5, ignore_eos=True), text="hi")
        outs = run_to_end(eng, [slow, fast])
    finally:
        eng.close()
    [err] = outs[slow.request_id]
    assert err.error_kind == "invalid" and "grammar_compile_timeout_s" in err.error
    assert outs[fast.request_id][-1].finish_reason == "length"


def test_aborting_a_request_stops_its_compile(make_engine):
    eng = make_engine()
    try:
        before = set(eng.grammar.pool.worker_pids())
        req = eng.make_request(SamplingParams(max_tokens=5, guide_type="json_schema", guide=slow_schema()), text="hi")
        eng.add(req)
        eng.step()
        while eng.grammar.pool.waiting():  # until a worker has taken it
            time.sleep(0.005)
        assert eng.abort(req.request_id).finish_reason == "cancelled"
        deadline = time.monotonic() + 10
        while set(eng.grammar.pool.worker_pids()) >= before and time.monotonic() < deadline:
            time.sleep(0.01)
        [killed] = before - set(eng.grammar.pool.worker_pids())
        assert gone(killed)
    finally:
        eng.close()


UNIQUE = json.dumps({"type": "object", "properties": {"tags": {"type": "array", "items": {}, "uniqueItems": True}}})


def test_an_unenforced_keyword_is_refused_by_default_naming_it(make_engine):
    eng = make_engine()
    try:
        with pytest.raises(InvalidRequest, match=r"'uniqueItems' at #/properties/tags"):
            eng.make_request(SamplingParams(guide_type="json_schema", guide=UNIQUE), text="hi")
    finally:
        eng.close()


@pytest.mark.parametrize("compiler", [dict(unsupported_keywords="ignore")], indirect=True)
def test_ignore_mode_compiles_such_a_schema(compiler):
    kind = compiler.check("json_schema", UNIQUE)
    assert wait(compiler.submit(kind, UNIQUE)) is not None


def test_a_schema_nested_too_deeply_is_refused_not_crashed(compiler):
    deep = '{"items": ' * 5000 + "{}" + "}" * 5000
    with pytest.raises(InvalidRequest, match="nested too deeply"):
        compiler.check("json_schema", deep)


# ---- the engine process's own compile ----------------------------------------------------------------------


def test_a_guide_that_passed_its_trial_compiles_on_the_long_lane(compiler, monkeypatch):
    """A worker compile that took longer than a trial, even one that never got a long lane (they were full),
    is compiled again in the engine process beside the slow guides, never in the cheap guides' lane."""
    from specgram.grammar.compiler import _Compile
    from specgram.grammar.worker import Job

    lanes = []
    monkeypatch.setattr(compiler._short, "submit", lambda *a: lanes.append("short"))
    monkeypatch.setattr(compiler._long, "submit", lambda *a: lanes.append("long"))
    for seconds in (0.01, 2.0):  # trial_s is 0.5
        job = Job(*CHEAP)
        job.future.set_result(seconds)
        compiler._verdict(_Compile(CHEAP, job))
    assert lanes == ["short", "long"]


@pytest.mark.parametrize("compiler", [dict(timeout_s=1.0)], indirect=True)
def test_the_engine_process_compile_is_bounded(compiler, monkeypatch):
    """Its requests wait for the engine-process compile at most grammar_compile_timeout_s, however stuck it is."""
    import threading

    release = threading.Event()
    monkeypatch.setattr(compiler, "compile", lambda kind, guide: release.wait(60))
    try:
        with pytest.raises(InvalidRequest, match="grammar_compile_timeout_s"):
            wait(compiler.submit(*CHEAP), timeout_s=20)
    finally:
        release.set()
