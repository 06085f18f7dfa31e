"""Request intake: validate a client's request and tokenize its prompt, before it reaches the step loop.

Called from any thread (the adapter's); everything it reads is set at load time. Raises InvalidRequest with a
message the client can act on (Overloaded when too many guides wait to compile). It tokenizes with a tokenizer
of its own, used under a lock: a fast (Rust) tokenizer must not be used from two threads at once ("Already
borrowed"), and the engine thread decodes with the engine's.
"""

from __future__ import annotations

import copy
import threading

from ..config import EngineConfig
from ..drafting import registry
from ..errors import InvalidRequest
from ..grammar.compiler import GrammarCompiler
from ..request import Request, SamplingParams
from .prompt import prompt_ids as build_prompt_ids


class Intake:
    def __init__(
        self,
        config: EngineConfig,
        drafter: str,
        tokenizer,
        grammar: GrammarCompiler,
        drafters: dict,
        vocab_size: int,
        reasoning_end: str = "",
        adapters: dict[str, int] | None = None,
    ):
        """drafter: a request's drafter when it names none (settings.Settings.drafter); reasoning_end: a thinking
        model's end of reasoning ("": none; settings.reasoning_end_of)."""
        self.reasoning_end = reasoning_end
        self.adapters = adapters or {}  # LoRA adapter name -> index (lora.Adapters.index)
        self.config, self.grammar, self.default_drafter = config, grammar, drafter
        self.tokenizer = copy.deepcopy(tokenizer)
        self._tokenizing = threading.Lock()
        self.drafters, self.vocab_size = drafters, vocab_size  # drafters: name -> Drafter (the engine's own dict)

    def make_request(
        self,
        params: SamplingParams,
        *,
        text: str | None = None,
        messages: list[dict] | None = None,
        chat: bool = False,
        prompt_ids: list[int] | None = None,
        template_kwargs: dict | None = None,
    ) -> Request:
        config = self.config
        if params.num_draft_tokens is None:
            params.num_draft_tokens = (
                config.default_num_draft_tokens_guided
                if params.guide_type is not None
                else config.default_num_draft_tokens
            )
        params.validate(config.default_max_tokens, config.max_draft_len, config.max_stop_chars)
        kind = None
        if params.guide_type is not None:
            kind = self.grammar.check(params.guide_type, params.guide, params.guide_options)
        if params.drafter is None:
            params.drafter = self.default_drafter
        if params.drafter not in self.drafters:
            raise InvalidRequest(
                f"unknown or unconfigured drafter {params.drafter!r}; available: {sorted(self.drafters)}"
            )
        chat_prompt = prompt_ids is None and (chat or messages is not None)  # rendered by the chat template here
        if prompt_ids is None:
            with self._tokenizing:
                prompt_ids = build_prompt_ids(self.tokenizer, text, messages, chat, template_kwargs)
        ids = prompt_ids
        if not ids:
            raise InvalidRequest("the prompt is empty")
        if any(not 0 <= t < self.vocab_size for t in ids):
            raise InvalidRequest(f"prompt token ids must be in [0, {self.vocab_size})")
        limit = config.max_seq_len - 1
        if len(ids) > limit:
            raise InvalidRequest(
                f"the prompt has {len(ids)} tokens; this model accepts at most {limit} "
                f"(max_seq_len {config.max_seq_len} minus one token to generate)"
            )
        params.check_token_ids(self.vocab_size)
        req = Request(prompt_ids=list(ids), params=params, adapter=self._adapter(params.lora_name))
        if params.bad_words:
            with self._tokenizing:
                req.bad_word_ids = bad_word_ids(self.tokenizer, params.bad_words)
        if kind is not None:
            consulted = registry.consulted(params.drafter, params.auto_draft, self.drafters)
            if params.speculates and params.guide and any(registry.DRAFTERS[n].reads_guide for n in consulted):
                with self._tokenizing:
                    req.guide_ids = self.tokenizer.encode(params.guide, add_special_tokens=False)
            if self._reasons(ids, chat_prompt):
                params.guide_options += (
                    ("reasoning_end", self.reasoning_end),
                    ("reasoning_max_chars", params.max_reasoning_chars),
                )
            # compiles off the step loop; last, so that nothing after it can refuse the request
            req.pending_grammar = self.grammar.submit(kind, params.guide, params.guide_options)
        return req

    def _adapter(self, name: str | None) -> int:
        """A request's lora_name -> its adapter's index (-1: none); InvalidRequest where it names none loaded, in
        vllm_backend's words (clients written for it compare them)."""
        if name is None:
            return -1
        if not self.adapters:
            raise InvalidRequest("LoRA feature is not enabled.")
        if name not in self.adapters:
            raise InvalidRequest(f"LoRA {name} is not supported, we currently support {list(self.adapters)}")
        return self.adapters[name]

    def _reasons(self, ids: list[int], chat: bool) -> bool:
        """Whether a guided request's answer comes after reasoning: a thinking model (reasoning_end), a chat prompt,
        and a prompt that does not already close the reasoning (a template told not to think ends the prompt with
        an empty reasoning block)."""
        if not self.reasoning_end or not chat:
            return False
        with self._tokenizing:
            tail = self.tokenizer.decode(ids[-32:])
        return not tail.rstrip().endswith(self.reasoning_end)


def bad_word_ids(tokenizer, words: list[str]) -> list[list[int]]:
    """Each bad word tokenized alone and after a space (how it appears mid-text), as vLLM does; distinct."""
    out: list[list[int]] = []
    for w in words:
        for text in (w.lstrip(), " " + w.lstrip()):
            ids = tokenizer.encode(text, add_special_tokens=False)
            if ids and ids not in out:
                out.append(ids)
    return out
