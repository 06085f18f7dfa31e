"""Guide compiles in worker processes, so that one that runs too long can be stopped and its memory returned.

xgrammar cannot interrupt a compile, so a compile in a thread of the engine process runs to its end however
long it takes and whatever memory it needs. Here each compile runs in a worker process; one that outlives
`timeout_s` is stopped by killing its worker, which a fresh one replaces.

Lanes: a job that has run `trial_s` is *long*. At most workers - 1 workers run long jobs, so one is always
left for new guides, which are mostly cheap: a cheap guide waits for at most one trial (trial_s) and a worker
start, however many slow guides arrive before it. A job that passes trial_s while the long lanes are full
keeps running until a new job needs its worker; it is then stopped and queued again, to restart with a full
budget when a long lane is free. New jobs go first, stopped ones in the order they stopped; `queue_limit` bounds both
queues together (Overloaded beyond it).

What a job yields is a verdict, not the compiled grammar: shipping a CompiledGrammar back (serialize_json /
deserialize_json) was measured dearer than compiling it again in the engine process, many times the compile
itself on some schemas (docs/operating.md). The engine process compiles a guide only after a worker did so
within the budget, i.e. only what is known to finish.

Workers are forked from multiprocessing's forkserver (a clean process that has imported xgrammar once, so a
worker starts in a fraction of a second), never from the engine process, whose torch/OpenMP threads a fork
would copy in a broken state. A dispatcher thread owns the workers; submit() and cancel() may be called from
any thread.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
import time
from collections import deque
from multiprocessing.connection import wait

from ..errors import InvalidRequest, ModelLoadError, Overloaded
from .wakeup import WakePipe
from .worker import Job, Worker

log = logging.getLogger(__name__)

TRIAL_S = 1.0  # most real schemas compile within this (docs/operating.md); longer ones are "long"
_TICK_S = 0.5  # the dispatcher's longest sleep when no deadline is nearer


class CompilePool:
    def __init__(
        self,
        workers: int,
        tokenizer_info_json: str,
        options: dict,
        timeout_s: float,
        queue_limit: int,
        trial_s: float = TRIAL_S,
        start_timeout_s: float = 120.0,
    ):
        if workers < 2:
            raise ValueError("a compile pool needs at least 2 workers (one is kept for new guides)")
        self.size, self.timeout_s, self.queue_limit, self.trial_s = workers, timeout_s, queue_limit, trial_s
        self._args = (tokenizer_info_json, options)
        self._ctx = mp.get_context("forkserver")
        # xgrammar (and torch, which it imports) once in the forkserver; not specgram: Python 3.11's forkserver
        # imports its preloads before it has the server's sys.path, which may find another specgram. A worker
        # gets the server's sys.path before it imports this module.
        self._ctx.set_forkserver_preload(["xgrammar"])
        self._lock = threading.Lock()
        self._new: deque[Job] = deque()
        self._long: deque[Job] = deque()
        self._cancelled: list[Job] = []
        self._workers: list[Worker] = []
        self._closed = False
        self._broken: str | None = None  # why workers cannot be started any more
        self._failed_starts = 0  # workers in a row that exited before they were ready
        self._waker = WakePipe()  # other threads wake the dispatcher from its wait()
        for _ in range(workers):
            self._start_worker()
        self._await_ready(start_timeout_s)
        self._thread = threading.Thread(target=self._run, name="grammar-pool", daemon=True)
        self._thread.start()

    def _await_ready(self, timeout_s: float) -> None:
        """At load time: every worker started and loaded the tokenizer, or ModelLoadError (and none is left)."""
        deadline = time.monotonic() + timeout_s
        for w in self._workers:
            try:
                if w.conn.poll(max(deadline - time.monotonic(), 0.0)):
                    w.ready = w.conn.recv()[0] == "ready"
            except (EOFError, OSError):
                pass
            if not w.ready:
                for other in self._workers:
                    other.kill()
                raise ModelLoadError(
                    f"a grammar compile worker did not start within {timeout_s:g} s (exit code "
                    f"{w.process.exitcode}); see the server log for its error"
                )

    # ---- any thread --------------------------------------------------------------------------------------

    def submit(self, kind: str, guide: str, options: tuple = ()) -> Job:
        job = Job(kind, guide, options)
        with self._lock:
            if self._closed or self._broken:
                why = self._broken or "the grammar compiler is shut down"
                raise Overloaded(f"guided decoding is unavailable: {why}")
            if len(self._new) + len(self._long) >= self.queue_limit:  # = waiting(), under the same lock
                raise Overloaded(
                    f"too many guides are waiting to compile (grammar_compile_queue {self.queue_limit}); retry later"
                )
            self._new.append(job)
        self._waker.wake()
        return job

    def cancel(self, job: Job, stop_running: bool = True) -> None:
        """Nobody waits for this job any more: drop it if it waits for a worker; if it runs, stop its worker
        (stop_running), or let it finish (its grammar is then cached for whoever asks next)."""
        with self._lock:
            for queue in (self._new, self._long):
                if job in queue:
                    job.cancelled = True
                    queue.remove(job)
                    job.future.cancel()
                    return
            if not stop_running:
                return
            job.cancelled = True
            self._cancelled.append(job)
        self._waker.wake()

    def waiting(self) -> int:
        """Jobs waiting for a worker (what queue_limit bounds)."""
        with self._lock:
            return len(self._new) + len(self._long)

    @property
    def broken(self) -> str | None:  # why workers cannot be started any more (None: they can)
        return self._broken

    def worker_pids(self) -> list[int]:
        """The live workers' process ids (for tests and diagnostics)."""
        with self._lock:
            return [w.process.pid for w in self._workers if w.process.pid is not None]

    def close(self) -> None:
        """Stop the dispatcher and every worker; jobs still queued or running fail."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._waker.wake()
        self._thread.join(5)

    # ---- the dispatcher thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._closed:
                self._wait_for_events()
                now = time.monotonic()
                self._check_clock(now)
                self._dispatch(now)
        except Exception:  # noqa: BLE001 - a bug here must not leave requests waiting forever
            log.exception("grammar compile pool failed")
        finally:
            self._shut_down()

    def _start_worker(self) -> None:
        w = Worker.start(self._ctx, self._args)
        with self._lock:
            self._workers.append(w)

    def _wait_for_events(self) -> None:
        now = time.monotonic()
        deadline = min((self._deadline(w, now) for w in self._workers if w.job is not None), default=now + _TICK_S)
        timeout = min(max(deadline - now, 0.0), _TICK_S)
        sources = {self._waker.r: None}
        for w in self._workers:
            sources[w.conn] = sources[w.process.sentinel] = w
        for source in wait(list(sources), timeout):
            if source == self._waker.r:
                self._waker.drain()
            elif sources[source] in self._workers:  # not already replaced this round
                self._hear(sources[source])

    def _deadline(self, w: Worker, now: float) -> float:
        """When w's job next needs a look: the end of its trial, else the end of its budget."""
        trial_end = w.started + self.trial_s
        return trial_end if not w.job.long and now < trial_end else w.started + self.timeout_s

    def _hear(self, w: Worker) -> None:
        """A worker replied, or exited."""
        try:
            what, value = w.conn.recv()
        except (EOFError, OSError):
            self._replace(
                w, f"the grammar compiler process exited while compiling this guide (exit code {w.process.exitcode})"
            )
            return
        if what == "ready":
            w.ready, self._failed_starts = True, 0
            return
        job, w.job = w.job, None
        if job is None or job.cancelled:
            return
        if what == "ok":
            job.future.set_result(value)
        else:
            job.future.set_exception(InvalidRequest(value))

    def _check_clock(self, now: float) -> None:
        with self._lock:
            cancelled, self._cancelled = self._cancelled, []
        for w in list(self._workers):
            job = w.job
            if job is None:
                continue
            if job in cancelled:
                self._replace(w, None)
            elif now - w.started > self.timeout_s:
                self._replace(
                    w,
                    f"compiling the guide took longer than the configured grammar_compile_timeout_s "
                    f"({self.timeout_s:g} s); simplify the schema or grammar",
                )
            elif not job.long and now - w.started > self.trial_s and self._long_running() < self.size - 1:
                job.long = True

    def _dispatch(self, now: float) -> None:
        idle = [w for w in self._workers if w.ready and w.job is None]
        while idle and (job := self._pop(self._new)):
            self._start_job(idle.pop(), job, now)
        with self._lock:
            waiting = len(self._new) - sum(not w.ready for w in self._workers)  # starting workers will serve some
        for w in self._overdue_trials(now)[: max(waiting, 0)]:
            self._requeue(w)  # a new guide needs its worker
        while idle and self._long_running() < self.size - 1 and (job := self._pop(self._long)):
            self._start_job(idle.pop(), job, now)

    def _pop(self, queue: deque) -> Job | None:
        with self._lock:
            return queue.popleft() if queue else None

    def _start_job(self, w: Worker, job: Job, now: float) -> None:
        w.job, w.started = job, now
        try:
            w.conn.send((job.kind, job.guide, job.options))
        except OSError:  # the worker died just now: the job goes back to the head of its queue
            w.job = None
            with self._lock:
                (self._long if job.long else self._new).appendleft(job)
            self._replace(w, None)

    def _long_running(self) -> int:
        return sum(w.job is not None and w.job.long for w in self._workers)

    def _overdue_trials(self, now: float) -> list[Worker]:
        """Workers whose job passed trial_s without a long lane for it, most recently started first."""
        over = [w for w in self._workers if w.job is not None and not w.job.long and now - w.started > self.trial_s]
        return sorted(over, key=lambda w: -w.started)

    def _requeue(self, w: Worker) -> None:
        job = w.job
        self._replace(w, None)
        job.long = True
        with self._lock:
            self._long.append(job)

    def _replace(self, w: Worker, error: str | None) -> None:
        """Kill w (its memory goes back to the system) and start a fresh worker in its place; then its job
        fails with `error` unless that is None."""
        w.kill()
        with self._lock:
            self._workers.remove(w)
        if not w.ready:
            self._failed_starts += 1
            log.error("a grammar compile worker exited before it was ready (exit code %s)", w.process.exitcode)
        if self._failed_starts < 3:
            self._start_worker()
        else:  # a broken environment: restarting would only spin
            with self._lock:
                self._broken = "grammar compile workers keep failing to start (see the server log)"
                self._closed = True
        if error is not None and w.job is not None and not w.job.cancelled:
            w.job.future.set_exception(InvalidRequest(error))

    def _shut_down(self) -> None:
        for w in self._workers:
            w.kill()
            if w.job is not None and not w.job.future.done():
                w.job.future.set_exception(InvalidRequest("the server is shutting down"))
        with self._lock:
            self._closed = True
            self._workers.clear()
            queued = list(self._new) + list(self._long)
            self._new.clear()
            self._long.clear()
        for job in queued:
            if not job.future.done():
                job.future.set_exception(
                    InvalidRequest(f"guided decoding is unavailable: {self._broken or 'the server is shutting down'}")
                )
