"""Prompt-prefix reuse (prefix_cache.py): which slot and how many tokens, the KV copy, and that greedy output
with reuse is token-identical to output without it, alone, concurrent and speculative."""

import pytest
import torch

from specgram.engine.prefix_cache import PrefixCache, common_prefix
from specgram.model import kernels
from specgram.model.kv_cache import KVCache
from specgram.request import SamplingParams

from .helpers import run_to_end, tokens_of

SYSTEM = "You are a careful assistant. Answer in one short sentence, and never use the letter q. "
QUESTIONS = ["What is a cat?", "What is a dog?", "What is a cat?", "Name a colour."]


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([7, 8], [7, 8]) == 2


@pytest.mark.parametrize("positions_last", [False, True])
def test_attach_reuses_in_place_or_copies_the_longest_match(positions_last):
    cache = KVCache(2, 4, 1, 16, 4, torch.float32, torch.device("cpu"), k_positions_last=positions_last)
    cache.k.normal_()
    cache.v.normal_()
    pc = PrefixCache(cache)
    pc.prefilled(0, [1, 2, 3, 4, 5, 6], 6)  # slot 0 holds a 6-token prompt
    pc.prefilled(2, [1, 2, 9], 3)  # slot 2 shares 2 tokens with it
    # a free slot whose whole prompt the new one extends is reused in place; else the least recently used
    assert pc.choose_free_slot([1, 2, 9, 9], [1, 2, 3]) == 2
    assert pc.choose_free_slot([1, 2, 8], [0, 2, 3]) == 3  # slot 2 would lose its 3rd token
    assert pc.choose_free_slot([5, 5], [0, 1, 2, 3]) == 3  # never used: last in the free list
    k0, v0 = cache.k[:, 0].clone(), cache.v[:, 0].clone()
    assert pc.attach(3, [1, 2, 3, 4, 7, 7, 7]) == 4  # copied from slot 0
    if positions_last:
        assert torch.equal(cache.k[:, 3, :, :, :4], k0[:, :, :, :4])
    else:
        assert torch.equal(cache.k[:, 3, :, :4], k0[:, :, :4])
    assert torch.equal(cache.v[:, 3, :, :4], v0[:, :, :4])
    assert pc.held[3] == [1, 2, 3, 4]
    # the whole prompt held elsewhere: all but its last token (whose logits give the first output token)
    assert pc.attach(1, [1, 2, 3, 4, 5, 6]) == 5
    # in place: slot 2 already holds [1, 2]; nothing longer elsewhere for this prompt
    assert pc.attach(2, [1, 2, 8]) == 2 and pc.held[2] == [1, 2]


def _outputs(engine, prompts, max_tokens=24, together=False, **params):
    reqs = [engine.make_request(SamplingParams(max_tokens=max_tokens, **params), text=p) for p in prompts]
    if together:
        outs = run_to_end(engine, reqs)
        return [tokens_of(outs[r.request_id]) for r in reqs], reqs
    got = []
    for r in reqs:
        got.append(tokens_of(run_to_end(engine, [r])[r.request_id]))
    return got, reqs


@pytest.mark.skipif(kernels.load() is None, reason="exact reuse (prefix_cache auto) needs the native kernels")
@pytest.mark.parametrize("speculative", [False, True])
def test_greedy_output_with_reuse_equals_output_without(make_engine, speculative):
    params = dict(num_draft_tokens=3, drafter="ngram") if speculative else {}
    prompts = [SYSTEM + q for q in QUESTIONS]
    off = make_engine(max_slots=2, prefix_cache="off", max_prefill_tokens=16)
    on = make_engine(max_slots=2, max_prefill_tokens=16)  # auto: on with the native forward
    assert off.prefix is None and on.prefix is not None
    expected, _ = _outputs(off, prompts, **params)
    alone, reqs = _outputs(on, prompts, **params)
    assert alone == expected
    assert reqs[0].cached_prompt_tokens == 0
    shared = min(common_prefix(reqs[0].prompt_ids, r.prompt_ids) for r in reqs[1:])  # the system prompt
    assert shared > 10 and all(r.cached_prompt_tokens >= shared for r in reqs[1:])
    assert reqs[1].cached_prompt_tokens == common_prefix(reqs[0].prompt_ids, reqs[1].prompt_ids)
    assert reqs[2].cached_prompt_tokens == len(reqs[2].prompt_ids) - 1  # the same prompt again
    together, reqs = _outputs(on, prompts, together=True, **params)  # 4 requests, 2 slots, chunked prefill
    assert together == expected
    assert sum(r.cached_prompt_tokens for r in reqs) > 0


def test_off_where_reuse_would_not_be_exact(make_engine):
    assert make_engine(linear="torch").prefix is None  # auto: PyTorch's matmuls vary with M
    assert make_engine(linear="torch", prefix_cache="on").prefix is not None


def test_bad_setting_is_refused(make_engine):
    from specgram.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="prefix_cache must be one of"):
        make_engine(prefix_cache="sometimes")
