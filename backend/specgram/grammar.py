"""Guided decoding with xgrammar: compile guides (off the step loop, cached), and one matcher per request.

GrammarCompiler: one per tokenizer. A request's guide is checked when it arrives (kind, size, JSON, keywords
xgrammar would not enforce: schema_keywords.py), then compiled without blocking the step loop:
  - at once in the engine process when that is cheap and bounded: the builtin JSON grammar (compiled at load)
    and the compiled-grammar cache (an LRU keyed by (kind, guide), bounded in bytes);
  - otherwise first in a worker process (grammar_pool.py), where a compile that outlives
    `grammar_compile_timeout_s` is killed, and, once a worker has compiled it in time, again in the engine
    process (a thread; xgrammar releases the GIL), which is then known to finish. Identical guides in flight
    share one compile.

Guide: a request's matcher. The step moves it only in two ways:
  tentative  accept drafted tokens while filling bitmask rows, then roll back exactly that many;
  commit     accept the verified tokens, each of which must succeed (the masks guarantee it).
"""
from __future__ import annotations

import json
import re
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from .errors import InvalidRequest
from .grammar_pool import TRIAL_S, CompilePool, Job
from .request import WireEnum
from .schema_keywords import describe, unenforced_keyword


class GuideType(WireEnum):
    """The guide kinds the engine compiles (the values of `guided_decoding_guide_type`, aliases aside)."""
    JSON = "json"                       # any JSON value; the guide may be empty
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    EBNF = "ebnf"                       # xgrammar EBNF / GBNF
    STRUCTURAL_TAG = "structural_tag"   # xgrammar's structural tag (JSON)


# what a client may send -> the kind (aliases as other servers spell them)
GUIDE_TYPES = {**{t.value: t for t in GuideType}, "json_object": GuideType.JSON, "grammar": GuideType.EBNF,
               "gbnf": GuideType.EBNF}
UNSUPPORTED_KEYWORDS = ("error", "ignore")   # what json_unsupported_keywords may say


def normalize_guide_type(guide_type: str) -> GuideType:
    kind = GUIDE_TYPES.get(guide_type.lower())
    if kind is None:
        raise InvalidRequest(f"unknown guided_decoding_guide_type {guide_type!r}; "
                             f"use one of {sorted(t.value for t in GuideType)}")
    return kind


def compile_guide(compiler, kind: GuideType, guide: str, json_strict: bool, json_any_whitespace: bool):
    """One compile with an xgrammar GrammarCompiler (in the engine process and in the workers alike).
    Raises InvalidRequest with xgrammar's reason."""
    try:
        if kind == GuideType.JSON:
            return compiler.compile_builtin_json_grammar()
        if kind == GuideType.JSON_SCHEMA:
            return compiler.compile_json_schema(guide, any_whitespace=json_any_whitespace, strict_mode=json_strict)
        if kind == GuideType.REGEX:
            return compiler.compile_regex(guide)
        if kind == GuideType.EBNF:
            return compiler.compile_grammar(guide)
        return compiler.compile_structural_tag(guide)
    except Exception as e:  # xgrammar raises RuntimeError/ValueError/its own types with a useful message
        raise InvalidRequest(f"cannot compile the {kind} guide: {xgrammar_reason(e)[:500]}") from None


# xgrammar's messages start with its log line's prefix: "[17:32:59] /project/cpp/json_schema_converter.cc:5082: "
_LOG_PREFIX = re.compile(r"^\s*(\[\d\d:\d\d:\d\d\]\s*)?\S+\.(cc|h|cpp):\d+:\s*")


def xgrammar_reason(e: Exception) -> str:
    """An xgrammar exception's message without its log prefix (time stamp, C++ source file and line)."""
    return _LOG_PREFIX.sub("", str(e).strip())


