"""Guided decoding with xgrammar: compile guides (off the step loop, cached), and one matcher per request.

GrammarCompiler: one per tokenizer. xgrammar's own compiler cache is the compiled-grammar LRU (byte limit).
Compiles run in a small thread pool (xgrammar releases the GIL) so that the engine keeps stepping while a
request waits for its grammar; a compile that outlives `grammar_compile_timeout_s` fails that request only.

Guide: a request's matcher. The step moves it only in two ways:
  tentative  accept drafted tokens while filling bitmask rows, then roll back exactly that many;
  commit     accept the verified tokens, each of which must succeed (the masks guarantee it).
"""
from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from .errors import InvalidRequest
from .request import WireEnum


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


def normalize_guide_type(guide_type: str) -> GuideType:
    kind = GUIDE_TYPES.get(guide_type.lower())
    if kind is None:
        raise InvalidRequest(f"unknown guided_decoding_guide_type {guide_type!r}; "
                             f"use one of {sorted(t.value for t in GuideType)}")
    return kind


class GrammarCompiler:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int], cache_bytes: int,
                 compile_threads: int = 2, timeout_s: float = 30.0, max_guide_bytes: int = 256 * 1024,
                 json_strict: bool = True, json_any_whitespace: bool = True):
        import xgrammar as xgr

        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=stop_token_ids)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=2, cache_enabled=True,
                                            cache_limit_bytes=cache_bytes)
        self.pool = ThreadPoolExecutor(compile_threads, thread_name_prefix="grammar-compile")
        self.timeout_s = timeout_s
        self.max_guide_bytes = max_guide_bytes
        # strict: objects without "additionalProperties" get no extra keys (xgrammar's and vLLM's default;
        # JSON Schema itself allows them, and small models then ramble on adding keys).
        # any_whitespace: free whitespace between tokens; False fixes the layout, which makes more positions
        # grammar-forced (free drafts) but may push a model off the formatting it prefers.
        self.json_strict = json_strict
        self.json_any_whitespace = json_any_whitespace

    def check(self, guide_type: str, guide: str) -> GuideType:
        """Cheap checks done when the request arrives; -> the normalized guide type."""
        kind = normalize_guide_type(guide_type)
        if len(guide.encode("utf-8")) > self.max_guide_bytes:
            raise InvalidRequest(f"guided_decoding_guide is larger than {self.max_guide_bytes} bytes")
        if kind in (GuideType.JSON_SCHEMA, GuideType.STRUCTURAL_TAG):
            try:
                json.loads(guide)
            except json.JSONDecodeError as e:
                raise InvalidRequest(f"guided_decoding_guide for {kind} is not valid JSON: {e}") from None
        elif kind != GuideType.JSON and not guide:
            raise InvalidRequest(f"guided_decoding_guide is empty (required for {kind})")
        return kind

    def compile(self, kind: GuideType, guide: str):
        """Blocking compile (runs in the pool). Raises InvalidRequest with xgrammar's reason."""
        try:
            if kind == GuideType.JSON:
                return self.compiler.compile_builtin_json_grammar()
            if kind == GuideType.JSON_SCHEMA:
                return self.compiler.compile_json_schema(guide, any_whitespace=self.json_any_whitespace,
                                                         strict_mode=self.json_strict)
            if kind == GuideType.REGEX:
                return self.compiler.compile_regex(guide)
            if kind == GuideType.EBNF:
                return self.compiler.compile_grammar(guide)
            return self.compiler.compile_structural_tag(guide)
        except Exception as e:  # xgrammar raises RuntimeError/ValueError/its own types with a useful message
            raise InvalidRequest(f"cannot compile the {kind} guide: {str(e).strip()[:500]}") from None

    def submit(self, kind: GuideType, guide: str) -> "PendingGrammar":
        return PendingGrammar(self.pool.submit(self.compile, kind, guide), time.monotonic() + self.timeout_s)

    def cache_bytes(self) -> int:
        return self.compiler.get_cache_size_bytes()


class PendingGrammar:
    """A compile in flight. `result()` -> compiled grammar, None while pending, raises InvalidRequest."""

    def __init__(self, future: Future, deadline: float):
        self.future, self.deadline = future, deadline

    def result(self):
        if self.future.done():
            return self.future.result()     # re-raises InvalidRequest
        if time.monotonic() > self.deadline:
            self.future.cancel()
            raise InvalidRequest("compiling the guide took longer than the configured grammar_compile_timeout_s; "
                                 "simplify the schema or grammar")
        return None


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
