"""A draft model: a second ModelRunner (same slots) proposing k tokens autoregressively.

Per request we track how many committed tokens the draft cache holds (`lens`). Proposing feeds the
tokens it lacks (1–2 after a step; more after steps that drafted otherwise) plus any forced prefix, then
its own drafts one at a time; after verification the valid length is the committed prefix the draft
actually fed. Rows are batched across requests; requests with a smaller k drop out of later draft
iterations. A prompt is read at admission, or (admit(now=False), auto requests among many streams) not at
all: the planner then never drafts for that request with the model.

shares_cache (the runner's, ModelRunner(cache=)): the draft runner reads and writes the target's own KV cache
(the target's int8 copy, engine/loading.py). Then the cache always holds the target's K and V of every
committed token but the last (request.cache_len of them): there is no prompt to read and nothing to catch up,
a proposal feeds the last committed token, the forced prefix and its drafts at positions cache_len and on, and
the target's verify forward, which writes all of its tokens' K and V before any attends, overwrites each of
those positions that it goes on to keep (positions past the committed ones are never read before they are
written again).
"""

from __future__ import annotations

import torch

from ..drafting.proposal import Proposal
from ..model.runner import ModelRunner
from ..request import Request
from ..sample.sampling import one_hot_rows
from .drafter import Drafter, PickFn


