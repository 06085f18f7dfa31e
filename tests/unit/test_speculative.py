"""Speculative decoding is exact: greedy output is token-identical with speculation on and off, for every
drafter, draft length and batch composition; sampled output has the target's distribution (chi-square)."""

import pytest

from specgram.drafting.proposal import Proposal
from specgram.request import SamplingParams
from specgram.sample import noise, sampling
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
    seeded_samples,
    text_of,
    tokens_of,
    vocab4_target_and_draft,
    wrong_and_right,
)


class OracleDrafter(Drafter):
    """Proposes the known greedy continuation (always right) or, with `wrong`, a token that is never it."""

    name = "oracle"

    def __init__(self, references: dict[tuple, list[int]], vocab: int, wrong: bool = False):
        self.references, self.vocab, self.wrong = references, vocab, wrong

    def propose(self, reqs, ks, pick, prefixes, hints):
        out = []
        for r, k in zip(reqs, ks, strict=True):
            ref = self.references[tuple(r.prompt_ids)][len(r.output_ids) : len(r.output_ids) + k]
            out.append(Proposal([(t + 1) % self.vocab for t in ref] if self.wrong else list(ref)))
        return out


@pytest.fixture(scope="module")
def spec_engine(tmp_path_factory):
    return wrong_and_right(tmp_path_factory.mktemp("spec"))


def with_oracle(engine, prompts, max_tokens, wrong=False, **extra):
    refs = run(engine, prompts, max_tokens=max_tokens, **extra)
    keys = [tuple(engine.make_request(SamplingParams(), text=t).prompt_ids) for t in prompts]
    declare("oracle")
    engine.drafters["oracle"] = OracleDrafter(
        {k: tokens_of(o) for k, o in zip(keys, refs, strict=True)}, engine.target.vocab_size, wrong
    )
    return refs


@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("drafter", ["ngram", "draft_model", "right"])
def test_greedy_identical_batch1_and_batch4(spec_engine, k, drafter):
    engine = spec_engine["right" if drafter == "right" else "wrong"]
    name = "draft_model" if drafter == "right" else drafter
    for prompts in (PROMPTS[:1], PROMPTS):
        base = run(engine, prompts, max_tokens=30)
        spec = run(engine, prompts, max_tokens=30, num_draft_tokens=k, drafter=name)
        assert [tokens_of(o) for o in spec] == [tokens_of(o) for o in base]
        assert [text_of(o) for o in spec] == [text_of(o) for o in base]
        stats = [o[-1].spec for o in spec]
        assert all(0 <= s.accepted <= s.drafted for s in stats)
        assert stats[-1].drafted > 0  # the last prompt always gets drafts (it repeats itself: n-grams too)
        if drafter == "right":  # the target as its own draft: every draft of a line is accepted (a tree's
            # branches are the runner-ups: never its choice)
            assert lines_all_accepted(stats)
            assert len(spec[0]) < len(base[0]), "accepted drafts commit several tokens per step"


def test_mixed_draft_lengths_and_drafters_in_one_batch(spec_engine):
    engine = spec_engine["wrong"]
    prompts = PROMPTS * 2
    base = run(engine, prompts, max_tokens=25)
    spec = run(
        engine, prompts, max_tokens=25, num_draft_tokens=[0, 1, 3, 8, 2, 5, 7, 4], drafter=["ngram", "draft_model"] * 4
    )
    assert [tokens_of(o) for o in spec] == [tokens_of(o) for o in base]


@pytest.mark.parametrize("wrong", [False, True])
def test_always_right_and_always_wrong_drafts(spec_engine, wrong):
    engine = spec_engine["wrong"]
    base = with_oracle(engine, PROMPTS, 30, wrong=wrong)
    spec = run(engine, PROMPTS, max_tokens=30, num_draft_tokens=5, drafter="oracle")
    assert [tokens_of(o) for o in spec] == [tokens_of(o) for o in base]
    stats = [o[-1].spec for o in spec]
    assert all((s.accepted == 0) if wrong else (s.accepted == s.drafted) for s in stats)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 7, 10, 13])
