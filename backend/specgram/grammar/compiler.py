"""Guided decoding with xgrammar: compile guides (off the step loop, cached), and one matcher per request.

GrammarCompiler: one per tokenizer. A request's guide is checked when it arrives (kind, size, JSON, keywords
xgrammar would not enforce: schema_keywords.py), then compiled without blocking the step loop:
  - at once in the engine process when that is cheap and bounded: any JSON in the server's layout (compiled at
    load) and the compiled-grammar cache (an LRU keyed by (kind, guide), bounded in bytes);
  - otherwise first in a worker process (pool.py), where a compile that outlives
    `grammar_compile_timeout_s` is killed, and, once a worker has compiled it in time, again in the engine
    process (a thread; xgrammar releases the GIL), which is then known to finish. That compile runs on the
    short lane only if the worker's took at most a trial (a slow guide never holds up cheap ones), and its
    requests wait for it at most `grammar_compile_timeout_s` more. Identical guides in flight share one compile.

The worker processes start when the first guide needs them (or at start(), which a server calls at load time so
that its first guided request does not wait for them).

A request then gets a Guide (guide.py) over the compiled grammar.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor

from ..errors import InvalidRequest, Overloaded
from . import compile as guides
from .compile import JSON_OPTIONS, REASONING_OPTIONS, UNSUPPORTED_KEYWORDS, GuideType, compile_guide
from .json_grammar import any_json_grammar
from .pool import TRIAL_S, CompilePool, Job
from .schema_keywords import describe, unenforced_keyword


class GrammarCompiler:
    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        stop_token_ids: list[int],
        cache_bytes: int,
        timeout_s: float = 30.0,
        max_guide_bytes: int = 256 * 1024,
        json_strict: bool = True,
        json_any_whitespace: bool = True,
        workers: int = 2,
        queue_limit: int = 64,
        unsupported_keywords: str = "error",
        trial_s: float = TRIAL_S,
    ):
        import xgrammar as xgr

        if unsupported_keywords not in UNSUPPORTED_KEYWORDS:
            raise ValueError(f"unsupported_keywords must be one of {UNSUPPORTED_KEYWORDS}")
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=2, cache_enabled=False)
        self.max_guide_bytes = max_guide_bytes
        # strict: objects without "additionalProperties" get no extra keys (xgrammar's and vLLM's default; small
        # models ramble on adding keys). any_whitespace (a schema, any JSON): runs of at most MAX_WHITESPACE
        # (json_grammar.py); False: the compact layout (more grammar-forced positions, a layout the model may not like).
        self.options = dict(json_strict=json_strict, json_any_whitespace=json_any_whitespace)
        self.unsupported_keywords = unsupported_keywords
        self.any_json = self.compiler.compile_grammar(any_json_grammar(json_any_whitespace))
        self.cache = GrammarCache(cache_bytes)
        self._lock = threading.Lock()
        self._inflight: dict[tuple, _Compile] = {}
        self.timeout_s, self.trial_s = timeout_s, trial_s
        self._pool_args = (workers, self.info.serialize_json(), self.options, timeout_s, queue_limit, trial_s)
        self._pools: list[CompilePool] = []  # the pool, once started (a list: the finalizer holds it)
        self._pool_lock = threading.Lock()
        # the engine's compiles of guides that took a worker over a trial: own threads, never blocking short ones
        self._short = ThreadPoolExecutor(2, thread_name_prefix="grammar-compile")
        self._long = ThreadPoolExecutor(workers - 1, thread_name_prefix="grammar-compile-long")
        self._finalizer = weakref.finalize(self, _close, self._pools, self._short, self._long)

    @property
    def pool(self) -> CompilePool:
        """The worker pool, started on first use; raises ModelLoadError when its workers cannot start."""
        with self._pool_lock:
            if not self._pools:
                if not self._finalizer.alive:
                    raise Overloaded("guided decoding is unavailable: the grammar compiler is shut down")
                self._pools.append(CompilePool(*self._pool_args))
            return self._pools[0]

    @property
    def broken(self) -> str | None:  # why guides can no longer be compiled (workers cannot restart), or None
        return self._pools[0].broken if self._pools else None

    def start(self) -> None:
        """Start the compile workers now rather than for the first guide."""
        self.pool  # noqa: B018 - the property starts it

    def check(self, guide_type: str, guide: str, options: tuple = ()) -> GuideType:
        """Cheap checks done when the request arrives; -> the normalized guide type. options: the request's
        (name, value) overrides of the compile options (json_strict, json_any_whitespace)."""
        kind = guides.normalize_guide_type(guide_type)
        if len(guide.encode("utf-8")) > self.max_guide_bytes:
            raise InvalidRequest(f"guided_decoding_guide is larger than {self.max_guide_bytes} bytes")
        if kind in (GuideType.JSON_SCHEMA, GuideType.STRUCTURAL_TAG):
            try:
                parsed = json.loads(guide)
                if kind == GuideType.JSON_SCHEMA and self.unsupported_keywords == "error":
                    self._check_keywords(parsed, dict(options).get("json_strict", self.options["json_strict"]))
            except (TypeError, AttributeError, KeyError):
                pass  # a keyword of the wrong type: the compile refuses the schema, with xgrammar's reason
            except ValueError as e:  # json.JSONDecodeError, and an integer too long to convert
                raise InvalidRequest(f"guided_decoding_guide for {kind} is not valid JSON: {e}") from None
            except RecursionError:
                raise InvalidRequest(f"guided_decoding_guide for {kind} is nested too deeply") from None
        elif kind == GuideType.CHOICE:
            guides.choices_of(guide)
        elif kind == GuideType.JSON and guide.strip():
            raise InvalidRequest(
                f"guided_decoding_guide must be empty for guide type {guide_type!r} (any JSON "
                "value); send a schema with guided_decoding_guide_type json_schema"
            )
        elif kind != GuideType.JSON and not guide:
            raise InvalidRequest(f"guided_decoding_guide is empty (required for {kind})")
        return kind

    def _check_keywords(self, schema, strict: bool) -> None:
        found = unenforced_keyword(schema, strict)
        if found:
            raise InvalidRequest(
                f"guided_decoding_guide: {describe(found)}; remove it, or ask the operator for "
                "json_unsupported_keywords=ignore (best effort: the keyword is then not enforced)"
            )

    def compile(self, kind: GuideType, guide: str, options: tuple = ()):
        """Blocking compile in this process; raises InvalidRequest. For guides already known to compile in time
        (and for tools and tests): an arbitrary guide may take any time and memory here. options: (name, value)
        overrides of the compiler's options."""
        return compile_guide(self.compiler, kind, guide, **{**self.options, **dict(options)})

    def submit(self, kind: GuideType, guide: str, options: tuple = ()) -> "PendingGrammar":
        """Start compiling (or find) the guide; raises Overloaded when too many guides wait for a worker.
        options: the request's (name, value) overrides of the compile options, sorted (part of the cache key)."""
        # each JSON kind's own options (JSON_OPTIONS); a thinking model's reasoning prefix to every kind
        options = tuple(sorted(o for o in options if o[0] in JSON_OPTIONS.get(kind, ()) + REASONING_OPTIONS))
        if kind == GuideType.JSON and all(n in self.options and self.options[n] == v for n, v in options):
            return PendingGrammar(_done(self.any_json))  # in the server's own layout: compiled at load
        key = (kind, guide, options)
        pool = self.pool  # started here on first use, outside self._lock
        with self._lock:
            compiled = self.cache.get(key)
            if compiled is not None:
                return PendingGrammar(_done(compiled))
            c = self._inflight.get(key)
            started = c is None
            if started:
                c = self._inflight[key] = _Compile(key, pool.submit(kind, guide, options))
            c.waiters += 1
        if started:  # outside the lock: a callback on a future already done runs here, and takes the lock
            c.job.future.add_done_callback(lambda _: self._verdict(c))
        return PendingGrammar(c.future, lambda stop_running: self._release(c, stop_running))

    def _verdict(self, c: "_Compile") -> None:
        """A worker is done with c's guide (dispatcher thread): compile it here, or fail its requests."""
        job = c.job
        if job.future.cancelled():
            return
        error = job.future.exception()
        if error is not None:
            self._forget(c)
            c.future.set_exception(error)
            return
        slow = job.long or job.future.result() > self.trial_s  # the worker's own compile seconds
        deadline = threading.Timer(self.timeout_s, self._expire, (c,))
        deadline.daemon = True
        deadline.start()
        (self._long if slow else self._short).submit(self._compile_here, c, deadline)

    def _compile_here(self, c: "_Compile", deadline: threading.Timer) -> None:
        if c.future.done():  # expired while it waited for the lane: nobody waits for it now
            return
        with self._lock:
            cached = self.cache.get(c.key)  # an earlier, expired compile of the same guide may have finished
        try:
            compiled = cached if cached is not None else self.compile(*c.key)
        except InvalidRequest as e:  # a worker compiled it: only a bug gets here
            deadline.cancel()
            self._forget(c)
            _settle(c.future, error=e)
            return
        deadline.cancel()
        with self._lock:
            self.cache.put(c.key, compiled)  # even when its requests stopped waiting: the next one finds it
        self._forget(c)
        _settle(c.future, result=compiled)

    def _expire(self, c: "_Compile") -> None:
        """The engine-process compile of c (queue time included) outlived the budget: its requests fail now; the
        compile itself cannot be stopped and still fills the cache when it ends."""
        self._forget(c)
        _settle(
            c.future,
            error=InvalidRequest(
                f"compiling the guide took longer than the configured grammar_compile_timeout_s ({self.timeout_s:g} s) "
                "in the server process; retry, or simplify the schema or grammar"
            ),
        )

    def _release(self, c: "_Compile", stop_running: bool = True) -> None:
        """A request stopped waiting for c (cancelled); the last one out drops the compile from the queue, or
        stops the worker's compile (stop_running; else the compile finishes and its grammar is cached)."""
        with self._lock:
            c.waiters -= 1
            if c.waiters or c.job.future.done():
                return
            self._inflight.pop(c.key, None)
        self.pool.cancel(c.job, stop_running)

    def _forget(self, c: "_Compile") -> None:
        with self._lock:
            if self._inflight.get(c.key) is c:
                del self._inflight[c.key]

    def cache_bytes(self) -> int:
        return self.cache.bytes

    def close(self) -> None:
        """Stop the worker processes and the compile threads (pending compiles fail)."""
        self._finalizer()