def fit_vocab(logits: torch.Tensor, vocab: int, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Draft logits [B, Vd] -> [B, vocab]: extra draft entries dropped, missing ones at -inf (never drafted). ids
    [Vd]: the vocabulary entry of each draft column (a reduced draft vocabulary, draft_vocab.py); the rest -inf."""
    if ids is not None:
        out = logits.new_full((logits.shape[0], vocab), float("-inf"))
        return out.index_copy_(1, ids, logits)
    if logits.shape[-1] >= vocab:
        return logits[:, :vocab]
    pad = logits.new_full((logits.shape[0], vocab - logits.shape[-1]), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


def runner_up(logits: torch.Tensor, ids: torch.Tensor, floor: float) -> list[tuple[int, float] | None]:
    """logits [B, V] as the drafts were picked from them (processed: masked), ids [B] the picks -> per row the
    likeliest other token and the draft's probability of it (softmax), None where that is below floor."""
    top_p, top_i = logits.softmax(-1).topk(2, dim=-1)  # [B, 2]
    out: list[tuple[int, float] | None] = []
    for (p0, p1), (t0, t1), picked in zip(top_p.tolist(), top_i.tolist(), ids.tolist(), strict=True):
        token, p = (t1, p1) if t0 == picked else (t0, p0)
        out.append((token, p) if p >= floor and token != picked else None)
    return out


class DraftModelDrafter(Drafter):
    def __init__(self, runner: ModelRunner, target_vocab: int):
        self.runner = runner
        self.vocab = target_vocab
        self.shares_cache = runner.shares_cache  # its cache is the target's (the only runner it shares)
        self.lens: dict[int, int] = {}  # request id -> committed tokens in the draft cache
        self.fed: dict[int, tuple[int, int]] = {}  # request id -> (committed tokens, draft tokens) in cache now
        self.alternatives = 0.0  # > 0: each draft's runner-up at least this likely is kept (Proposal.alts: trees)

    def _forward(self, rows: list[list[int]], reqs: list[Request], starts: list[int], tails: list[int]) -> torch.Tensor:
        """The draft logits at the last tails[b] tokens of each row b (one forward), one row after another:
        [sum(tails), V]."""
        adapters = [r.adapter for r in reqs]  # a runner with LoRA attached drafts under each request's adapter
        slots = [r.slot for r in reqs]
        if all(t == 1 for t in tails):
            logits = self.runner.forward_rows(rows, slots, starts, True, adapters=adapters)
        else:  # [B, T, V] at every token, each row's last tails[b]
            every = self.runner.forward_rows(rows, slots, starts, False, adapters=adapters)
            logits = torch.cat(
                [every[b, len(row) - t : len(row)] for b, (row, t) in enumerate(zip(rows, tails, strict=True))]
            )
        return fit_vocab(logits, self.vocab, self.runner.head_ids)

    def admit(self, reqs: list[Request], now: bool = True) -> None:
        """The requests' prompts go into the draft cache now, in one forward; now=False (native runners only,
        whose rows are packed, never padded to the longest): not now (the planner passes it for auto requests
        admitted where no draft could pay, and then never drafts for them with the model)."""
        if self.shares_cache:
            return  # the target's prefill wrote the prompt's K and V
        if not now and self.runner.native is not None:
            for r in reqs:
                self.lens[r.request_id] = 0
            return
        self._forward([r.prompt_ids for r in reqs], reqs, [0] * len(reqs), [1] * len(reqs))
        for r in reqs:
            self.lens[r.request_id] = len(r.prompt_ids)

    @property
    def reads_prompts(self) -> bool:
        """Whether admit() costs a forward (a cache of its own), which the planner may decide against."""
        return not self.shares_cache

    def _held(self, req: Request) -> int:
        """Committed tokens whose K and V the draft cache holds."""
        return req.cache_len if self.shares_cache else self.lens.get(req.request_id, 0)

    def started(self, req: Request) -> bool:
        """Whether the draft cache holds any of req's tokens (its prompt went in at admission or since)."""
        return self._held(req) > 0

    def propose(
        self,
        reqs: list[Request],
        ks: list[int],
        pick: PickFn,
        prefixes: list[list[int]],
        hints: list[list[int]],
    ) -> list[Proposal]:
        """hints[i]: a lookup's drafts for reqs[i] (after its prefix), which the first forward checks (_checkable)."""
        out = [Proposal(list(p)) for p in prefixes]
        active = [i for i, k in enumerate(ks) if k > len(prefixes[i])]
        probs: dict[int, list[torch.Tensor]] = {i: [] for i in active}
        checked = {i: self._checkable(reqs[i], ks[i], prefixes[i], hints[i] if hints else []) for i in active}
        # first forward: the committed tokens the draft cache lacks (>= 1: the last one) + the forced prefix + the
        # hint it checks
        starts = [self._held(reqs[i]) for i in active]
        rows = [reqs[i].all_ids[s:] + prefixes[i] + checked[i] for i, s in zip(active, starts, strict=True)]
        tails = [1 + len(checked[i]) for i in active]
        while active:
            group = [reqs[i] for i in active]
            logits = self._forward(rows, group, starts, tails)
            owners = [j for j, t in enumerate(tails) for _ in range(t)]  # each logits row's request (in group)
            offsets = [len(out[active[j]].tokens) + n for j, t in enumerate(tails) for n in range(t)]
            ids, p = pick(logits, [group[j] for j in owners], offsets)
            alts = runner_up(logits, ids, self.alternatives) if self.alternatives else None
            ended, row = set(), 0
            for j, i in enumerate(active):
                r, hint = reqs[i], checked[i][: tails[j] - 1]  # after the first forward: none
                for n in range(tails[j]):  # the model's picks along the row, up to the first that leaves the hint
                    at = row + n
                    self.fed[r.request_id] = (r.num_tokens, len(out[i].tokens))  # drafts whose KV the cache holds
                    if int(ids[at]) < 0:  # no token to draft here (pick's NO_TOKEN)
                        ended.add(i)
                        break
                    if alts is not None and alts[at] is not None:
                        out[i].alts[len(out[i].tokens)] = alts[at]
                    out[i].tokens.append(int(ids[at]))
                    if p is not None:
                        probs[i].append(p[at])
                    if n >= len(hint) or int(ids[at]) != hint[n]:
                        break
                row += tails[j]
            active = [i for i in active if len(out[i].tokens) < ks[i] and i not in ended]
            rows = [[out[i].tokens[-1]] for i in active]
            starts = [reqs[i].num_tokens + len(out[i].tokens) - 1 for i in active]
            tails = [1] * len(active)
        for i, picked in probs.items():
            n_prefix = len(prefixes[i])
            if picked and len(picked) == len(out[i].tokens) - n_prefix:  # sampled requests need q
                out[i].probs = torch.cat([one_hot_rows(prefixes[i], self.vocab, picked[0].device), torch.stack(picked)])
        return out

    def _checkable(self, req: Request, k: int, prefix: list[int], hint: list[int]) -> list[int]:
        """Of a lookup's drafts for req, those the first forward checks: the model's pick at each of their
        positions comes from the same forward, and drafting keeps them as far as the picks agree (the very drafts
        the model would make one forward at a time, for one forward). Unguided requests only (a guided pick
        needs the grammar's mask after each draft), and only where the model has read the committed tokens
        but the last two (a catch-up's logits are not needed at every token)."""
        if not hint or req.guide is not None or self.behind(req) > 2:
            return []
        return hint[: max(k - len(prefix) - 1, 0)]

    def behind(self, req: Request) -> int:
        """Committed tokens the draft cache lacks: what the next proposal feeds before drafting."""
        return req.num_tokens - self._held(req)

    def committed(self, req: Request, accepted: int) -> None:
        fed = self.fed.pop(req.request_id, None)
        if fed is not None and not self.shares_cache:
            n, drafts_fed = fed
            self.lens[req.request_id] = n + min(accepted, drafts_fed)

    def release(self, req: Request) -> None:
        self.lens.pop(req.request_id, None)
        self.fed.pop(req.request_id, None)
