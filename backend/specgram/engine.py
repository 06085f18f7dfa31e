"""The engine: admission, continuous batching and the step. Single-threaded: one thread owns it
(see loop.py); nothing here locks.

Each step:  admit -> prefill (new requests get their first token) -> decode step for the others:
            draft -> verify (one batched target forward) -> accept -> commit -> emit.
A request with k = 0 drafts nothing, and its verify row is a plain decode over [last token]. Guided requests
carry a Guide (grammar.py); masks.py holds the step's bitmask rows, choose.py the token decisions.
"""
from __future__ import annotations

import random
from collections import deque
from pathlib import Path

import torch

from . import choose
from .config import EngineConfig
from .detokenize import IncrementalDetokenizer
from .drafters import DraftModelDrafter, Drafter, GrammarOnlyDrafter, NgramDrafter, Proposal
from .grammar import Guide, GrammarCompiler
from .masks import StepMasks
from .errors import InvalidRequest, ModelLoadError
from .prompt import prompt_ids as build_prompt_ids
from .request import Request, RequestOutput, SamplingParams
from .runner import ModelRunner
from .stopping import find_stop, holdback


def check_same_tokenizer(target_tok, draft_tok, draft_path: str) -> None:
    """Draft tokens are target tokens: the two vocabularies must be identical."""
    if target_tok.get_vocab() != draft_tok.get_vocab():
        raise ModelLoadError(f"the draft model at {draft_path!r} does not share the target's tokenizer "
                             f"(vocabularies differ: {len(draft_tok)} vs {len(target_tok)} tokens); "
                             "a draft must use exactly the target's tokenizer")


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


def _cut(p: Proposal, n: int) -> Proposal:
    """The first n drafts of a proposal (the proposal itself when it is not longer)."""
    if n >= len(p.tokens):
        return p
    return Proposal(p.tokens[:n], None if p.probs is None else p.probs[:n])