class GrammarCompiler:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int], cache_bytes: int,
                 timeout_s: float = 30.0, max_guide_bytes: int = 256 * 1024, json_strict: bool = True,
                 json_any_whitespace: bool = True, workers: int = 2, queue_limit: int = 64,
                 unsupported_keywords: str = "error", trial_s: float = TRIAL_S):
        import xgrammar as xgr

        if unsupported_keywords not in UNSUPPORTED_KEYWORDS:
            raise ValueError(f"unsupported_keywords must be one of {UNSUPPORTED_KEYWORDS}")
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=stop_token_ids)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=2, cache_enabled=False)
        self.max_guide_bytes = max_guide_bytes
        # strict: objects without "additionalProperties" get no extra keys (xgrammar's and vLLM's default;
        # JSON Schema itself allows them, and small models then ramble on adding keys).
        # any_whitespace: free whitespace between tokens; False fixes the layout, which makes more positions
        # grammar-forced (free drafts) but may push a model off the formatting it prefers.
        self.options = dict(json_strict=json_strict, json_any_whitespace=json_any_whitespace)
        self.unsupported_keywords = unsupported_keywords
        self.builtin_json = self.compiler.compile_builtin_json_grammar()
        self.cache = GrammarCache(cache_bytes)
        self._lock = threading.Lock()
        self._inflight: dict[tuple, _Compile] = {}
        self.pool = CompilePool(workers, self.info.serialize_json(), self.options, timeout_s, queue_limit, trial_s)
        # the engine process's own compiles, of guides a worker compiled in time: those that took longer than a
        # trial in their own threads, so that they never hold up the short ones
        self._short = ThreadPoolExecutor(2, thread_name_prefix="grammar-compile")
        self._long = ThreadPoolExecutor(workers - 1, thread_name_prefix="grammar-compile-long")
        self._finalizer = weakref.finalize(self, _close, self.pool, self._short, self._long)

    def check(self, guide_type: str, guide: str) -> GuideType:
        """Cheap checks done when the request arrives; -> the normalized guide type."""
        kind = normalize_guide_type(guide_type)
        if len(guide.encode("utf-8")) > self.max_guide_bytes:
            raise InvalidRequest(f"guided_decoding_guide is larger than {self.max_guide_bytes} bytes")
        if kind in (GuideType.JSON_SCHEMA, GuideType.STRUCTURAL_TAG):
            try:
                parsed = json.loads(guide)
                if kind == GuideType.JSON_SCHEMA and self.unsupported_keywords == "error":
                    self._check_keywords(parsed)
            except json.JSONDecodeError as e:
                raise InvalidRequest(f"guided_decoding_guide for {kind} is not valid JSON: {e}") from None
            except RecursionError:
                raise InvalidRequest(f"guided_decoding_guide for {kind} is nested too deeply") from None
        elif kind == GuideType.JSON and guide.strip():
            raise InvalidRequest(f"guided_decoding_guide must be empty for guide type {guide_type!r} (any JSON "
                                 "value); send a schema with guided_decoding_guide_type json_schema")
        elif kind != GuideType.JSON and not guide:
            raise InvalidRequest(f"guided_decoding_guide is empty (required for {kind})")
        return kind

    def _check_keywords(self, schema) -> None:
        found = unenforced_keyword(schema, self.options["json_strict"])
        if found:
            raise InvalidRequest(f"guided_decoding_guide: {describe(found)}; remove it, or ask the operator for "
                                 "json_unsupported_keywords=ignore (best effort: the keyword is then not enforced)")

    def compile(self, kind: GuideType, guide: str):
        """Blocking compile in this process; raises InvalidRequest. For guides already known to compile in time
        (and for tools and tests): an arbitrary guide may take any time and memory here."""
        return compile_guide(self.compiler, kind, guide, **self.options)

    def submit(self, kind: GuideType, guide: str) -> "PendingGrammar":
        """Start compiling (or find) the guide; raises Overloaded when too many guides wait for a worker."""
        if kind == GuideType.JSON:
            return PendingGrammar(_done(self.builtin_json))
        key = (kind, guide)
        with self._lock:
            compiled = self.cache.get(key)
            if compiled is not None:
                return PendingGrammar(_done(compiled))
            c = self._inflight.get(key)
            started = c is None
            if started:
                c = self._inflight[key] = _Compile(key, self.pool.submit(kind, guide))
            c.waiters += 1
        if started:     # outside the lock: a callback on a future already done runs here, and takes the lock
            c.job.future.add_done_callback(lambda _: self._verdict(c))
        return PendingGrammar(c.future, lambda: self._release(c))

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
        (self._long if job.long else self._short).submit(self._compile_here, c)

    def _compile_here(self, c: "_Compile") -> None:
        try:
            compiled = self.compile(*c.key)
        except InvalidRequest as e:         # a worker compiled it: only a bug gets here
            self._forget(c)
            c.future.set_exception(e)
            return
        with self._lock:
            self.cache.put(c.key, compiled)
            self._inflight.pop(c.key, None)
        c.future.set_result(compiled)

    def _release(self, c: "_Compile") -> None:
        """A request stopped waiting for c (cancelled); the last one out stops the worker's compile."""
        with self._lock:
            c.waiters -= 1
            if c.waiters or c.job.future.done():
                return
            self._inflight.pop(c.key, None)
        self.pool.cancel(c.job)

    def _forget(self, c: "_Compile") -> None:
        with self._lock:
            if self._inflight.get(c.key) is c:
                del self._inflight[c.key]

    def cache_bytes(self) -> int:
        return self.cache.bytes

    def close(self) -> None:
        """Stop the worker processes and the compile threads (pending compiles fail)."""
        self._finalizer()


