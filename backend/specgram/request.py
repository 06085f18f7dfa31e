"""Per-request state: sampling parameters, committed tokens, limits, statistics, and what goes back out."""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .errors import InvalidRequest
from .wire import ErrorKind, FinishReason

if TYPE_CHECKING:
    from .grammar.compiler import PendingGrammar
    from .grammar.guide import Guide
    from .speculation.adaptive import RequestAcceptance

_ids = itertools.count(1)
MAX_STOP_STRINGS = 16
UINT64_MAX = 2**64 - 1
AUTO_DRAFT = -1     # num_draft_tokens: the engine chooses the draft length per request per step


@dataclass
class SamplingParams:
    """What a client may set per request. `validate` fills defaults and fails with a user-facing message."""
    max_tokens: int | None = None
    min_tokens: int = 0             # the first min_tokens tokens are never EOS nor end a stop string (min_tokens.py)
    temperature: float = 0.0        # 0 = greedy (the default: exact, reproducible output)
    top_p: float = 1.0
    top_k: int = 0                  # 0 or -1 = off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    num_draft_tokens: int | None = None  # speculative draft length; 0 = none; AUTO_DRAFT (-1) = the engine
                                         # chooses per step (adaptive.py); None = the configured default
    ignore_eos: bool = False        # keep generating past EOS (fixed-length load runs)
    drafter: str | None = None      # which drafter proposes this request's drafts (None = the configured default)
    guide_type: str | None = None   # as the client spelled it (aliases allowed); grammar.normalize_guide_type
    guide: str | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def auto_draft(self) -> bool:
        return self.num_draft_tokens == AUTO_DRAFT

    @property
    def speculates(self) -> bool:
        return self.num_draft_tokens != 0

    def validate(self, default_max_tokens: int, max_draft_len: int) -> "SamplingParams":
        if self.max_tokens is None:
            self.max_tokens = default_max_tokens
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) \
                or not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidRequest(f"min_tokens must be an integer in [0, max_tokens] = [0, {self.max_tokens}], "
                                 f"got {self.min_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequest(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k == -1:
            self.top_k = 0
        if self.top_k < 0:
            raise InvalidRequest(f"top_k must be >= 0 (0 or -1 = off), got {self.top_k!r}")
        if self.seed is not None and not 0 <= self.seed <= UINT64_MAX:
            raise InvalidRequest(f"seed must be in [0, 2^64), got {self.seed!r}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequest("stop strings must be non-empty strings")
        if not isinstance(self.num_draft_tokens, int) or not AUTO_DRAFT <= self.num_draft_tokens <= max_draft_len:
            raise InvalidRequest(f"num_draft_tokens must be -1 (auto) or an integer in [0, {max_draft_len}] "
                                 f"(the configured max_draft_len), got {self.num_draft_tokens!r}")
        if self.guide is not None and self.guide_type is None:
            raise InvalidRequest("guided_decoding_guide needs guided_decoding_guide_type")
        if self.guide_type is not None and self.guide is None:
            self.guide = ""       # fine for type "json" (any JSON); the others say what they need
        return self


@dataclass
class SpecStats:
    drafted: int = 0      # draft tokens proposed
    accepted: int = 0     # draft tokens the target accepted
    steps: int = 0        # speculative verify steps (those with at least one draft token)
    accepted_hist: list[int] = field(default_factory=list)   # [a] = speculative steps that accepted a drafts
    k_hist: list[int] = field(default_factory=list)          # [k] = decode steps that verified k drafts
    by_source: dict[str, list[int]] = field(default_factory=dict)  # source -> [drafted, accepted]

    def record(self, sources: list[str], accepted: int) -> None:
        """One decode step verified drafts from `sources` (one per draft) and accepted the first `accepted`."""
        drafted = len(sources)
        if len(self.k_hist) <= drafted:
            self.k_hist.extend([0] * (drafted + 1 - len(self.k_hist)))
        self.k_hist[drafted] += 1
        if drafted == 0:
            return
        for j, s in enumerate(sources):
            counts = self.by_source.setdefault(s, [0, 0])
            counts[0] += 1
            counts[1] += j < accepted
        self.drafted += drafted
        self.accepted += accepted
        self.steps += 1
        if len(self.accepted_hist) <= accepted:
            self.accepted_hist.extend([0] * (accepted + 1 - len(self.accepted_hist)))
        self.accepted_hist[accepted] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_length(self) -> float:
        """Tokens committed per speculative step (1 + accepted drafts), TensorRT-LLM's 'acceptance length'."""
        return (self.steps + self.accepted) / self.steps if self.steps else 0.0

    def detail(self) -> dict:
        """The per-source counts and the k distribution (the `spec_detail` output, as JSON)."""
        return {"sources": {s: {"drafted": d, "accepted": a} for s, (d, a) in sorted(self.by_source.items())},
                "k_hist": list(self.k_hist)}


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
    num_cached_tokens: int = 0              # prompt tokens whose KV was reused (prefix_cache), not prefilled
    spec: SpecStats | None = None          # set on the final output
    queue_s: float | None = None           # final output: seconds from arrival to a KV slot (None: never had one)


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
    cached_prompt_tokens: int = 0   # prompt tokens whose KV was reused from the cache, not prefilled
    seed: int = 0                   # the sampling noise's key (speculation/noise.py): params.seed, or drawn at
                                    # admission when the client gave none
    generator: torch.Generator | None = None    # rejection sampling's uniforms (speculative_sampling rejection)
    spec: SpecStats = field(default_factory=SpecStats)
    finish_reason: FinishReason | None = None
    pending_grammar: PendingGrammar | None = None  # while its guide compiles
    guide: Guide | None = None             # once compiled (None: unconstrained)
    guide_ids: list[int] = field(default_factory=list)  # the guide's text, tokenized: a lookup source
    acceptance: RequestAcceptance | None = None   # per draft source (adaptive k), set when the engine takes it
    arrived: float = field(default_factory=time.monotonic)     # when it was made (validated and tokenized)
    admitted: float | None = None          # when it got its KV slot

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefilling(self) -> bool:
        return self.cache_len < len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