def test_max_tokens_inside_an_accepted_run(spec_engine, max_tokens):
    engine = spec_engine["wrong"]
    with_oracle(engine, PROMPTS, 20)
    base = run(engine, PROMPTS, max_tokens=max_tokens)
    spec = run(engine, PROMPTS, max_tokens=max_tokens, num_draft_tokens=8, drafter="oracle")
    assert [tokens_of(o) for o in spec] == [tokens_of(o) for o in base]
    assert all(len(tokens_of(o)) == max_tokens and o[-1].finish_reason == "length" for o in spec)


def test_eos_inside_a_draft(spec_engine):
    engine = spec_engine["wrong"]
    refs = with_oracle(engine, PROMPTS[:1], 30, ignore_eos=True)
    eos = tokens_of(refs[0])[9]  # pretend this token is EOS: it ends the output mid-draft
    with pinned_eos(engine, eos):
        base = run(engine, PROMPTS[:1], max_tokens=30)
        spec = run(engine, PROMPTS[:1], max_tokens=30, num_draft_tokens=8, drafter="oracle")
    assert tokens_of(spec[0]) == tokens_of(base[0]) and tokens_of(base[0])[-1] == eos
    assert spec[0][-1].finish_reason == "stop" and len(tokens_of(base[0])) <= 10


def test_stop_string_spanning_a_step(spec_engine):
    engine = spec_engine["wrong"]
    refs = with_oracle(engine, PROMPTS[1:2], 30, ignore_eos=True)
    full = text_of(refs[0])
    stop = full[12:16]
    base = run(engine, PROMPTS[1:2], max_tokens=30, ignore_eos=True, stop=[stop])
    for k in (2, 3, 5, 8):
        spec = run(
            engine, PROMPTS[1:2], max_tokens=30, ignore_eos=True, stop=[stop], num_draft_tokens=k, drafter="oracle"
        )
        assert text_of(spec[0]) == text_of(base[0]) == full[: full.index(stop)]
        assert tokens_of(spec[0]) == tokens_of(base[0]) and spec[0][-1].finish_reason == "stop"


def test_near_the_context_limit(spec_engine):
    engine = spec_engine["right"]
    prompt_ids = [3 + (i * 7) % 200 for i in range(90)]  # max_seq_len is 96: room for 6 tokens
    outs = {}
    for k in (0, 3, 8):
        req = engine.make_request(
            SamplingParams(max_tokens=50, ignore_eos=True, num_draft_tokens=k, drafter="draft_model"),
            prompt_ids=prompt_ids,
        )
        outs[k] = run_to_end(engine, [req])[req.request_id]
    assert tokens_of(outs[3]) == tokens_of(outs[0]) == tokens_of(outs[8])
    assert len(tokens_of(outs[0])) == 6 and outs[8][-1].finish_reason == "length"


def test_streaming_responses_carry_several_tokens(spec_engine):
    engine = spec_engine["right"]
    [outs] = run(engine, PROMPTS[:1], max_tokens=30, num_draft_tokens=4, drafter="draft_model", tree_drafts=False)
    assert max(len(o.token_ids) for o in outs) == 5  # (lines: a step commits k + 1 tokens at most)
    s = outs[-1].spec
    assert s.acceptance_rate == 1.0
    assert s.acceptance_length == pytest.approx(s.steps and (s.steps + s.accepted) / s.steps)
    assert sum(s.accepted_hist) == s.steps


# ---- sampling: distribution ----------------------------------------------------------------------------

SAMPLE_PARAMS = dict(temperature=0.9, top_p=0.95)


@pytest.fixture(scope="module")
def tiny_vocab_engine(tmp_path_factory):
    return vocab4_target_and_draft(tmp_path_factory.mktemp("vocab4"))


def sample_outputs(engine, prompt, n, max_tokens, **params):
    return seeded_samples(engine, prompt, n, max_tokens, **SAMPLE_PARAMS, **params)


PROMPT = [3, 1, 3, 0, 3, 2, 3, 3, 3]  # every (3, x) occurs: n-gram lookup always has a match
N_SAMPLES = 3000


@pytest.fixture(scope="module")
def expected(tiny_vocab_engine):
    return exact_joint(reference_model(tiny_vocab_engine), PROMPT, 3, **SAMPLE_PARAMS)


