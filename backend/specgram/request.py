"""Per-request state: sampling parameters, committed tokens, limits, statistics, and what goes back out."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from .drafting.acceptance import RequestAcceptance
from .errors import InvalidRequest
from .spec_stats import SpecStats
from .wire import ErrorKind, FinishReason

_ids = itertools.count(1)
MAX_STOP_STRINGS = 16
MAX_LOGPROBS = 20  # top-n logprobs per token, as OpenAI's top_logprobs allows
MAX_TOKEN_LISTS = 1024  # entries in logit_bias, stop_token_ids, bad_words, allowed_token_ids
UINT64_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1
GREEDY_BELOW = 1e-5  # a temperature below this is greedy (as vLLM): dividing by it overflows float32 logits
AUTO_DRAFT = -1  # num_draft_tokens: the engine chooses the draft length per request per step


@dataclass
class SamplingParams:
    """What a client may set per request. `validate` fills defaults and fails with a user-facing message."""

    max_tokens: int | None = None
    min_tokens: int = 0  # the first min_tokens tokens are never EOS nor end a stop string (min_tokens.py)
    temperature: float = 0.0  # 0 = greedy (the default: exact, reproducible output)
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    num_draft_tokens: int | None = None  # speculative draft length; 0 = none; AUTO_DRAFT (-1) = the engine
    # chooses per step (adaptive.py); None = the configured default
    ignore_eos: bool = False  # keep generating past EOS (fixed-length load runs)
    drafter: str | None = None  # which drafter proposes this request's drafts (None = the configured default)
    tree_drafts: bool = True  # False: lines of drafts only (speculation/trees.py)
    guide_type: str | None = None  # as the client spelled it (aliases allowed); grammar.normalize_guide_type
    guide: str | None = None
    guide_options: tuple = ()  # (name, value) overrides of the server's JSON-schema compile options
    # (json_any_whitespace, json_strict): vLLM's structured-output flags
    logprobs: int | None = None  # per token: the chosen token's logprob and the top-n (None: no logprobs)
    cumulative_logprob: bool = False  # track the sum of the chosen tokens' logprobs (needs their logprobs)
    presence_penalty: float = 0.0  # vLLM's penalties (penalties.py)
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    stop_token_ids: list[int] = field(default_factory=list)  # also end the output (kept, like EOS)
    bad_words: list[str] = field(default_factory=list)  # never generated (penalties.py)
    allowed_token_ids: list[int] | None = None  # only these (None: every token)
    lora_name: str | None = None  # a LoRA adapter the engine loaded (config enable_lora); None: the base model
    cache_salt: str | None = None  # vLLM's name: requests share cached prompts' KV (prefix cache) and each other's
    # outputs (suffix drafts) only with the same salt; None: the one unsalted scope
    max_reasoning_chars: int | None = None  # a thinking model's reasoning before a guided answer, at most this many
    # characters (None: no bound); then the grammar forces the end marker (grammar/compile.py, reasoning_prefix)

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None or self.cumulative_logprob

    @property
    def penalized(self) -> bool:
        """Whether any logits processor beyond the grammar mask and min_tokens applies (penalties.py)."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.bad_words
            or self.allowed_token_ids is not None
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def auto_draft(self) -> bool:
        return self.num_draft_tokens == AUTO_DRAFT

    @property
    def speculates(self) -> bool:
        return self.num_draft_tokens != 0

    def validate(self, default_max_tokens: int, max_draft_len: int, max_stop_chars: int = 1000) -> "SamplingParams":
        if self.max_tokens is None:
            self.max_tokens = default_max_tokens
        if (
            isinstance(self.max_tokens, bool)
            or not isinstance(self.max_tokens, int)
            or not 1 <= self.max_tokens <= INT32_MAX
        ):
            raise InvalidRequest(f"max_tokens must be an integer in [1, {INT32_MAX}], got {self.max_tokens!r}")
        if (
            isinstance(self.min_tokens, bool)
            or not isinstance(self.min_tokens, int)
            or not 0 <= self.min_tokens <= self.max_tokens
        ):
            raise InvalidRequest(
                f"min_tokens must be an integer in [0, max_tokens] = [0, {self.max_tokens}], got {self.min_tokens!r}"
            )
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequest(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.temperature < GREEDY_BELOW:
            self.temperature = 0.0
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k == -1:
            self.top_k = 0
        if not 0 <= self.top_k <= INT32_MAX:
            raise InvalidRequest(f"top_k must be in [0, {INT32_MAX}] (0 or -1 = off), got {self.top_k!r}")
        if self.seed is not None and not -(2**63) <= self.seed <= UINT64_MAX:
            raise InvalidRequest(f"seed must be in [-2^63, 2^64), got {self.seed!r}")
        if self.seed is not None and self.seed < 0:
            self.seed += 2**64  # OpenAI's seeds are signed 64-bit: the same bits, read unsigned
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequest("stop strings must be non-empty strings")
        for name, words in (("stop", self.stop), ("bad_words", self.bad_words)):
            longest = max((len(w) for w in words if isinstance(w, str)), default=0)
            if longest > max_stop_chars:
                raise InvalidRequest(
                    f"{name}: an entry has {longest} characters; at most {max_stop_chars} (config max_stop_chars)"
                )
        if self.max_reasoning_chars is not None and not 0 <= self.max_reasoning_chars <= INT32_MAX:
            raise InvalidRequest(f"max_reasoning_chars must be in [0, {INT32_MAX}], got {self.max_reasoning_chars!r}")
        if self.cache_salt is not None and (
            not isinstance(self.cache_salt, str) or not 0 < len(self.cache_salt) <= 256
        ):
            raise InvalidRequest(f"cache_salt must be a string of 1 to 256 characters, got {self.cache_salt!r:.80}")
        if not isinstance(self.num_draft_tokens, int) or not AUTO_DRAFT <= self.num_draft_tokens <= max_draft_len:
            raise InvalidRequest(
                f"num_draft_tokens must be -1 (auto) or an integer in [0, {max_draft_len}] "
                f"(the configured max_draft_len), got {self.num_draft_tokens!r}"
            )
        self._validate_processors()
        if self.guide is not None and self.guide_type is None:
            raise InvalidRequest("guided_decoding_guide needs guided_decoding_guide_type")
        if self.guide_type is not None and self.guide is None:
            self.guide = ""  # fine for type "json" (any JSON); the others say what they need
        return self

    def _validate_processors(self) -> None:
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise InvalidRequest(f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise InvalidRequest(f"{name} must be in [-2, 2], got {getattr(self, name)!r}")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise InvalidRequest(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty!r}")
        if any(not -100.0 <= b <= 100.0 for b in self.logit_bias.values()):
            raise InvalidRequest("logit_bias values must be in [-100, 100]")
        lists = (self.logit_bias, self.stop_token_ids, self.bad_words, self.allowed_token_ids or ())
        if any(len(x) > MAX_TOKEN_LISTS for x in lists):
            raise InvalidRequest(
                f"logit_bias, stop_token_ids, bad_words and allowed_token_ids take at most "
                f"{MAX_TOKEN_LISTS} entries each"
            )
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise InvalidRequest("allowed_token_ids must not be empty")
        if any(not w for w in self.bad_words):
            raise InvalidRequest("bad_words must be non-empty strings")

    def check_token_ids(self, vocab: int) -> None:
        """Token ids the client gave must exist in the model's vocabulary [0, vocab)."""
        for name, ids in (
            ("logit_bias", self.logit_bias),
            ("stop_token_ids", self.stop_token_ids),
            ("allowed_token_ids", self.allowed_token_ids or ()),
        ):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise InvalidRequest(f"{name}: token ids {bad[:5]} are outside the vocabulary [0, {vocab})")


@dataclass
class RequestOutput:
    """One response's worth: the tokens committed in one step and their text delta."""

    request_id: int
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None
    error_kind: ErrorKind | None = None
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens whose KV was reused (prefix_cache), not prefilled
    spec: SpecStats | None = None  # set on the final output
    queue_s: float | None = None  # final output: seconds from arrival to a KV slot (None: never had one)
    logprobs: list[list[TokenLogprob]] | None = None  # per token: the chosen one first, then the top-n
    cumulative_logprob: float = 0.0  # the chosen tokens' logprobs summed over the whole output so far


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token of its row
    decoded: str  # the token's text alone


PRIVATE = ("engine",)  # the scope's salt of engine-private requests (a tuple: never a client's string cache_salt)


@dataclass(eq=False)  # identity: two requests are never "equal"
class Request:
    """Engine-side state of one sequence. While its prompt is being prefilled (in chunks, across steps):
    cache_len < len(prompt_ids) and no output yet. After that, while running: cache_len == len(all_ids) - 1
    (every token but the last committed one has its KV in the slot's cache row)."""

    prompt_ids: list[int]
    params: SamplingParams
    request_id: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    slot: int = -1
    cache_len: int = 0
    adapter: int = -1  # its LoRA adapter's index in the engine's (lora_name); -1: the base model
    cached_prompt_tokens: int = 0  # prompt tokens whose KV was reused from the cache, not prefilled
    seed: int = 0  # the sampling noise's key (sample/noise.py): params.seed, or drawn at
    # admission when the client gave none
    generator: torch.Generator | None = None  # rejection sampling's uniforms (speculative_sampling rejection)
    spec: SpecStats = field(default_factory=SpecStats)
    finish_reason: FinishReason | None = None
    # the grammar's objects (grammar/compiler.py PendingGrammar, grammar/guide.py Guide: the layer above)
    pending_grammar: Any = None  # while its guide compiles
    guide: Any = None  # once compiled (None: unconstrained)
    guide_ids: list[int] = field(default_factory=list)  # the guide's text, tokenized: a lookup source
    bad_word_ids: list[list[int]] = field(default_factory=list)  # params.bad_words tokenized (penalties.py)
    acceptance: RequestAcceptance | None = None  # per draft source (adaptive k), set when the engine takes it
    arrived: float = field(default_factory=time.monotonic)  # when it was made (validated and tokenized)
    admitted: float | None = None  # when it got its KV slot
    cumulative_logprob: float = 0.0  # the committed tokens' logprobs summed (when params.wants_logprobs)
    private: bool = False  # the engine's own request (the load-time warm-up): a scope no client can name

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def scope(self) -> tuple[int, object]:
        """What may share this request's cached state (the prefix cache's KV, the suffix store's outputs): requests
        of the same LoRA adapter and the same cache_salt; an engine-private request shares with none of a client's
        (PRIVATE is no string, so no cache_salt equals it)."""
        return self.adapter, PRIVATE if self.private else self.params.cache_salt

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefilling(self) -> bool:
        return self.cache_len < len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
