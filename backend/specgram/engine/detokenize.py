"""Incremental, UTF-8-safe detokenization.

Decoding one token at a time breaks multi-byte characters split across tokens and loses the leading space
that some tokenizers attach by context. So decode a short window [prefix_offset, end) and emit only what
it adds over [prefix_offset, read_offset); hold back while the text ends in U+FFFD (an incomplete char).
"""

from __future__ import annotations

_CONTEXT = 5  # prompt tokens of context for the first output tokens


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int]):
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-_CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly empty)."""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return full[len(prefix) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the end of generation)."""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :]