@pytest.fixture(scope="module")
def plain(tiny_vocab_engine, expected):
    """Seeds 0..N_SAMPLES-1 sampled without speculation (the same under either verification rule)."""
    samples, _ = sample_outputs(tiny_vocab_engine, PROMPT, N_SAMPLES, 3)
    stat, df = chi2_stat(samples, expected)
    assert stat < chi2_critical(df), (stat, df)
    return samples


@pytest.mark.parametrize("rule", ["coupled", "rejection"])
@pytest.mark.parametrize("drafter", ["draft_model", "ngram"])
def test_speculative_sampling_matches_target_distribution(
    tiny_vocab_engine, expected, plain, drafter, rule, monkeypatch
):
    engine = tiny_vocab_engine
    monkeypatch.setattr(engine.logits, "coupled", rule == "coupled")
    spec, stats = sample_outputs(engine, PROMPT, N_SAMPLES, 3, num_draft_tokens=3, drafter=drafter)
    drafted = sum(s.drafted for s in stats)
    accepted = sum(s.accepted for s in stats)
    assert drafted > N_SAMPLES // 2 and 0 < accepted < drafted, "the test must exercise accepts and rejections"
    stat, df = chi2_stat(spec, expected)
    assert stat < chi2_critical(df), (stat, df)
    if rule == "coupled":
        assert spec == plain, "coupled verification commits what sampling without speculation does, seed by seed"


def test_chi2_catches_a_broken_rejection_rule(tiny_vocab_engine, expected, monkeypatch):
    """Resampling from p instead of norm(max(p - q, 0)) after a rejection skews the output: the test sees it."""
    engine = tiny_vocab_engine
    monkeypatch.setattr(engine.logits, "coupled", False)
    monkeypatch.setattr(sampling, "residual_distribution", lambda p, q: p)
    spec, _ = sample_outputs(engine, PROMPT, N_SAMPLES, 3, num_draft_tokens=3, drafter="draft_model")
    stat, df = chi2_stat(spec, expected)
    assert stat > chi2_critical(df), (stat, df)


def test_chi2_catches_noise_shared_between_positions(tiny_vocab_engine, expected, monkeypatch):
    """Noise keyed by the seed alone (the same Gumbel draw at every position) correlates a request's tokens:
    the joint distribution is wrong, and the test sees it."""
    engine = tiny_vocab_engine
    row = noise.gumbel_row
    monkeypatch.setattr(noise, "gumbel_row", lambda seed, position, vocab: row(seed, 0, vocab))
    monkeypatch.setattr(engine.logits, "noise", noise.NoiseRows(engine.logits.noise.vocab))  # none cached yet
    samples, _ = sample_outputs(engine, PROMPT, N_SAMPLES, 3)
    stat, df = chi2_stat(samples, expected)
    assert stat > chi2_critical(df), (stat, df)


def test_seeded_speculative_sampling_is_reproducible(tiny_vocab_engine):
    a, _ = sample_outputs(tiny_vocab_engine, PROMPT, 20, 8, num_draft_tokens=3, drafter="draft_model")
    b, _ = sample_outputs(tiny_vocab_engine, PROMPT, 20, 8, num_draft_tokens=3, drafter="draft_model")
    assert a == b and len(set(a)) > 1


@pytest.mark.parametrize("stop_at", [1, 4, 9])
def test_accepted_drafts_after_a_token_that_ends_the_output_do_not_count(spec_engine, stop_at):
    """An oracle drafts 8 right tokens a step; a stop token inside an accepted run ends the output there: the
    drafts after it were never used and count neither as drafted nor as accepted."""
    engine = spec_engine["wrong"]
    refs = with_oracle(engine, PROMPTS[:1], 30, ignore_eos=True)
    stop = tokens_of(refs[0])[stop_at]
    assert stop not in tokens_of(refs[0])[:stop_at]
    out = run(
        engine,
        PROMPTS[:1],
        max_tokens=30,
        num_draft_tokens=8,
        drafter="oracle",
        stop_token_ids=[[stop]],
        ignore_eos=True,
    )[0]
    n, spec = len(tokens_of(out)), out[-1].spec
    assert n == stop_at + 1 and out[-1].finish_reason == "stop"
    # the first token comes from the prompt's logits; then 8 drafts a step: at 9 the stop is the step's bonus token
    assert spec.accepted == spec.drafted == min(n - 1, 8)