def _close(pools: list[CompilePool], *executors: ThreadPoolExecutor) -> None:
    for pool in pools:
        pool.close()
    for ex in executors:
        ex.shutdown(wait=False, cancel_futures=True)


def _settle(future: Future, result=None, error: Exception | None = None) -> None:
    """Complete future unless it is complete already (a deadline and a compile may race to it)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


def _done(value) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


class _Compile:
    """One guide being compiled for one or more requests."""

    def __init__(self, key: tuple, job: Job):
        self.key, self.job = key, job
        self.future: Future = Future()  # -> the compiled grammar (engine process), or InvalidRequest
        self.waiters = 0


class GrammarCache:
    """Compiled grammars by (kind, guide), least recently used dropped first beyond `limit` bytes."""

    def __init__(self, limit: int):
        self.limit, self.bytes = limit, 0
        self._items: OrderedDict = OrderedDict()

    def get(self, key):
        compiled = self._items.get(key)
        if compiled is not None:
            self._items.move_to_end(key)
        return compiled

    def put(self, key, compiled) -> None:
        if key in self._items:
            return
        self._items[key] = compiled
        self.bytes += compiled.memory_size_bytes
        while self.bytes > self.limit and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self.bytes -= old.memory_size_bytes


class PendingGrammar:
    """A compile in flight. `result()` -> compiled grammar, None while pending, raises InvalidRequest.
    `cancel()`: the request no longer waits (its compile stops if no other request waits for it; with
    stop_running False a compile already running finishes, its grammar cached, and only a queued one is
    dropped: what a request refused at capacity, and so likely retried, leaves behind)."""

    def __init__(self, future: Future, on_cancel=None):
        self.future, self._on_cancel = future, on_cancel

    def result(self):
        if self.future.done():
            return self.future.result()  # re-raises InvalidRequest
        return None

    def cancel(self, stop_running: bool = True) -> None:
        if self._on_cancel is not None and not self.future.done():
            self._on_cancel(stop_running)
            self._on_cancel = None
