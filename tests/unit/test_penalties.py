"""vLLM's logits processors (engine/penalties.py): each does what vLLM's does, checked against a reference written
here over transformers' logits; greedy output is token-identical with speculation on and off with them on (every
verify row sees the drafts before it); sampled output keeps the processed distribution (chi-square) and, coupled,
its seed's tokens."""

import pytest
import torch

from specgram.request import AUTO_DRAFT, SamplingParams

from .distributions import chi2_critical, chi2_stat
from .helpers import (
    PROMPTS,
    cheap_draft_model,
    reference_model,
    run_to_end,
    seeded_samples,
    tokens_of,
    vocab4_target_and_draft,
    wrong_and_right,
)

PROMPT = "abcabc abcabc abc the cat sat"
PENALTIES = {
    "frequency": dict(frequency_penalty=1.5),
    "presence": dict(presence_penalty=2.0),
    "repetition": dict(repetition_penalty=1.8),
    "bias": dict(logit_bias={5: 4.0, 9: -100.0}),
    "all": dict(frequency_penalty=0.4, presence_penalty=0.6, repetition_penalty=1.3, logit_bias={7: 1.5}),
}


def reference_row(logits: list[float], prompt: list[int], history: list[int], p: dict) -> list[float]:
    """The processors as vLLM documents them, one token at a time in plain Python."""
    out = list(logits)
    for t, b in p.get("logit_bias", {}).items():
        out[t] += b
    r = p.get("repetition_penalty", 1.0)
    for t in set(prompt) | set(history):
        out[t] = out[t] / r if out[t] > 0 else out[t] * r
    for t in set(history):
        out[t] -= p.get("frequency_penalty", 0.0) * history.count(t) + p.get("presence_penalty", 0.0)
    return out


def reference_greedy(model, prompt: list[int], n: int, p: dict) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out])).logits[0, -1].float().tolist()
        row = reference_row(logits, prompt, out, p)
        out.append(max(range(len(row)), key=row.__getitem__))
    return out


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return wrong_and_right(tmp_path_factory.mktemp("penalties"))


def greedy(engine, text, **params):
    req = engine.make_request(SamplingParams(max_tokens=24, ignore_eos=True, **params), text=text)
    return tokens_of(run_to_end(engine, [req])[req.request_id]), req


@pytest.mark.parametrize("name", sorted(PENALTIES))
def test_each_processor_matches_the_reference(engines, name):
    engine = engines["wrong"]
    ids, req = greedy(engine, PROMPT, num_draft_tokens=0, **PENALTIES[name])
    assert ids == reference_greedy(reference_model(engine), req.prompt_ids, 24, PENALTIES[name])
    plain, _ = greedy(engine, PROMPT, num_draft_tokens=0)
    assert ids != plain, "the processor must change this output, or the test proves nothing"


@pytest.mark.parametrize("name", sorted(PENALTIES))
@pytest.mark.parametrize(
    "k, drafter, which",
    [
        (2, "ngram", "wrong"),
        (4, "ngram", "wrong"),
        (8, "ngram", "wrong"),
        (AUTO_DRAFT, "ngram", "wrong"),
        (3, "draft_model", "wrong"),
        (4, "draft_model", "right"),
        (AUTO_DRAFT, "draft_model", "right"),
    ],
)
def test_greedy_speculation_is_token_identical_with_processors_on(engines, name, k, drafter, which, monkeypatch):
    engine = engines[which]
    if k == AUTO_DRAFT and drafter == "draft_model":
        cheap_draft_model(monkeypatch, engine)
    base, _ = greedy(engine, PROMPT, num_draft_tokens=0, **PENALTIES[name])
    spec, req = greedy(engine, PROMPT, num_draft_tokens=k, drafter=drafter, **PENALTIES[name])
    assert spec == base
    assert req.spec.drafted > 0 or drafter == "ngram", "penalised outputs repeat little: lookup may find nothing"


def test_lookup_drafts_are_verified_under_processors(engines):
    """Where the output repeats (a bias toward one token that a frequency penalty wears off after some 15
    repeats), n-gram drafts are verified, some accepted, and the switch away from the token falls where each
    verify row's own count puts it."""
    engine = engines["wrong"]
    params = dict(logit_bias={5: 30.0}, frequency_penalty=2.0)
    base, _ = greedy(engine, PROMPT, num_draft_tokens=0, **params)
    assert 10 < base.count(5) < 24 and base[0] == 5, base
    for k in (2, 4, 8):
        spec, req = greedy(engine, PROMPT, num_draft_tokens=k, drafter="ngram", **params)
        assert spec == base and req.spec.accepted > 0


def test_processors_in_a_batch_apply_to_their_own_request_alone(engines):
    engine = engines["wrong"]
    alone = {t: greedy(engine, t, num_draft_tokens=4, **PENALTIES["all"])[0] for t in PROMPTS}
    plain = {t: greedy(engine, t, num_draft_tokens=4)[0] for t in PROMPTS}
    reqs = [
        engine.make_request(
            SamplingParams(max_tokens=24, ignore_eos=True, num_draft_tokens=4, **(PENALTIES["all"] if i % 2 else {})),
            text=t,
        )
        for i, t in enumerate(PROMPTS)
    ]
    outs = run_to_end(engine, reqs)
    for i, (t, r) in enumerate(zip(PROMPTS, reqs, strict=True)):
        assert tokens_of(outs[r.request_id]) == (alone if i % 2 else plain)[t]


