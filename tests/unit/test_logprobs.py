"""Logprobs (engine/logprobs.py): equal to transformers' log-softmax at each generated position; the same for
every draft length, drafter and batch (bitwise on the native forward); "processed" ones are those of the
distribution the token was chosen from (grammar mask, temperature)."""

import math

import pytest
import torch

from specgram.request import AUTO_DRAFT, SamplingParams

from .helpers import PROMPTS, cheap_draft_model, reference_model, run_to_end, tokens_of, wrong_and_right

PROMPT = "abcabc abcabc abc the cat sat"
TOP = 5


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return wrong_and_right(tmp_path_factory.mktemp("logprobs"))


def generate(engine, text=PROMPT, company=(), **params):
    """-> (tokens, per-token logprob rows, the final output) of one request, optionally beside others."""
    req = engine.make_request(SamplingParams(max_tokens=20, ignore_eos=True, logprobs=TOP, **params), text=text)
    others = [
        engine.make_request(
            SamplingParams(max_tokens=12 + i, num_draft_tokens=3, ignore_eos=True, logprobs=1 if i % 2 else None),
            text=t,
        )
        for i, t in enumerate(company)
    ]
    outs = run_to_end(engine, others + [req])[req.request_id]
    return tokens_of(outs), [row for o in outs for row in o.logprobs], outs[-1]


def as_table(rows):
    return [[(e.token_id, e.logprob, e.rank) for e in row] for row in rows]


def test_logprobs_are_transformers_log_softmax(engines):
    engine = engines["wrong"]
    ids, rows, final = generate(engine, num_draft_tokens=4)
    prompt = engine.make_request(SamplingParams(), text=PROMPT).prompt_ids
    with torch.no_grad():
        logits = reference_model(engine)(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    ref = torch.log_softmax(logits, -1)  # [len(ids), V]
    for i, (t, row) in enumerate(zip(ids, rows, strict=True)):
        assert row[0].token_id == t and row[0].rank == 1, "greedy: the chosen token is the most likely"
        assert abs(row[0].logprob - ref[i, t].item()) < 1e-4
        top_lp, top_ids = ref[i].topk(TOP)
        assert [e.token_id for e in row] == top_ids.tolist(), "the chosen token, then the other top tokens"
        assert all(abs(e.logprob - v) < 1e-4 for e, v in zip(row, top_lp.tolist(), strict=True))
        assert [e.rank for e in row] == list(range(1, TOP + 1))
        assert row[0].decoded == engine.tokenizer.decode([t], skip_special_tokens=True)
    assert final.cumulative_logprob == pytest.approx(sum(r[0].logprob for r in rows), abs=1e-4)


@pytest.mark.parametrize(
    "which, k, drafter",
    [
        ("wrong", 4, "ngram"),
        ("wrong", 8, "ngram"),
        ("wrong", 3, "draft_model"),
        ("right", 4, "draft_model"),
        ("right", AUTO_DRAFT, "draft_model"),
    ],
)
@pytest.mark.parametrize("company", [0, 3])
def test_logprobs_do_not_depend_on_draft_length_drafter_or_batch(engines, which, k, drafter, company, monkeypatch):
    engine = engines[which]
    if k == AUTO_DRAFT:
        cheap_draft_model(monkeypatch, engine)
    base_ids, base_rows, _ = generate(engine, num_draft_tokens=0)
    ids, rows, final = generate(engine, company=PROMPTS[:company], num_draft_tokens=k, drafter=drafter)
    assert ids == base_ids and final.spec.drafted > 0
    if engine.target.linear_kind == "native":  # every row computed alike: bitwise
        assert as_table(rows) == as_table(base_rows)
    else:
        assert [[(t, r) for t, _, r in row] for row in as_table(rows)] == [
            [(t, r) for t, _, r in row] for row in as_table(base_rows)
        ]
        assert all(
            abs(a - b) < 1e-4
            for ra, rb in zip(as_table(rows), as_table(base_rows), strict=True)
            for (_, a, _), (_, b, _) in zip(ra, rb, strict=True)
        )


def test_logprobs_zero_is_the_chosen_token_alone_and_none_asks_nothing(engines):
    engine = engines["wrong"]
    req = engine.make_request(SamplingParams(max_tokens=8, logprobs=0, num_draft_tokens=4), text=PROMPT)
    outs = run_to_end(engine, [req])[req.request_id]
    assert all(len(row) == 1 for o in outs for row in o.logprobs)
    assert sum(len(o.logprobs) for o in outs) == len(tokens_of(outs))
    plain = engine.make_request(SamplingParams(max_tokens=8), text=PROMPT)
    assert all(o.logprobs is None for o in run_to_end(engine, [plain])[plain.request_id])
    cumulative = engine.make_request(SamplingParams(max_tokens=8, cumulative_logprob=True), text=PROMPT)
    outs = run_to_end(engine, [cumulative])[cumulative.request_id]
    assert all(len(row) == 1 for o in outs for row in o.logprobs) and outs[-1].cumulative_logprob < 0


@pytest.fixture(scope="module")
def processed(make_engine):
    engine = make_engine(logprobs_mode="processed")
    yield engine
    engine.close()


def test_processed_logprobs_are_the_masked_distribution(processed):
    guide = dict(guide_type="choice", guide='["abc", "the cat", "xyz"]')
    for k in (0, 4):
        ids, rows, final = generate(processed, num_draft_tokens=k, **guide)
        assert final.finish_reason == "stop"
        assert processed.tokenizer.decode(ids, skip_special_tokens=True) in ("abc", "the cat", "xyz")
        first = rows[0]
        allowed = {processed.intake.tokenizer.encode(c, add_special_tokens=False)[0] for c in ("abc", "the cat", "xyz")}
        assert {e.token_id for e in first} <= allowed, "tokens the grammar forbids are never listed"
        assert sum(math.exp(e.logprob) for e in first) == pytest.approx(1.0, abs=1e-5)
        assert all(row[0].rank == 1 for row in rows), "greedy under the mask: rank 1 of the processed distribution"


def test_processed_logprobs_of_a_sampled_request_divide_by_the_temperature(processed, monkeypatch):
    params = dict(temperature=0.7, seed=3, num_draft_tokens=4)
    ids, rows, _ = generate(processed, **params)
    monkeypatch.setattr(processed.logprobs, "mode", "raw")
    raw_ids, raw_rows, _ = generate(processed, **params)
    assert raw_ids == ids, "the mode changes what is reported, not what is chosen"
    prompt = processed.make_request(SamplingParams(), text=PROMPT).prompt_ids
    with torch.no_grad():
        logits = reference_model(processed)(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    for reported, ref in ((rows, torch.log_softmax(logits / 0.7, -1)), (raw_rows, torch.log_softmax(logits, -1))):
        assert all(
            abs(row[0].logprob - ref[i, t].item()) < 1e-4 for i, (t, row) in enumerate(zip(ids, reported, strict=True))
        )
