"""min_tokens: the first min_tokens tokens are never EOS and never complete a stop string, exactly, with and without
speculation: greedy output equals HF generate's min_new_tokens and is token-identical under every drafter and
batch; sampled output has the exact distribution with EOS renormalised away below min_tokens (chi-square); a
grammar that can only end still ends the output; bad values fail with a message naming min_tokens.

EOS on the tiny random models: `pinned_eos` makes a token the model often picks early the EOS, so that the ban
is exercised at the first token and at drafted positions."""

import json
from itertools import accumulate

import pytest
import torch

from specgram.drafting.proposal import Proposal
from specgram.errors import InvalidRequest
from specgram.request import SamplingParams
from specgram.serving.protocol import parse
from specgram.speculation.drafter import Drafter

from .distributions import chi2_critical, chi2_stat, exact_joint
from .helpers import (
    PROMPTS,
    declare,
    lines_all_accepted,
    pinned_eos,
    reference_model,
    run,
    run_to_end,
    text_of,
    tokens_of,
    vocab4_target_and_draft,
    wrong_and_right,
)

MAX = 30
N = 20  # min_tokens where one value is enough


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return wrong_and_right(tmp_path_factory.mktemp("min-tokens"))


def prompt_ids(engine, text):
    return engine.make_request(SamplingParams(), text=text).prompt_ids


def hf_greedy(engine, text, max_new, eos, min_new=0):
    """The independent reference: HF generate with its own min_new_tokens logits processor."""
    ids = prompt_ids(engine, text)
    out = reference_model(engine).generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def eos(engines):
    """The first greedy token of PROMPTS[0], pinned as EOS in the tests: without min_tokens that request ends at
    once."""
    return tokens_of(run(engines["wrong"], PROMPTS[:1], max_tokens=1)[0])[0]


@pytest.fixture(scope="module")
def edges(engines, eos):
    """(prompt, min_tokens) pairs on both sides of each position h < N where the target's argmax is EOS on the
    greedy path with EOS banned below N (the HF reference): min_tokens h lets EOS end the output at h, and
    min_tokens h + 1 bans it there. An off-by-one in either direction, at any draft or verify row, changes
    one of these outputs."""
    engine = engines["wrong"]
    pairs = []
    for text in PROMPTS:
        ids, out = prompt_ids(engine, text), hf_greedy(engine, text, MAX, eos, N)
        with torch.no_grad():
            logits = reference_model(engine)(torch.tensor([ids + out])).logits[0, len(ids) - 1 : len(ids) - 1 + N]
        pairs += [(text, m) for h in (logits.argmax(-1) == eos).nonzero().flatten().tolist() for m in (h, h + 1)]
    assert sum(m > 2 for _, m in pairs) >= 4, "EOS must be the target's choice at several positions past the first"
    return pairs


