"""What goes back out: committing tokens (EOS, grammar end, stop strings, length limits), the streamed text,
and the responses.

Text: each request's output text so far (a stop string and what follows it cut off), of which `sent`
characters went out; text that may still turn into a stop string is held back until it cannot.

min_tokens: a stop string counts only when a token at output position >= min_tokens completes it (EOS is
never chosen below min_tokens: min_tokens.py). One completed earlier is ordinary text and is streamed as such;
a stop string completed later is cut even where it began in the text of the first min_tokens tokens, and that
part was never streamed (it was held back as a possible stop string), so streamed text is never taken back.
"""

from __future__ import annotations

from ..request import Request, RequestOutput, TokenLogprob
from .detokenize import IncrementalDetokenizer
from .stopping import find_stop, holdback


class _TextState:
    __slots__ = ("detok", "text", "sent")

    def __init__(self, detok: IncrementalDetokenizer):
        self.detok, self.text, self.sent = detok, "", 0

    def take(self, end: int) -> str:
        """The text in [sent, end) (empty if already sent); marks it sent."""
        delta = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return delta


class Outputs:
    def __init__(self, tokenizer, eos_ids: set[int], max_seq_len: int):
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.max_seq_len = max_seq_len
        self._text: dict[int, _TextState] = {}

    def start(self, req: Request) -> None:
        self._text[req.request_id] = _TextState(IncrementalDetokenizer(self.tokenizer, req.prompt_ids))

    def commit(
        self, req: Request, tokens: list[int], logprobs: list[list[TokenLogprob]] | None = None
    ) -> RequestOutput:
        """Append committed tokens until one finishes the request (its finish_reason set); -> this step's
        response (a final one when the request finished). logprobs: per token (logprobs.py), when asked."""
        state = self._text[req.request_id]
        stops = req.params.stop
        new: list[int] = []
        stopped_by_string = False
        for t in tokens:
            req.output_ids.append(t)
            new.append(t)
            if req.guide is not None:
                req.guide.commit(t)  # must succeed: t was chosen under this position's mask
            if (
                (t in self.eos_ids and not req.params.ignore_eos)
                or t in req.params.stop_token_ids
                or (req.guide is not None and req.guide.terminated)
            ):
                req.finish_reason = "stop"  # EOS, a stop token, or the grammar is complete (its stop token accepted)
                break
            piece = state.detok.push(t)
            state.text += piece
            may_stop = piece and len(req.output_ids) > req.params.min_tokens  # t's position >= min_tokens
            cut = find_stop(state.text, stops, len(state.text) - len(piece)) if may_stop else -1
            if cut >= 0:
                state.text = state.text[:cut]
                req.finish_reason = "stop"
                stopped_by_string = True
                break
            if len(req.output_ids) >= req.params.max_tokens or req.num_tokens >= self.max_seq_len:
                req.finish_reason = "length"
                break
        if logprobs is not None:
            logprobs = logprobs[: len(new)]
            req.cumulative_logprob += sum(row[0].logprob for row in logprobs)
        if req.finished:
            if not stopped_by_string:
                state.text += state.detok.flush()  # a character still held back at the very end
            return self.final(req, new, state.take(len(state.text)), logprobs=logprobs)
        return self._output(req, new, state.take(len(state.text) - holdback(state.text, stops)), logprobs)

    def unsent(self, req: Request) -> str:
        """The text of a started request that has not gone out yet (held back as a possible stop string, or an
        incomplete character): what a request ended from outside, e.g. by a timeout, still owes its client."""
        state = self._text.get(req.request_id)
        if state is None:
            return ""
        state.text += state.detok.flush()
        return state.take(len(state.text))

    def final(
        self,
        req: Request,
        tokens: list[int],
        text: str,
        error: str | None = None,
        error_kind: str | None = None,
        logprobs: list[list[TokenLogprob]] | None = None,
    ) -> RequestOutput:
        """The request's last response (req.finish_reason already set); its text state is dropped."""
        self._text.pop(req.request_id, None)
        out = self._output(req, tokens, text, logprobs)
        out.finished, out.finish_reason, out.error, out.spec = True, req.finish_reason, error, req.spec
        out.queue_s = None if req.admitted is None else req.admitted - req.arrived
        out.error_kind = error_kind or ("internal" if error and req.finish_reason == "error" else None)
        return out

    @staticmethod
    def _output(
        req: Request, tokens: list[int], text: str, logprobs: list[list[TokenLogprob]] | None = None
    ) -> RequestOutput:
        if logprobs is None and req.params.wants_logprobs:
            logprobs = []  # a response without tokens (an ending from outside) has none
        return RequestOutput(
            req.request_id,
            tokens,
            text,
            num_input_tokens=len(req.prompt_ids),
            num_output_tokens=len(req.output_ids),
            num_cached_tokens=req.cached_prompt_tokens,
            logprobs=logprobs,
            cumulative_logprob=req.cumulative_logprob,
        )