class Engine:
    def __init__(self, config: EngineConfig, target: ModelRunner, tokenizer,
                 drafters: dict[str, Drafter] | None = None):
        self.config = config
        self.target = target
        self.tokenizer = tokenizer
        self.device = target.device
        # verify forward before the matchers' seal (see _decode): worth it where forwards run asynchronously
        self.overlap_grammar = self.device.type == "cuda"
        self.eos_ids = self._eos_ids(target, tokenizer)
        self.drafters: dict[str, Drafter] = {"ngram": NgramDrafter(config.ngram_min, config.ngram_max),
                                             "grammar": GrammarOnlyDrafter()}
        self.drafters.update(drafters or {})
        self.grammar = GrammarCompiler(tokenizer, target.vocab_size, sorted(self.eos_ids),
                                       cache_bytes=config.grammar_cache_mb << 20,
                                       timeout_s=config.grammar_compile_timeout_s,
                                       json_strict=bool(config.json_strict),
                                       json_any_whitespace=bool(config.json_any_whitespace))
        self.masks = StepMasks(target.vocab_size, config.max_slots, config.max_draft_len, self.device)
        self.free_slots: list[int] = list(range(config.max_slots))[::-1]
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}
        self._text: dict[int, _TextState] = {}

    @classmethod
    def from_config(cls, config: EngineConfig) -> "Engine":
        path = str(Path(config.checkpoint))
        device = config.torch_device()
        static = config.max_draft_len + 1 if config.cuda_graphs else 0   # widest graphed forward: a verify
        target = ModelRunner.from_pretrained(path, config.max_slots, config.max_seq_len, device, config.torch_dtype(),
                                             static, config.linear)
        tokenizer = load_tokenizer(path)
        drafters: dict[str, Drafter] = {}
        draft = None
        if config.draft_checkpoint:
            check_same_tokenizer(tokenizer, load_tokenizer(config.draft_checkpoint), config.draft_checkpoint)
            draft = ModelRunner.from_pretrained(config.draft_checkpoint, config.max_slots, config.max_seq_len, device,
                                                config.torch_dtype("draft_dtype"), static, config.linear)
        if config.draft_quantization == "int8":
            from .quantize import quantize_dynamic_int8
            base = (draft or target).model
            draft = ModelRunner(quantize_dynamic_int8(base), config.max_slots, config.max_seq_len, static)
        if draft is not None:
            drafters["draft_model"] = DraftModelDrafter(draft, target.vocab_size)
        return cls(config, target, tokenizer, drafters)

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
        if params.num_draft_tokens is None:
            params.num_draft_tokens = self.config.default_num_draft_tokens_guided if params.guide_type is not None \
                else self.config.default_num_draft_tokens
        params.validate(self.config.default_max_tokens, self.config.max_draft_len)
        kind = None
        if params.guide_type is not None:
            kind = self.grammar.check(params.guide_type, params.guide)
        if params.drafter is None:
            params.drafter = self.config.default_drafter
        if params.drafter not in self.drafters:
            raise InvalidRequest(f"unknown or unconfigured drafter {params.drafter!r}; available: {sorted(self.drafters)}")
        ids = prompt_ids if prompt_ids is not None else build_prompt_ids(self.tokenizer, text, messages, chat)
        if not ids:
            raise InvalidRequest("the prompt is empty")
        if any(not 0 <= t < self.target.vocab_size for t in ids):
            raise InvalidRequest(f"prompt token ids must be in [0, {self.target.vocab_size})")
        limit = self.config.max_seq_len - 1
        if len(ids) > limit:
            raise InvalidRequest(f"the prompt has {len(ids)} tokens; this model accepts at most {limit} "
                                 f"(max_seq_len {self.config.max_seq_len} minus one token to generate)")
        req = Request(prompt_ids=list(ids), params=params)
        if kind is not None:
            req.pending_grammar = self.grammar.submit(kind, params.guide)   # compiles off the step loop
        return req

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

    def only_waiting_for_grammars(self) -> bool:
        """Nothing to step but requests whose grammar is compiling (the loop may then sleep briefly)."""
        return not self.running and all(r.pending_grammar is not None for r in self.waiting)

    # ---- the step ---------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        decoding = list(self.running.values())
        admitted, outputs = self._admit()
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

    def _admit(self) -> tuple[list[Request], list[RequestOutput]]:
        """Move waiting requests into free slots, keeping the padded prefill under max_prefill_tokens.
        A request whose grammar is still compiling keeps waiting without holding up the ones behind it;
        one whose grammar failed to compile ends here with its error."""
        batch: list[Request] = []
        failed: list[RequestOutput] = []
        for req in list(self.waiting):
            if req.pending_grammar is not None:     # checked even with no free slot: errors go out at once
                try:
                    compiled = req.pending_grammar.result()
                except InvalidRequest as e:
                    req.finish_reason = "error"
                    failed.append(self._final(req, [], "", str(e), "invalid"))
                    continue
                if compiled is None:
                    continue
                req.guide = Guide(compiled)
                req.pending_grammar = None
            if not self.free_slots:
                continue
            width = max([len(r.prompt_ids) for r in batch] + [len(req.prompt_ids)])
            if batch and width * (len(batch) + 1) > self.config.max_prefill_tokens:
                break
            self.waiting.remove(req)
            req.slot = self.free_slots.pop()
            seed = req.params.seed if req.params.seed is not None else random.getrandbits(63)
            req.generator = torch.Generator().manual_seed(seed)
            self.running[req.request_id] = req
            self._text[req.request_id] = _TextState(IncrementalDetokenizer(self.tokenizer, req.prompt_ids))
            batch.append(req)
        return batch, failed

    def _drafter_of(self, req: Request) -> Drafter:
        return self.drafters[req.params.drafter]

    def _prefill(self, reqs: list[Request]) -> list[RequestOutput]:
        logits = self.target.forward_rows([r.prompt_ids for r in reqs], [r.slot for r in reqs], [0] * len(reqs),
                                          last_only=True)                                              # [B, V]
        for r in reqs:
            r.cache_len = len(r.prompt_ids)
        for name, drafter in self.drafters.items():
            users = [r for r in reqs if r.params.num_draft_tokens > 0 and r.params.drafter == name]
            if users:
                drafter.admit(users)
        index = {r.request_id: b for b, r in enumerate(reqs)}
        first = self._pick_guided(logits, reqs, index, tentative=False)[0].tolist()
        return [self._commit(r, [t]) for r, t in zip(reqs, first)]

    def _decode(self, reqs: list[Request]) -> list[RequestOutput]:
        reqs = [r for r in reqs if not r.finished]          # aborted between admission and now
        proposals = self._draft(reqs)
        if self.overlap_grammar:
            # The verify forward is queued before the grammar work only the masking needs: the matchers check
            # the drafts and fill the bonus rows on the CPU while the GPU computes. Drafts that seal() cuts were
            # verified anyway: causal attention keeps the logits before the cut exact, and the KV written past
            # it lies beyond cache_len (overwritten later).
            logits = self._verify_forward(reqs, proposals)  # [B, 1 + max k, V], not yet masked
            proposals = self._seal(reqs, proposals)
        else:
            # On CPU a forward blocks, so there is nothing to overlap, and verifying a draft that the grammar
            # cuts would cost real work: cut first, then verify only what is left.
            proposals = self._seal(reqs, proposals)
            logits = self._verify_forward(reqs, proposals)
        self._mask_verify(reqs, proposals, logits)
        accepted = self._accept(reqs, proposals, logits)
        return [self._commit(r, toks) for r, toks in zip(reqs, accepted)]

    def draft_len(self, req: Request) -> int:
        """This step's k: the request's num_draft_tokens, cut so that the k + 1 tokens a verify step may commit
        fit in max_tokens and in the context (k = 0 near the end costs nothing)."""
        k = min(req.params.num_draft_tokens, self.config.max_draft_len,
                req.params.max_tokens - len(req.output_ids) - 1, self.config.max_seq_len - req.num_tokens - 1)
        return max(k, 0)

    def _draft(self, reqs: list[Request]) -> list[Proposal]:
        """Grammar-forced tokens first (free), then each drafter continues the proposals of the requests that
        use it, batched across them; draft logits are masked with the rows the target will use. Proposals are
        cut to this step's k; guided ones stay tentatively accepted in their matchers until _seal()."""
        ks = [self.draft_len(r) for r in reqs]
        index = {r.request_id: b for b, r in enumerate(reqs)}
        prefixes = [self.masks.forced_prefix(b, r.guide, ks[b]) if r.guide else [] for b, r in enumerate(reqs)]
        pick = (lambda logits, group: self._pick_guided(logits, group, index, tentative=True)) \
            if any(r.guide for r in reqs) else choose.pick
        proposals = [Proposal(p) for p in prefixes]
        for name, drafter in self.drafters.items():
            idx = [i for i, r in enumerate(reqs) if ks[i] > len(prefixes[i]) and r.params.drafter == name]
            if idx:
                props = drafter.propose([reqs[i] for i in idx], [ks[i] for i in idx], pick, [prefixes[i] for i in idx])
                for i, prop in zip(idx, props):
                    proposals[i] = prop
        return [_cut(p, ks[b]) for b, p in enumerate(proposals)]

    def _seal(self, reqs: list[Request], proposals: list[Proposal]) -> list[Proposal]:
        """Guided requests: drafts cut at the first one the grammar rejects (n-gram drafts are unmasked), the
        bonus row filled, the matcher rolled back. After this every guided request has its mask rows for
        positions 0..len(proposal)."""
        return [_cut(p, self.masks.seal(b, r.guide, p.tokens)) if r.guide is not None else p
                for b, (r, p) in enumerate(zip(reqs, proposals))]

    def _verify_forward(self, reqs: list[Request], proposals: list[Proposal]) -> torch.Tensor:
        """One batched target forward over [last committed token, d_0 .. d_{k-1}] for every request."""
        return self.target.forward_rows([[r.output_ids[-1], *p.tokens] for r, p in zip(reqs, proposals)],
                                        [r.slot for r in reqs], [r.cache_len for r in reqs], last_only=False)

    def _mask_verify(self, reqs: list[Request], proposals: list[Proposal], logits: torch.Tensor) -> None:
        """Mask the verify logits in place with the same rows the drafts were masked with."""
        width = logits.shape[1]
        entries = [(b * width + i, b, i) for b, r in enumerate(reqs) if r.guide is not None
                   for i in range(1 + len(proposals[b].tokens))]
        self.masks.apply(logits.view(-1, logits.shape[-1]), entries)

    def _accept(self, reqs: list[Request], proposals: list[Proposal], logits: torch.Tensor) -> list[list[int]]:
        """-> per request the tokens to commit: its accepted drafts, then one token from the target."""
        accepted, nxt = choose.accept(reqs, proposals, logits)
        out = []
        for r, p, a, t in zip(reqs, proposals, accepted, nxt):
            r.cache_len += 1 + a          # the fed last token and the accepted drafts now have valid KV
            r.spec.record(len(p.tokens), a)
            self._drafter_of(r).committed(r, a)
            out.append(p.tokens[:a] + [t])
        return out

    def _pick_guided(self, logits: torch.Tensor, reqs: list[Request], index: dict[int, int],
                     tentative: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """choose.pick with each guided request's grammar mask at its current position (row (b, tentative count));
        with `tentative`, the picked token is then accepted tentatively (drafting)."""
        guided = [(j, r) for j, r in enumerate(reqs) if r.guide is not None and not r.guide.terminated]
        for _, r in guided:
            self.masks.fill(index[r.request_id], r.guide)
        self.masks.apply(logits, [(j, index[r.request_id], r.guide.tentative) for j, r in guided])
        ids, probs = choose.pick(logits, reqs)
        if tentative:
            for j, r in guided:
                accepted = r.guide.try_tentative(int(ids[j]))
                assert accepted, "a token drawn under its grammar mask was rejected by the matcher"
        return ids, probs

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
            if req.guide is not None:
                req.guide.commit(t)           # must succeed: t was chosen under this position's mask
            if (t in self.eos_ids and not req.params.ignore_eos) or (req.guide is not None and req.guide.terminated):
                req.finish_reason = "stop"    # EOS, or the grammar is complete (its stop token accepted)
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
            return self._final(req, new, self._take_text(state, len(state.text)))
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

    def _final(self, req: Request, tokens: list[int], text: str, error: str | None = None,
               error_kind: str | None = None) -> RequestOutput:
        """Finish bookkeeping: free the slot (its KV rows are simply overwritten later)."""
        if self.running.pop(req.request_id, None) is not None:
            self.free_slots.append(req.slot)
            self._drafter_of(req).release(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._text.pop(req.request_id, None)
        out = self._output(req, tokens, text)
        out.finished, out.finish_reason, out.error, out.spec = True, req.finish_reason, error, req.spec
        out.error_kind = error_kind or ("internal" if error and req.finish_reason == "error" else None)
        return out