def test_eos_is_held_off_until_min_tokens_as_hf_min_new_tokens(engines, eos, edges):
    engine = engines["wrong"]
    texts, mins = [t for t, _ in edges], [m for _, m in edges]
    with pinned_eos(engine, eos):
        free = run(engine, PROMPTS, max_tokens=MAX)
        held = run(engine, PROMPTS + texts, max_tokens=MAX, min_tokens=[N] * len(PROMPTS) + mins)
    assert tokens_of(free[0]) == [eos] and free[0][-1].finish_reason == "stop"
    assert sum(len(tokens_of(o)) < N for o in free) >= 2
    for text, m, o in zip(PROMPTS + texts, [N] * len(PROMPTS) + mins, held, strict=True):
        ids = tokens_of(o)
        assert len(ids) >= m and eos not in ids[:m]
        assert ids == hf_greedy(engine, text, MAX, eos, m)
        assert o[-1].finish_reason == ("stop" if ids[-1] == eos else "length")
    # the edges themselves: min_tokens h ends with EOS at h, min_tokens h + 1 goes on past h
    ends = [len(tokens_of(o)) - 1 if tokens_of(o)[-1] == eos else None for o in held[len(PROMPTS) :]]
    assert [e == m for e, m in zip(ends, mins, strict=True)] == [True, False] * (len(edges) // 2)


def test_with_ignore_eos_eos_is_an_ordinary_token(engines, eos):
    """ignore_eos: EOS neither ends the output nor is banned (as in vLLM, where it is then no stop token)."""
    engine = engines["wrong"]
    with pinned_eos(engine, eos):
        [o] = run(engine, PROMPTS[:1], max_tokens=MAX, min_tokens=N, ignore_eos=True)
    assert tokens_of(o)[0] == eos and len(tokens_of(o)) == MAX


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("drafter", ["ngram", "draft_model", "right"])
def test_speculation_token_identical_with_min_tokens(engines, eos, edges, k, drafter):
    engine = engines["right" if drafter == "right" else "wrong"]
    name = "draft_model" if drafter == "right" else drafter
    with pinned_eos(engine, eos):
        for batch in (edges[-2:-1], edges + [(PROMPTS[1], N)]):  # PROMPTS[1] repeats itself: n-grams find drafts
            texts, mins = [t for t, _ in batch], [m for _, m in batch]
            base = run(engine, texts, max_tokens=MAX, min_tokens=mins)
            spec = run(engine, texts, max_tokens=MAX, min_tokens=mins, num_draft_tokens=k, drafter=name)
            assert [tokens_of(o) for o in spec] == [tokens_of(o) for o in base]
            assert [text_of(o) for o in spec] == [text_of(o) for o in base]
            stats = [o[-1].spec for o in spec]
            assert sum(s.drafted for s in stats) > 0 or (drafter == "ngram" and len(batch) == 1)
            if drafter == "right":  # the draft bans EOS at the same positions as the target: every draft accepted
                assert lines_all_accepted(stats)


def test_mixed_batch_equals_solo_runs(engines, eos, edges):
    engine = engines["wrong"]
    texts = PROMPTS + [t for t, _ in edges]
    mins = [N, 0, 7, MAX] + [m for _, m in edges]
    with pinned_eos(engine, eos):
        solo = [tokens_of(run(engine, [t], max_tokens=MAX, min_tokens=m)[0]) for t, m in zip(texts, mins, strict=True)]
        mixed = run(
            engine,
            texts,
            max_tokens=MAX,
            min_tokens=mins,
            num_draft_tokens=[(0, 1, 3, 8, 2, 5, 7, 4)[i % 8] for i in range(len(texts))],
            drafter=["ngram", "draft_model"] * len(texts),
        )
    assert [tokens_of(o) for o in mixed] == solo
    assert all(eos not in ids[:m] for ids, m in zip(solo, mins, strict=True))


class EosDrafter(Drafter):
    """Proposes EOS at every position: the target must turn each one down below min_tokens."""

    def __init__(self, eos: int):
        self.eos = eos

    def propose(self, reqs, ks, pick, prefixes, hints):
        return [Proposal([self.eos] * k) for k in ks]


def test_drafted_eos_is_rejected_below_min_tokens(engines, eos, edges):
    engine = engines["wrong"]
    declare("eos")
    engine.drafters["eos"] = EosDrafter(eos)
    texts, mins = [t for t, _ in edges], [m for _, m in edges]
    with pinned_eos(engine, eos):
        base = run(engine, texts, max_tokens=MAX, min_tokens=mins)
        spec = run(engine, texts, max_tokens=MAX, min_tokens=mins, num_draft_tokens=4, drafter="eos")
    assert [tokens_of(o) for o in spec] == [tokens_of(o) for o in base]
    assert all(eos not in tokens_of(o)[:m] for o, m in zip(spec, mins, strict=True))


# ---- stop strings ------------------------------------------------------------------------------------------


def counting_stop(full, stop, done_at, min_tokens):
    """-> (text, tokens) the output must have: it ends at the first occurrence of `stop` in the full text whose
    last character came with a token at position >= min_tokens (done_at[j]: text length once token j is in),
    cut at the occurrence's start; without one, the whole reference."""
    for start in range(len(full)):
        end = start + len(stop)
        if full.startswith(stop, start):
            token = next(j for j, n in enumerate(done_at) if n >= end)
            if token >= min_tokens:
                return full[:start], token + 1
    return full, len(done_at)


@pytest.mark.parametrize("k, drafter", [(0, "ngram"), (4, "ngram"), (4, "draft_model")])
def test_stop_string_completed_below_min_tokens_does_not_stop(engines, k, drafter):
    """Every min_tokens 0..MAX against a two-character stop string that occurs at least twice, next to a long
    stop string that never occurs (it must not widen the search back onto an earlier, non-stopping occurrence).
    The streamed deltas add up to the expected text: nothing that the stop string cuts was ever streamed."""
    engine = engines["wrong"]
    text = PROMPTS[0]
    [ref] = run(engine, [text], max_tokens=MAX, ignore_eos=True)
    full = text_of(ref)
    assert len(ref) == MAX, "without speculation every response carries one token"
    done_at = list(accumulate(len(o.text) for o in ref))
    stop = next(
        s
        for s in (full[i : i + 2] for i in range(len(full) - 1))
        if s.isascii() and s.isprintable() and full.count(s) >= 2
    )
    never = "\x01" * 8
    assert never not in full
    mins = list(range(MAX + 1))
    outs = run(
        engine,
        [text] * len(mins),
        max_tokens=MAX,
        ignore_eos=True,
        stop=[stop, never],
        min_tokens=mins,
        num_draft_tokens=k,
        drafter=drafter,
    )
    expected = [counting_stop(full, stop, done_at, m) for m in mins]
    assert [(text_of(o), len(tokens_of(o))) for o in outs] == expected
    assert [o[-1].finish_reason for o in outs] == ["stop" if len(t) < len(full) else "length" for t, _ in expected]
    assert len({t for t, _ in expected}) >= 3, "min_tokens must move the cut past one occurrence to another"


# ---- a grammar ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, 4])
def test_a_grammar_that_can_only_end_still_ends_the_output(engines, k):
    """min_tokens never forces output the grammar forbids: "ab" complete, only EOS (the grammar's stop token)
    is allowed, and the output ends there with finish_reason stop."""
    engine = engines["wrong"]
    outs = run(
        engine,
        PROMPTS,
        max_tokens=12,
        min_tokens=8,
        guide_type="regex",
        guide="ab",
        num_draft_tokens=k,
        drafter="grammar",
    )
    for o in outs:
        ids = tokens_of(o)
        assert text_of(o) == "ab" and len(ids) == 3 and ids[-1] in engine.eos_ids and o[-1].finish_reason == "stop"


@pytest.mark.parametrize("k, drafter", [(0, "ngram"), (4, "ngram"), (4, "draft_model")])
def test_a_grammar_that_may_go_on_goes_on_until_min_tokens(engines, k, drafter):
    engine = engines["wrong"]
    guide = dict(guide_type="regex", guide="[ab]+", num_draft_tokens=k, drafter=drafter)
    free = run(engine, PROMPTS, max_tokens=12, **guide)
    held = run(engine, PROMPTS, max_tokens=12, min_tokens=6, **guide)
    assert any(len(tokens_of(o)) < 6 for o in free), "the grammar's EOS must come early somewhere without min_tokens"
    for o in held:
        ids, out = tokens_of(o), text_of(o)
        assert len(ids) >= 6 and not set(ids[:6]) & engine.eos_ids
        assert out and set(out) <= {"a", "b"}


# ---- sampling: distribution --------------------------------------------------------------------------------

SAMPLE_PARAMS = dict(temperature=0.9, top_p=0.95)
VOCAB_PROMPT = [3, 1, 3, 0, 3, 2, 3, 3, 3]  # every (3, x) occurs: n-gram lookup always has a match
N_SAMPLES = 2000


@pytest.fixture(scope="module")
def vocab4_engine(tmp_path_factory):
    """Vocabulary of 4, flat logits (every token likely), EOS = 2."""
    return vocab4_target_and_draft(tmp_path_factory.mktemp("vocab4"))


@pytest.mark.parametrize("k, drafter", [(0, "ngram"), (3, "ngram"), (3, "draft_model")])
def test_sampling_with_min_tokens_matches_the_renormalised_distribution(vocab4_engine, k, drafter):
    """max_tokens 4, min_tokens 2: the exact distribution bans EOS at positions 0 and 1 (renormalising the
    others) and ends a sequence at EOS after that; plain and speculative sampling must both follow it."""
    engine = vocab4_engine
    [eos] = engine.eos_ids
    unbanned = exact_joint(reference_model(engine), VOCAB_PROMPT, 4, **SAMPLE_PARAMS, eos=eos)
    assert sum(p for s, p in unbanned.items() if eos in s[:2]) > 0.2, "EOS must be likely below min_tokens"
    expected = exact_joint(reference_model(engine), VOCAB_PROMPT, 4, **SAMPLE_PARAMS, eos=eos, min_tokens=2)
    reqs = [
        engine.make_request(
            SamplingParams(max_tokens=4, min_tokens=2, seed=i, num_draft_tokens=k, drafter=drafter, **SAMPLE_PARAMS),
            prompt_ids=VOCAB_PROMPT,
        )
        for i in range(N_SAMPLES)
    ]
    outs = run_to_end(engine, reqs)
    outs = [outs[r.request_id] for r in reqs]
    samples = [tuple(tokens_of(o)) for o in outs]
    assert not any(eos in s[:2] for s in samples)
    assert any(len(s) < 4 for s in samples), "some outputs must end at EOS once it is allowed"
    if k:
        stats = [o[-1].spec for o in outs]
        assert 0 < sum(s.accepted for s in stats) < sum(s.drafted for s in stats)
    stat, df = chi2_stat(samples, expected)
    assert stat < chi2_critical(df), (stat, df)


# ---- validation ----------------------------------------------------------------------------------------------


def test_min_tokens_as_genai_perf_sends_it():
    c = parse({"text_input": "x", "sampling_parameters": json.dumps({"max_tokens": "16", "min_tokens": "16"})})
    assert (c.params.max_tokens, c.params.min_tokens) == (16, 16)
    assert parse({"text_input": "x"}).params.min_tokens == 0


@pytest.mark.parametrize(
    "inputs",
    [
        {"min_tokens": "many"},
        {"min_tokens": 2.5},
        {"min_tokens": True},
    ],
)
def test_min_tokens_type_errors_name_it(inputs):
    with pytest.raises(InvalidRequest, match="min_tokens must be an integer"):
        parse({"text_input": "x", **inputs})


@pytest.mark.parametrize(
    "params",
    [
        dict(min_tokens=-1),
        dict(min_tokens=9, max_tokens=8),
        dict(min_tokens=65),  # default_max_tokens 64 here
    ],
)
def test_min_tokens_out_of_range_fails_the_request(make_engine, params):
    engine = make_engine(default_max_tokens=64)
    with pytest.raises(InvalidRequest, match=r"min_tokens must be an integer in \[0, max_tokens\]"):
        engine.make_request(SamplingParams(**params), text="x")
    bound = params.get("max_tokens", 64)
    assert (
        engine.make_request(
            SamplingParams(min_tokens=bound, max_tokens=params.get("max_tokens")), text="x"
        ).params.min_tokens
        == bound
    )  # the bound is allowed


@pytest.mark.parametrize("k", [0, 3])
def test_stop_token_ids_are_banned_below_min_tokens_under_ignore_eos(engines, k):
    """ignore_eos makes EOS an ordinary token, not a stop token id: those still end the output, and below
    min_tokens they are banned, as vLLM does."""
    engine = engines["wrong"]
    first = tokens_of(run(engine, PROMPTS[:1], max_tokens=1, ignore_eos=True)[0])[0]
    out = run(
        engine,
        PROMPTS[:1],
        max_tokens=MAX,
        min_tokens=6,
        ignore_eos=True,
        stop_token_ids=[[first]],
        num_draft_tokens=k,
        drafter="ngram",
    )[0]
    toks = tokens_of(out)
    assert len(toks) >= 6 and first not in toks[:6]
    assert out[-1].finish_reason == "length" or toks[-1] == first
