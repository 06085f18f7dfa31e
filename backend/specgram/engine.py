"""The engine: admission, continuous batching and the step. Single-threaded: one thread owns it
(see loop.py); nothing here locks.

Each step:  admit -> prefill (new requests get their first token) -> decode step for the others:
            draft -> verify (one batched target forward) -> accept -> commit -> emit.
Draft is empty until a drafter is configured, which makes verify a plain decode over [last token].
"""
from __future__ import annotations

import random
from collections import deque
from pathlib import Path

import torch

from . import sampling
from .config import EngineConfig
from .detokenize import IncrementalDetokenizer
from .errors import InvalidRequest, ModelLoadError, Unsupported
from .prompt import prompt_ids as build_prompt_ids
from .request import Request, RequestOutput, SamplingParams
from .runner import ModelRunner
from .stopping import find_stop, holdback


def load_tokenizer(path: str):
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:
        raise ModelLoadError(f"could not load the tokenizer from {path!r}: {e}") from e


class _TextState:
    """Per request: the output text so far (stop strings cut off) and how much of it was sent."""
    __slots__ = ("detok", "text", "sent")

    def __init__(self, detok: IncrementalDetokenizer):
        self.detok, self.text, self.sent = detok, "", 0


class Engine:
    def __init__(self, config: EngineConfig, target: ModelRunner, tokenizer):
        self.config = config
        self.target = target
        self.tokenizer = tokenizer
        self.device = target.device
        self.eos_ids = self._eos_ids(target, tokenizer)
        self.free_slots: list[int] = list(range(config.max_slots))[::-1]
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}
        self._text: dict[int, _TextState] = {}

    @classmethod
    def from_config(cls, config: EngineConfig) -> "Engine":
        path = str(Path(config.checkpoint))
        target = ModelRunner.from_pretrained(path, config.max_slots, config.max_seq_len, config.torch_device(),
                                             config.torch_dtype())
        return cls(config, target, load_tokenizer(path))

    @staticmethod
    def _eos_ids(target: ModelRunner, tokenizer) -> set[int]:
        ids = set()
        gen = getattr(target.model, "generation_config", None)
        for src in (getattr(gen, "eos_token_id", None), target.config.eos_token_id, tokenizer.eos_token_id):
            if src is not None:
                ids.update(src if isinstance(src, (list, tuple)) else [src])
        return ids

    # ---- requests in and out (called by the owning thread) ----------------------------------------------

    def make_request(self, params: SamplingParams, text: str | None = None, messages: list[dict] | None = None,
                     chat: bool = False, prompt_ids: list[int] | None = None) -> Request:
        """Validate and tokenize; raises InvalidRequest with a user-facing message. Thread-safe (no state)."""
        params.validate(self.config.default_max_tokens, self.config.max_draft_len)
        if params.guide_type is not None:
            raise Unsupported("guided decoding (guided_decoding_guide_type) is not available in this build yet")
        if params.num_draft_tokens > 0:
            raise Unsupported("speculative decoding (num_draft_tokens > 0) is not available in this build yet")
        ids = prompt_ids if prompt_ids is not None else build_prompt_ids(self.tokenizer, text, messages, chat)
        if not ids:
            raise InvalidRequest("the prompt is empty")
        if any(not 0 <= t < self.target.vocab_size for t in ids):
            raise InvalidRequest(f"prompt token ids must be in [0, {self.target.vocab_size})")
        limit = self.config.max_seq_len - 1
        if len(ids) > limit:
            raise InvalidRequest(f"the prompt has {len(ids)} tokens; this model accepts at most {limit} "
                                 f"(max_seq_len {self.config.max_seq_len} minus one token to generate)")
        return Request(prompt_ids=list(ids), params=params)

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def abort(self, request_id: int, reason: str = "cancelled", error: str | None = None) -> RequestOutput | None:
        """Remove a request wherever it is; its slot is free for the next step. None if it is not here."""
        req = self.running.get(request_id) or next((r for r in self.waiting if r.request_id == request_id), None)
        if req is None:
            return None
        req.finish_reason = reason
        return self._final(req, [], "", error)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- the step ---------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        decoding = list(self.running.values())
        admitted = self._admit()
        if admitted:
            outputs += self._guarded(admitted, self._prefill)
        if decoding:
            outputs += self._guarded(decoding, self._decode)
        return outputs

    def _guarded(self, reqs: list[Request], phase) -> list[RequestOutput]:
        """A failure inside a forward fails the requests of that forward, not the engine."""
        try:
            return phase(reqs)
        except Exception as e:  # noqa: BLE001 - reported to each affected client
            outs = []
            for r in reqs:
                if not r.finished:
                    r.finish_reason = "error"
                    outs.append(self._final(r, [], "", f"internal error during generation: {e!r}"))
            return outs

    def _admit(self) -> list[Request]:
        """Move waiting requests into free slots, keeping the padded prefill under max_prefill_tokens."""
        batch: list[Request] = []
        while self.waiting and self.free_slots:
            req = self.waiting[0]
            width = max([len(r.prompt_ids) for r in batch] + [len(req.prompt_ids)])
            if batch and width * (len(batch) + 1) > self.config.max_prefill_tokens:
                break
            self.waiting.popleft()
            req.slot = self.free_slots.pop()
            seed = req.params.seed if req.params.seed is not None else random.getrandbits(63)
            req.generator = torch.Generator().manual_seed(seed)
            self.running[req.request_id] = req
            self._text[req.request_id] = _TextState(IncrementalDetokenizer(self.tokenizer, req.prompt_ids))
            batch.append(req)
        return batch

    def _prefill(self, reqs: list[Request]) -> list[RequestOutput]:
        width = max(len(r.prompt_ids) for r in reqs)
        tokens = torch.zeros(len(reqs), width, dtype=torch.long)
        for b, r in enumerate(reqs):
            tokens[b, :len(r.prompt_ids)] = torch.tensor(r.prompt_ids)
        logits = self.target.forward(tokens.to(self.device), self._slots(reqs), self._zeros(reqs),
                                     self._tensor([len(r.prompt_ids) for r in reqs]), last_only=True)   # [B, V]
        for r in reqs:
            r.cache_len = len(r.prompt_ids)
        first = self._pick(logits, reqs).tolist()
        return [self._commit(r, [t]) for r, t in zip(reqs, first)]

    def _decode(self, reqs: list[Request]) -> list[RequestOutput]:
        reqs = [r for r in reqs if not r.finished]          # aborted between admission and now
        drafts = self._draft(reqs)
        logits = self._verify_forward(reqs, drafts)         # [B, 1 + max k, V]
        accepted = self._accept(reqs, drafts, logits)
        return [self._commit(r, toks) for r, toks in zip(reqs, accepted)]

    def _draft(self, reqs: list[Request]) -> list[list[int]]:
        return [[] for _ in reqs]

    def _verify_forward(self, reqs: list[Request], drafts: list[list[int]]) -> torch.Tensor:
        """One batched target forward over [last committed token, d_0 .. d_{k-1}] for every request."""
        width = 1 + max(len(d) for d in drafts)
        tokens = torch.zeros(len(reqs), width, dtype=torch.long)
        for b, (r, d) in enumerate(zip(reqs, drafts)):
            tokens[b, :1 + len(d)] = torch.tensor([r.output_ids[-1], *d])
        return self.target.forward(tokens.to(self.device), self._slots(reqs), self._tensor([r.cache_len for r in reqs]),
                                   self._tensor([1 + len(d) for d in drafts]), last_only=False)

    def _accept(self, reqs: list[Request], drafts: list[list[int]], logits: torch.Tensor) -> list[list[int]]:
        """Greedy: the longest draft prefix the target agrees with, then the target's own next token."""
        if any(drafts):
            raise NotImplementedError("speculative verification arrives with the drafters")
        for r in reqs:
            r.cache_len += 1
            r.spec.steps += 1
        return [[t] for t in self._pick(logits[:, 0], reqs).tolist()]

    def _pick(self, logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
        """logits: [B, V] -> [B] next tokens, greedy or sampled per request."""
        ids = sampling.greedy(logits)
        sampled = [b for b, r in enumerate(reqs) if not r.params.greedy]
        if sampled:
            rows = [reqs[b] for b in sampled]
            probs = sampling.probabilities(
                logits[sampled], self._tensor([r.params.temperature for r in rows], torch.float32),
                self._tensor([r.params.top_k for r in rows]), self._tensor([r.params.top_p for r in rows], torch.float32))
            u = sampling.draw_uniforms([r.generator for r in rows]).to(self.device)
            ids[sampled] = sampling.sample(probs, u)
        return ids.cpu()

    # ---- commit and emit --------------------------------------------------------------------------------

    def _commit(self, req: Request, tokens: list[int]) -> RequestOutput:
        """Append committed tokens until one finishes the request; return this step's response."""
        state = self._text[req.request_id]
        stops = req.params.stop
        new: list[int] = []
        stopped_by_string = False
        for t in tokens:
            req.output_ids.append(t)
            new.append(t)
            if t in self.eos_ids and not req.params.ignore_eos:
                req.finish_reason = "stop"
                break
            piece = state.detok.push(t)
            state.text += piece
            cut = find_stop(state.text, stops, len(state.text) - len(piece)) if piece else -1
            if cut >= 0:
                state.text = state.text[:cut]
                req.finish_reason = "stop"
                stopped_by_string = True
                break
            if len(req.output_ids) >= req.params.max_tokens or req.num_tokens >= self.config.max_seq_len:
                req.finish_reason = "length"
                break
        if req.finished:
            if not stopped_by_string:
                state.text += state.detok.flush()    # a character still held back at the very end
            return self._final(req, new, self._take_text(state, len(state.text)), None)
        end = len(state.text) - holdback(state.text, stops)
        return self._output(req, new, self._take_text(state, end))

    @staticmethod
    def _take_text(state: _TextState, end: int) -> str:
        delta = state.text[state.sent:end]
        state.sent = max(state.sent, end)
        return delta

    def _output(self, req: Request, tokens: list[int], text: str) -> RequestOutput:
        return RequestOutput(req.request_id, tokens, text, num_input_tokens=len(req.prompt_ids),
                             num_output_tokens=len(req.output_ids))

    def _final(self, req: Request, tokens: list[int], text: str, error: str | None) -> RequestOutput:
        """Finish bookkeeping: free the slot (its KV rows are simply overwritten later)."""
        if self.running.pop(req.request_id, None) is not None:
            self.free_slots.append(req.slot)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._text.pop(req.request_id, None)
        out = self._output(req, tokens, text)
        out.finished, out.finish_reason, out.error, out.spec = True, req.finish_reason, error, req.spec
        return out

    # ---- small tensor helpers ---------------------------------------------------------------------------

    def _tensor(self, values, dtype=torch.long) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    def _slots(self, reqs: list[Request]) -> torch.Tensor:
        return self._tensor([r.slot for r in reqs])

    def _zeros(self, reqs: list[Request]) -> torch.Tensor:
        return torch.zeros(len(reqs), dtype=torch.long, device=self.device)
