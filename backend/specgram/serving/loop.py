"""EngineLoop: the one thread that owns an Engine. Other threads talk to it through a queue.

submit() and abort() may be called from any thread. Each request's outputs go to its sink, called on the
engine thread (a refusal's, on the submitting thread): a sink must only hand the output over (e.g. put it on a
queue), never block or send.

Serving limits (admission.py): a request over the waiting bound is refused at once and never reaches the engine;
once per step, a waiting request past its queue limit is refused and a running one past its run limit ends
(finish_reason timeout). shutdown() stops taking requests, refuses the waiting ones at once, lets the running
ones go on for the grace period and then cuts them (cancelled). An exception escaping the engine is a bug that
leaves its state untrusted: the thread stops, every open request fails (INTERNAL), new ones are refused, and
`failure` says why.

down() is the one test of whether this engine can serve: it is down once its thread stopped, or once its grammar
compile workers cannot be restarted (every guided request would be refused). While it is down every new request
is refused at once (UNAVAILABLE, naming what failed); the serving adapter withdraws the model and sets its
`engine_up` gauge from the same answer, so the readiness, the gauge and the refusals never disagree.

EngineLoop.build() loads the engine on the engine thread itself. That matters on CPU: OpenMP (libgomp) keeps a
thread pool per thread that starts parallel work, and once the pools' threads outnumber the cores it stops
spinning between parallel regions, so every parallel region pays a futex wake-up (docs/architecture.md,
Threads).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..engine.engine import Engine
from ..request import Request, RequestOutput
from ..wire import ErrorKind, FinishReason
from .admission import Admission, Deadlines, Limit

log = logging.getLogger(__name__)
Sink = Callable[[RequestOutput], None]
_SHUTTING_DOWN = "the server is shutting down; the request was not started"
STEP_WAIT_S = 10  # on shutdown, how long past the grace period the engine thread may take to end (one step)


@dataclass(frozen=True)
class Load:
    """What the engine holds, published by the engine thread after each step (read by the metrics)."""

    waiting: int = 0  # requests without a KV slot yet
    running: int = 0  # requests holding a KV slot
    compiling: int = 0  # waiting requests whose grammar is still compiling
    # LoRA adapters (ids, the base model left out) of the requests holding a slot, and of the waiting ones
    running_adapters: frozenset[int] = frozenset()
    waiting_adapters: frozenset[int] = frozenset()


def _ended(request_id: int, error: str, kind: ErrorKind) -> RequestOutput:
    """A final error output made outside the engine (a refusal, or the engine is gone)."""
    return RequestOutput(
        request_id, [], "", finished=True, finish_reason=FinishReason.ERROR, error=error, error_kind=kind
    )


class EngineLoop:
    def __init__(self):
        self.engine: Engine | None = None
        self._inbox: queue.Queue = queue.Queue()
        self._sinks: dict[int, Sink] = {}
        self._lock = threading.Lock()  # a request is counted and queued, or refused, atomically with closing
        self._admission: Admission | None = None
        self._deadlines = Deadlines()
        self._cut_at: float | None = None  # shutting down: what still runs at this time is cut
        self._grace_s = 0.0
        self.failure: str | None = None  # set when the engine thread stopped on an error
        self.load = Load()
        self._thread: threading.Thread | None = None

    @classmethod
    def build(cls, factory: Callable[[], Engine]) -> "EngineLoop":
        """Start the engine thread, build the engine there (factory(), e.g. Engine.from_config) and return once
        it is ready; an exception from the factory is raised here, in the caller."""
        loop = cls()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                loop.engine = factory()
                config = loop.engine.config
                loop._admission = Admission(config.waiting_requests_bound, config.max_waiting_prompt_tokens or None)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                failure.append(e)
                return
            finally:
                ready.set()
            loop._run()

        loop._thread = threading.Thread(target=run, name="engine-loop", daemon=True)
        loop._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return loop

    @property
    def alive(self) -> bool:  # whether the engine thread still runs (it may be down all the same: down())
        return self.failure is None

    def down(self) -> str | None:
        """Why this engine can no longer serve (None: it can): its thread stopped on an internal error, or its
        grammar compile workers cannot be restarted. Either lasts until the model instance is replaced."""
        if self.failure is not None:
            return self.failure
        broken = self.engine.grammar.broken if self.engine is not None else None
        return f"{broken}; this model instance must be restarted" if broken else None

    def submit(self, req: Request, sink: Sink, timeout_s: float | None = None) -> bool:
        """Queue req for the engine, or refuse it at once: sink then gets its only output, an UNAVAILABLE error
        naming the reason (at capacity, shutting down, the engine down). timeout_s: the client's own limit on
        the request's time (None = none). -> whether it was queued."""
        with self._lock:
            refusal = self.down() or self._admission.refusal(req)
            if refusal is None:
                self._admission.enter(req)
                self._inbox.put(("add", req, (sink, time.monotonic(), timeout_s)))
        if refusal is not None:
            if req.pending_grammar is not None:  # nothing waits for it: a queued compile leaves the queue (a
                req.pending_grammar.cancel(stop_running=False)  # running one finishes, for the retry)
            sink(_ended(req.request_id, refusal, ErrorKind.UNAVAILABLE))
        return refusal is None

    def abort(self, request_id: int) -> None:
        self._inbox.put(("abort", request_id, None))

    def shutdown(self, grace_s: float | None = None) -> None:
        """Stop taking requests, refuse the waiting ones, let the running ones go on for up to grace_s (default:
        the shutdown_grace_s setting) and cut the rest; returns once the engine thread has ended."""
        grace = self.engine.config.shutdown_grace_s if grace_s is None else grace_s
        with self._lock:
            if self._admission.closed is None:
                self._admission.closed = _SHUTTING_DOWN
            self._inbox.put(("stop", grace, None))
        # + one step: with the grammar workers' 5 s and the sender's 5 s the whole unload stays within
        # shutdown_grace_s + 20 s, inside tritonserver's default exit timeout (30 s) at the default grace
        self._thread.join(grace + STEP_WAIT_S)
        if self.engine is not None:
            self.engine.close()  # the grammar compile workers

    # ---- engine thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # noqa: BLE001 - a bug outside the guarded forwards: the engine is not trusted
            log.exception("the engine thread stopped")
            self._fail_all(f"the engine stopped after an internal error ({e!r}); this model instance must be restarted")

    def _serve(self) -> None:
        while True:
            if self.engine.only_waiting_for_grammars():
                self._drain(block=True, timeout=0.005)  # let compiles finish without spinning
            else:
                self._drain(block=not self.engine.has_work())
            if self._cut_at is not None and (not self.engine.has_work() or time.monotonic() >= self._cut_at):
                break
            self._expire(time.monotonic())
            outputs = self.engine.step()
            self._settle()  # before the outputs: whoever sees one sees its request admitted
            for out in outputs:
                self._deliver(out)
        message = (
            f"the server is shutting down: the request was stopped after the {self._grace_s:g} s grace period "
            "(shutdown_grace_s)"
        )
        for rid in list(self._sinks):
            self._deliver(self.engine.abort(rid, FinishReason.CANCELLED, message))

    def _drain(self, block: bool, timeout: float = 0.5) -> None:
        try:
            item = self._inbox.get(timeout=timeout) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload, extra = item
            if kind == "add":
                self._add(payload, *extra)
            elif kind == "abort":
                self._deliver(self.engine.abort(payload))
            elif kind == "stop":
                self._stop(payload)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _add(self, req: Request, sink: Sink, submitted: float, timeout_s: float | None) -> None:
        config = self.engine.config
        queue_limit = run_limit = None
        if config.max_queue_delay_ms:
            queue_limit = Limit(
                submitted + config.max_queue_delay_ms / 1000, f"max_queue_delay_ms = {config.max_queue_delay_ms}"
            )
        if config.request_timeout_s and (timeout_s is None or config.request_timeout_s <= timeout_s):
            run_limit = Limit(submitted + config.request_timeout_s, f"request_timeout_s = {config.request_timeout_s}")
        elif timeout_s is not None:
            run_limit = Limit(submitted + timeout_s, f"the request's timeout of {timeout_s:g} s")
        self._sinks[req.request_id] = sink
        self._deadlines.add(req.request_id, queue_limit, run_limit)
        self.engine.add(req)

    def _stop(self, grace_s: float) -> None:
        """Shutting down: the waiting requests are refused now; the running ones may go on for grace_s."""
        if self._cut_at is None:
            self._grace_s, self._cut_at = grace_s, time.monotonic() + grace_s
        for rid in self.engine.waiting_ids():
            self._deliver(self.engine.abort(rid, FinishReason.ERROR, _SHUTTING_DOWN, ErrorKind.UNAVAILABLE))

    def _expire(self, now: float) -> None:
        for rid, limit in self._deadlines.passed(now, lambda rid: not self.engine.is_running(rid)):
            if self.engine.is_running(rid):
                self._deliver(self.engine.abort(rid, FinishReason.TIMEOUT))
            else:
                self._deliver(
                    self.engine.abort(
                        rid,
                        FinishReason.ERROR,
                        f"no KV slot became free within {limit.what}: the server is at capacity; retry later",
                        ErrorKind.UNAVAILABLE,
                    )
                )

    def _settle(self) -> None:
        """After a step: the requests that got a slot stop counting as waiting; the load is published."""
        with self._lock:
            self._admission.settle()
            waiting, waiting_adapters = self._admission.waiting, self._admission.adapters()
        self.load = Load(waiting, *self.engine.load(), waiting_adapters)

    def _deliver(self, out: RequestOutput | None) -> None:
        if out is None:
            return
        if out.finished:
            sink = self._sinks.pop(out.request_id, None)
            self._deadlines.discard(out.request_id)
            with self._lock:  # before the sink: whoever sees the end sees the room it left
                self._admission.leave(out.request_id)
        else:
            sink = self._sinks.get(out.request_id)
        if sink is not None:
            self._call(sink, out)

    @staticmethod
    def _call(sink: Sink, out: RequestOutput) -> None:
        try:
            sink(out)
        except Exception:  # noqa: BLE001 - a broken sink must not stop the other requests
            log.exception("output sink failed for request %s", out.request_id)

    def _fail_all(self, message: str) -> None:
        """The engine is gone: new requests are refused, and every open one (in the engine or still in the
        inbox) gets a final INTERNAL error now."""
        with self._lock:
            self.failure = self._admission.closed = message
        open_sinks = dict(self._sinks)
        self._sinks.clear()
        while True:  # nothing enters the inbox any more: it was closed under the lock
            try:
                kind, payload, extra = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                open_sinks[payload.request_id] = extra[0]
        for rid, sink in open_sinks.items():
            self._call(sink, _ended(rid, message, ErrorKind.INTERNAL))
        self.load = Load()