def test_bad_words_allowed_ids_and_stop_token_ids(engines):
    engine = engines["wrong"]
    plain, _ = greedy(engine, PROMPT, num_draft_tokens=4)
    word = engine.tokenizer.decode(plain[3:5])
    tok = engine.intake.tokenizer
    banned = [ids for w in (word.lstrip(), " " + word.lstrip()) for ids in [tok.encode(w, add_special_tokens=False)]]
    for k in (0, 4):
        ids, req = greedy(engine, PROMPT, num_draft_tokens=k, bad_words=[word])
        assert req.bad_word_ids == banned
        for seq in banned:
            assert all(ids[i : i + len(seq)] != seq for i in range(len(ids))), (seq, ids)
        allowed = sorted(set(plain[5:]))[:3] or [1, 2]
        ids, _ = greedy(engine, PROMPT, num_draft_tokens=k, allowed_token_ids=allowed)
        assert set(ids) <= set(allowed)
    stop = plain[6]
    first = plain.index(stop)
    req = engine.make_request(SamplingParams(max_tokens=24, num_draft_tokens=4, stop_token_ids=[stop]), text=PROMPT)
    out = run_to_end(engine, [req])[req.request_id]
    assert tokens_of(out) == plain[: first + 1] and out[-1].finish_reason == "stop"
    req = engine.make_request(
        SamplingParams(max_tokens=24, num_draft_tokens=4, stop_token_ids=[stop], min_tokens=first + 2), text=PROMPT
    )
    out = run_to_end(engine, [req])[req.request_id]
    assert stop not in tokens_of(out)[: first + 2], "below min_tokens a stop token is never chosen"


def test_token_ids_outside_the_vocabulary_are_refused(engines):
    from specgram.errors import InvalidRequest

    engine = engines["wrong"]
    vocab = engine.target.vocab_size
    for params in (dict(logit_bias={vocab: 1.0}), dict(stop_token_ids=[-1]), dict(allowed_token_ids=[vocab + 3])):
        with pytest.raises(InvalidRequest, match="outside the vocabulary"):
            engine.make_request(SamplingParams(**params), text="x")
    for params, field in (
        (dict(presence_penalty=3.0), "presence_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(logit_bias={1: 101.0}), "logit_bias"),
        (dict(allowed_token_ids=[]), "allowed_token_ids"),
        (dict(bad_words=[""]), "bad_words"),
    ):
        with pytest.raises(InvalidRequest, match=field):
            engine.make_request(SamplingParams(**params), text="x")


# ---- sampling: the processed distribution ----------------------------------------------------------------

SAMPLED = dict(
    temperature=0.9, frequency_penalty=0.7, presence_penalty=0.3, repetition_penalty=1.3, logit_bias={2: 0.5}
)
PROMPT_IDS = [3, 1, 3, 0, 3, 2, 3, 3, 3]
N_SAMPLES = 3000


def exact_penalised(model, prompt, n_tokens) -> dict[tuple, float]:
    """P(x_1..x_n | prompt) by enumeration, sampling from softmax(reference_row(...) / T)."""
    probs = {(): 1.0}
    for _ in range(n_tokens):
        nxt = {}
        for s, ps in probs.items():
            with torch.no_grad():
                logits = model(torch.tensor([prompt + list(s)])).logits[0, -1].float().tolist()
            row = torch.tensor(reference_row(logits, prompt, list(s), SAMPLED)) / SAMPLED["temperature"]
            for t, pt in enumerate(row.softmax(-1).tolist()):
                nxt[s + (t,)] = ps * pt
        probs = nxt
    return probs


@pytest.fixture(scope="module")
def vocab_engine(tmp_path_factory):
    return vocab4_target_and_draft(tmp_path_factory.mktemp("pen-vocab4"))


def samples(engine, **params):
    return seeded_samples(engine, PROMPT_IDS, N_SAMPLES, 3, **SAMPLED, **params)[0]


def test_sampled_output_has_the_processed_distribution_with_and_without_speculation(vocab_engine, monkeypatch):
    expected = exact_penalised(reference_model(vocab_engine), PROMPT_IDS, 3)
    plain = samples(vocab_engine, num_draft_tokens=0)
    stat, df = chi2_stat(plain, expected)
    assert stat < chi2_critical(df), (stat, df)
    assert samples(vocab_engine, num_draft_tokens=3, drafter="ngram") == plain, "coupled: the seed's tokens"
    monkeypatch.setattr(vocab_engine.logits, "coupled", False)
    rejection = samples(vocab_engine, num_draft_tokens=3, drafter="draft_model")
    stat, df = chi2_stat(rejection, expected)
    assert stat < chi2_critical(df), (stat, df)
