"""One compile worker process and the job it runs (pool.py dispatches jobs to workers).

A worker loads the tokenizer once, then compiles each (kind, guide) it is sent and replies with a verdict:
("ok", seconds) or ("error", message). It never sends the compiled grammar back (pool.py says why).

multiprocessing starts the forkserver and each worker by re-running the parent's main module (as __mp_main__)
when that is a script: a program that uses the engine without an `if __name__ == "__main__":` guard would run
again in every worker and start workers of its own. A worker needs nothing from it, so the main module is
hidden from multiprocessing while a worker starts.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import sys
import threading
import time
import types
from concurrent.futures import Future
from dataclasses import dataclass, field

from ..errors import InvalidRequest


@dataclass(eq=False)
class Job:
    """One guide to compile. future: -> seconds the compile took in its worker, or InvalidRequest."""

    kind: str
    guide: str
    options: tuple = ()  # (name, value) pairs over the compiler's options (one request's JSON layout)
    future: Future = field(default_factory=Future)
    long: bool = False  # holds (or waits for) a long lane
    cancelled: bool = False


@dataclass(eq=False)
class Worker:
    process: mp.process.BaseProcess
    conn: mp.connection.Connection
    ready: bool = False  # initialised (tokenizer loaded)
    job: Job | None = None
    started: float = 0.0  # when its job started

    @classmethod
    def start(cls, ctx, args: tuple) -> "Worker":
        """A new worker process from ctx (the forkserver context); args: (tokenizer_info_json, options)."""
        parent, child = ctx.Pipe()
        process = ctx.Process(target=_worker_main, args=(child, *args), name="grammar-worker", daemon=True)
        with _main_hidden():
            process.start()
        child.close()
        return cls(process, parent)

    def kill(self) -> None:
        """Stop the process (its memory goes back to the system) and close its pipe."""
        self.process.kill()
        self.process.join(5)
        self.conn.close()


def _worker_main(conn, tokenizer_info_json: str, options: dict) -> None:
    """A worker: compile each (kind, guide, option overrides) it is sent; reply ("ok", seconds) or ("error",
    message)."""
    import xgrammar as xgr

    from .compile import compile_guide

    info = xgr.TokenizerInfo.deserialize_json(tokenizer_info_json)
    compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            kind, guide, overrides = conn.recv()
        except (EOFError, OSError):  # the engine process closed the pool or is gone
            return
        t0 = time.monotonic()
        try:
            compile_guide(compiler, kind, guide, **{**options, **dict(overrides)})
            conn.send(("ok", time.monotonic() - t0))
        except InvalidRequest as e:
            conn.send(("error", str(e)))


_MAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def _main_hidden():
    """sys.modules["__main__"] is a bare module meanwhile: multiprocessing finds no main script to re-run."""
    with _MAIN_LOCK:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if main is not None:
                sys.modules["__main__"] = main