def _close(pool: CompilePool, *executors: ThreadPoolExecutor) -> None:
    pool.close()
    for ex in executors:
        ex.shutdown(wait=False, cancel_futures=True)


def _done(value) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


class _Compile:
    """One guide being compiled for one or more requests."""

    def __init__(self, key: tuple, job: Job):
        self.key, self.job = key, job
        self.future: Future = Future()      # -> the compiled grammar (engine process), or InvalidRequest
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
    `cancel()`: the request no longer waits (its compile stops if no other request waits for it)."""

    def __init__(self, future: Future, on_cancel=None):
        self.future, self._on_cancel = future, on_cancel

    def result(self):
        if self.future.done():
            return self.future.result()     # re-raises InvalidRequest
        return None

    def cancel(self) -> None:
        if self._on_cancel is not None and not self.future.done():
            self._on_cancel()
            self._on_cancel = None


def bitmask_width(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def single_allowed_token(row: np.ndarray) -> int:
    """row: [W] int32 bitmask -> the token id if exactly one bit is set, else -1."""
    nz = np.flatnonzero(row)
    if nz.size != 1:
        return -1
    word = int(row[nz[0]]) & 0xFFFFFFFF
    if word & (word - 1):
        return -1
    return int(nz[0]) * 32 + word.bit_length() - 1


def token_allowed(row: np.ndarray, token: int) -> bool:
    return bool((int(row[token >> 5]) >> (token & 31)) & 1)


class Guide:
    """A request's grammar state (one xgrammar matcher) plus its tentative-accept bookkeeping."""

    def __init__(self, compiled):
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)    # rollback depth is unlimited in xgrammar >= 0.2
        self.tentative = 0          # tokens accepted since the last commit, to be rolled back

    def fill(self, bitmask: torch.Tensor, index: int) -> None:
        """Write the mask for the next position (after the tentative tokens) into bitmask[index]."""
        self.matcher.fill_next_token_bitmask(bitmask, index)

    def try_tentative(self, token: int) -> bool:
        if self.matcher.accept_token(token):
            self.tentative += 1
            return True
        return False

    def legal_prefix(self, tokens: list[int]) -> int:
        """-> how many of tokens, in order, the grammar accepts after the current (tentative) state; the
        matcher is left as it was."""
        n = 0
        for t in tokens:
            if self.matcher.is_terminated() or not self.matcher.accept_token(t):
                break                   # (nothing follows the stop token: do not even ask the matcher)
            n += 1
        if n:
            self.matcher.rollback(n)
        return n

    def rollback(self) -> None:
        if self.tentative:
            self.matcher.rollback(self.tentative)
            self.tentative = 0

    def commit(self, token: int) -> None:
        assert self.tentative == 0, "commit with tentative tokens still accepted"
        if not self.matcher.accept_token(token):
            raise AssertionError(f"committed token {token} violates the grammar: masks and matcher disagree")

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()
