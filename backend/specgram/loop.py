"""EngineLoop: the one thread that owns an Engine. Other threads talk to it through a queue.

submit() and abort() may be called from any thread. Each request's outputs go to its sink, called on the
engine thread: a sink must only hand the output over (e.g. put it on a queue), never block or send.

EngineLoop.build() loads the engine on the engine thread itself. That matters on CPU: OpenMP (libgomp) keeps a
thread pool per thread that starts parallel work, and once the pools' threads outnumber the cores it stops
spinning between parallel regions, so each of a forward's ~300 regions pays a futex wake-up. A model loaded
on one thread and stepped on another measured ~30% fewer tokens/s on 2 cores than one thread doing both.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

from .engine import Engine
from .request import Request, RequestOutput

log = logging.getLogger(__name__)
Sink = Callable[[RequestOutput], None]


class EngineLoop:
    def __init__(self, engine: Engine | None):
        self.engine = engine
        self._inbox: queue.Queue = queue.Queue()
        self._sinks: dict[int, Sink] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> "EngineLoop":
        self._thread.start()
        return self

    @classmethod
    def build(cls, factory: Callable[[], Engine]) -> "EngineLoop":
        """Start the engine thread, build the engine there (factory(), e.g. Engine.from_config) and return once
        it is ready; an exception from the factory is raised here, in the caller."""
        loop = cls(None)
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                loop.engine = factory()
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

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(("wake", None, None))
        self._thread.join(timeout)
        if self.engine is not None:
            self.engine.close()

    def submit(self, req: Request, sink: Sink) -> int:
        self._inbox.put(("add", req, sink))
        return req.request_id

    def abort(self, request_id: int) -> None:
        self._inbox.put(("abort", request_id, None))

    # ---- engine thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.engine.only_waiting_for_grammars():
                self._drain(block=True, timeout=0.005)     # let compiles finish without spinning
            else:
                self._drain(block=not self.engine.has_work())
            if self._stop.is_set():
                break
            try:
                outputs = self.engine.step()
            except Exception:  # noqa: BLE001 - the engine already fails requests per forward; this is a bug
                log.exception("engine step failed")
                outputs = [self.engine.abort(rid, "error", "internal engine error") for rid in list(self._sinks)]
            for out in outputs:
                if out is not None:
                    self._deliver(out)
        for rid in list(self._sinks):   # shutting down: every request still ends with a final output
            out = self.engine.abort(rid, "cancelled", "the server is shutting down")
            if out is not None:
                self._deliver(out)

    def _drain(self, block: bool, timeout: float = 0.5) -> None:
        try:
            item = self._inbox.get(timeout=timeout) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload, sink = item
            if kind == "add":
                self._sinks[payload.request_id] = sink
                self.engine.add(payload)
            elif kind == "abort":
                out = self.engine.abort(payload)
                if out is not None:
                    self._deliver(out)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _deliver(self, out: RequestOutput) -> None:
        sink = self._sinks.pop(out.request_id, None) if out.finished else self._sinks.get(out.request_id)
        if sink is None:
            return
        try:
            sink(out)
        except Exception:  # noqa: BLE001 - a broken sink must not stop the other requests
            log.exception("output sink failed for request %s", out.request_id)
