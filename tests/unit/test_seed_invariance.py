"""Sampled output depends on the prompt, the settings and the seed alone: a seeded sampled request gives the same
tokens for every draft length (auto included), drafter (n-gram, grammar-forced, draft model, int8 copy), number
of batch companions, prefix-cache and chunked-prefill setting, guided or not. Coupled verification
(sample/noise.py) makes that so; rejection sampling does not, which the last test shows."""

import pytest

from specgram.request import AUTO_DRAFT, SamplingParams

from .helpers import PROMPTS, run_to_end, tokens_of
from .tiny import save_checkpoint

PROMPT = "abcabc the cat sat on the mat; abcabc the cat sat on"
SAMPLED = dict(max_tokens=24, temperature=0.9, top_p=0.95, top_k=60, seed=1234, ignore_eos=True)
GUIDE = dict(guide_type="regex", guide=r"(abc|ab|the |cat |[a-f]x){3,16}")


def companions(n: int) -> list[SamplingParams]:
    """Batch-mates of every kind: greedy and sampled, speculating or not, guided or not, other lengths."""
    kinds = [
        dict(temperature=0.0, num_draft_tokens=4),
        dict(temperature=1.0, seed=77, num_draft_tokens=AUTO_DRAFT),
        dict(temperature=0.7, seed=5, num_draft_tokens=0, **GUIDE),
        dict(temperature=1.2, num_draft_tokens=2),
    ]
    return [SamplingParams(max_tokens=10 + 7 * i, ignore_eos=True, **kinds[i % len(kinds)]) for i in range(n)]


def sampled_ids(engine, guided: bool, company: int = 0, **params) -> tuple[list[int], int]:
    """-> (the seeded request's tokens, how many of its drafts were accepted)."""
    settings = {**SAMPLED, **(GUIDE if guided else {}), **params}
    req = engine.make_request(SamplingParams(**settings), text=PROMPT)
    others = [
        engine.make_request(p, text=PROMPTS[i % len(PROMPTS)] * (1 + i)) for i, p in enumerate(companions(company))
    ]
    # companions first: the request is admitted beside requests already prefilling or decoding
    outs = run_to_end(engine, others[: company // 2] + [req] + others[company // 2 :])
    return tokens_of(outs[req.request_id]), outs[req.request_id][-1].spec.accepted


@pytest.fixture(scope="module")
def engines(make_engine, tmp_path_factory):
    draft = save_checkpoint(tmp_path_factory.mktemp("draft"), seed=11)
    made = {
        "draft_model": make_engine(max_slots=8, draft_checkpoint=str(draft)),
        "int8": make_engine(max_slots=8, draft_quantization="int8"),
        "no_prefix_cache": make_engine(max_slots=8, prefix_cache="off"),
        "chunked": make_engine(max_slots=8, max_prefill_tokens=5),
    }
    yield made
    for e in made.values():
        e.close()


VARIANTS = [  # (engine, company, request settings)
    *[("draft_model", 0, dict(num_draft_tokens=k, drafter="ngram")) for k in (1, 2, 4, 8, AUTO_DRAFT)],
    ("draft_model", 0, dict(num_draft_tokens=4, drafter="grammar")),
    *[("draft_model", 0, dict(num_draft_tokens=k, drafter="draft_model")) for k in (2, 4, AUTO_DRAFT)],
    *[("draft_model", c, dict(num_draft_tokens=4, drafter="ngram")) for c in (3, 7)],
    *[("draft_model", c, dict(num_draft_tokens=AUTO_DRAFT, drafter="draft_model")) for c in (3, 7)],
    ("int8", 0, dict(num_draft_tokens=3, drafter="draft_model")),
    ("int8", 3, dict(num_draft_tokens=AUTO_DRAFT, drafter="draft_model")),
    ("no_prefix_cache", 0, dict(num_draft_tokens=0)),
    ("no_prefix_cache", 3, dict(num_draft_tokens=4, drafter="ngram")),
    ("chunked", 0, dict(num_draft_tokens=0)),
    ("chunked", 7, dict(num_draft_tokens=AUTO_DRAFT, drafter="ngram")),
]


@pytest.mark.parametrize("guided", [False, True], ids=["unguided", "guided"])
def test_a_seeded_request_gives_the_same_tokens_under_every_setting(engines, guided):
    base, _ = sampled_ids(engines["draft_model"], guided, num_draft_tokens=0)
    assert len(base) == SAMPLED["max_tokens"] or guided
    runs = {
        (name, company, str(params)): sampled_ids(engines[name], guided, company, **params)
        for name, company, params in VARIANTS
    }
    differ = [variant for variant, (ids, _) in runs.items() if ids != base]
    assert not differ, f"sampled output changed with: {differ}"
    assert sum(accepted for _, accepted in runs.values()) > 0, "drafts must be accepted, not only cut"
    other_seed, _ = sampled_ids(engines["draft_model"], guided, seed=4321, num_draft_tokens=0)
    assert other_seed != base, "the seed must matter"


def test_drafts_are_accepted_and_an_identical_draft_model_is_always_right(make_engine, tiny_ckpt):
    """Coupled drafting: a draft model drafts with the same noise as the target verifies, so a draft model equal
    to the target has every draft accepted, sampled or not."""
    engine = make_engine(max_slots=8, draft_checkpoint=str(tiny_ckpt))
    try:
        req = engine.make_request(
            SamplingParams(**{**SAMPLED, "num_draft_tokens": 4, "drafter": "draft_model", "tree_drafts": False}),
            text=PROMPT,
        )
        [*_, final] = run_to_end(engine, [req])[req.request_id]
        assert final.spec.drafted > 0 and final.spec.accepted == final.spec.drafted
    finally:
        engine.close()


def test_rejection_sampling_depends_on_the_draft_length(engines, monkeypatch):
    """The classic rule (speculative_sampling rejection) keeps the distribution but not the seed's tokens."""
    engine = engines["draft_model"]
    base, _ = sampled_ids(engine, False, num_draft_tokens=0)
    monkeypatch.setattr(engine.logits, "coupled", False)
    ids = {k: sampled_ids(engine, False, num_draft_tokens=k, drafter="draft_model")[0] for k in (2, 4)}
    assert any(v != base for v in ids.values())
