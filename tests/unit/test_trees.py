"""Trees of drafts (speculation/trees.py) through the engine: greedy output is the same with trees on and off,
for every drafter, guided or not, alone and batched; seeded sampled output is the same seed by seed, and its
distribution is the target's (chi-square); the trees really branch and their branches are taken."""

from __future__ import annotations

import json

import pytest

from specgram.drafting.proposal import Branch, Proposal
from specgram.model.tree import walk
from specgram.request import SamplingParams
from specgram.speculation import trees
from specgram.speculation.ngram import alternatives

from .distributions import chi2_critical, chi2_stat, exact_joint
from .helpers import (
    cheap_draft_model,
    reference_model,
    run,
    run_to_end,
    seeded_samples,
    target_and_draft,
    tokens_of,
    vocab4_target_and_draft,
)

PROMPTS = ["the cat sat on the mat. the cat sat on", "abc abc abc abd abc ab", "one two three one two"]
SCHEMA = {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"enum": ["xy", "xz"]}}, "required": ["a"]}


def test_walk_follows_the_target_through_the_tree():
    # root -> 10 -> 11 (the line), root -> 20 -> 21 (a branch), 10 -> 30 (a leaf)
    parents, tokens = [-1, 0, 1, 0, 3, 1], [-1, 10, 11, 20, 21, 30]
    choice = [20, 0, 0, 21, 7, 0]  # the target takes 20, then 21, then 7
    assert walk(parents, tokens, choice) == ([3, 4], 7)
    assert walk(parents, tokens, [10, 11, 5, 0, 0, 0]) == ([1, 2], 5)  # the line, as a plain row
    assert walk(parents, tokens, [10, 30, 0, 0, 0, 9]) == ([1, 5], 9)
    assert walk(parents, tokens, [99, 0, 0, 0, 0, 0]) == ([], 99)


def test_lookup_alternatives_leave_the_chosen_continuation():
    import numpy as np

    ids = np.array([1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2])  # "1 2" was followed by 3, 4 and 5
    found = alternatives(ids, 2, 1, 2, None, [5, 1], 3)
    assert found == [[4, 1], [3, 1]]


def test_parents_of_a_proposal_with_branches():
    p = Proposal([10, 11], sources=["x", "x"], branches=[Branch(0, 20, "alt", 0.3), Branch(3, 21, "branch", 0.2)])
    assert p.parents == [-1, 0, 1, 0, 3]
    assert Proposal([10, 11]).parents is None
    assert p.cut(1).branches == []


@pytest.fixture(autouse=True)
def any_gain(monkeypatch):
    """Trees wherever they raise the expected tokens per second at all (not only past MIN_GAIN), candidates kept
    every step: the tiny random models' branches are unlikely, and these tests need branches to verify."""
    monkeypatch.setattr(trees, "MIN_GAIN", 0.0)
    monkeypatch.setattr(trees, "PROBE_EVERY", 1)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("trees")
    return target_and_draft(root, 128), target_and_draft(root, 128)


def _branched(stats) -> tuple[int, int]:
    """Requests' final statistics -> (speculative steps that verified branch drafts, steps whose accepted path
    took one)."""
    return sum(sum(s.branch_hist[1:]) for s in stats), sum(s.branch_taken for s in stats)


@pytest.mark.parametrize("drafter", ["draft_model", "ngram"])
@pytest.mark.parametrize("guided", [False, True])
def test_greedy_identical_with_trees_on_and_off(engines, monkeypatch, drafter, guided):
    on, off = engines
    off.trees.budget = 0
    for e in engines:
        cheap_draft_model(monkeypatch, e)  # rows and draft forwards cheap: the planner branches where it can
    extra = {"guide_type": "json_schema", "guide": json.dumps(SCHEMA)} if guided else {}
    for prompts in (PROMPTS[:1], PROMPTS):
        params = dict(max_tokens=40, num_draft_tokens=-1, drafter=drafter, **extra)
        with_trees, lines = run(on, prompts, **params), run(off, prompts, **params)
        assert [tokens_of(o) for o in with_trees] == [tokens_of(o) for o in lines]
        assert _branched([o[-1].spec for o in lines]) == (0, 0)
        assert all(o[-1].error is None for o in with_trees)  # every committed token passed its grammar
    assert _branched([o[-1].spec for o in with_trees])[0] > 0, "the trees must branch"


@pytest.fixture(scope="module")
def vocab4(tmp_path_factory):
    return vocab4_target_and_draft(tmp_path_factory.mktemp("vocab4"))


PROMPT4 = [3, 1, 3, 0, 3, 2, 3, 3, 3]
SAMPLE = dict(temperature=0.9, top_p=0.95)
N = 2000


def _sample(engine, **params):
    return seeded_samples(engine, PROMPT4, N, 3, **SAMPLE, **params)


@pytest.mark.parametrize("drafter", ["draft_model", "ngram"])
def test_greedy_identical_where_branches_are_taken(vocab4, monkeypatch, drafter):
    """A vocabulary of 4: the draft's runner-up and further lookup matches are often the target's choice, so the
    accepted paths leave the lines, and the tokens after them read the K and V that keep_path moved."""
    engine = vocab4
    cheap_draft_model(monkeypatch, engine)
    prompts = [PROMPT4, PROMPT4[::-1], [0, 1, 2, 3, 0, 1]]
    reqs = lambda **p: [  # noqa: E731
        engine.make_request(SamplingParams(max_tokens=20, ignore_eos=True, **p), prompt_ids=q) for q in prompts
    ]
    plain = run_to_end(engine, base := reqs())
    on = run_to_end(engine, spec := reqs(num_draft_tokens=3, drafter=drafter))
    assert [tokens_of(on[r.request_id]) for r in spec] == [tokens_of(plain[r.request_id]) for r in base]
    verified, taken = _branched([on[r.request_id][-1].spec for r in spec])
    assert verified > 0 and (taken > 0 or drafter == "ngram"), (verified, taken)  # (greedy lookup: the line holds)


@pytest.mark.parametrize("drafter", ["draft_model", "ngram"])
def test_seeded_output_is_the_same_across_tree_shapes_and_has_the_target_distribution(vocab4, monkeypatch, drafter):
    engine = vocab4
    cheap_draft_model(monkeypatch, engine)
    plain, _ = _sample(engine)
    spec, outs = _sample(engine, num_draft_tokens=2, drafter=drafter)
    verified, taken = _branched(outs)
    assert verified > 0 and taken > 0, (verified, taken)
    assert spec == plain, "the sampled tokens are a function of the seed alone, whatever the tree"
    monkeypatch.setattr(engine.trees, "budget", 1)  # another tree shape: one branch at most
    assert _sample(engine, num_draft_tokens=3, drafter=drafter)[0] == plain
    expected = exact_joint(reference_model(engine), PROMPT4, 3, **SAMPLE)
    stat, df = chi2_stat(spec, expected)
    assert stat < chi2_critical(df), (stat, df)


def test_tree_statistics_of_a_step_cut_short():
    from types import SimpleNamespace

    from specgram.spec_stats import SpecStats
    from specgram.speculation.rows import VerifyRow

    # a line of 2 and 2 branch nodes (rows 3, 4: 0 -> 3 -> 4); the path took the branch, and an accepted draft
    # ended the output after its first token: only one draft counts
    prop = Proposal(
        [10, 11], sources=["draft_model"] * 2, branches=[Branch(0, 20, "alt", 0.3), Branch(3, 21, "branch", 0.2)]
    )
    v = VerifyRow(SimpleNamespace(spec=SpecStats()), proposal=prop, accepted=2, token=5, path=[3, 4])
    v.record(1)
    s = v.req.spec
    assert (s.drafted, s.accepted, s.branch_hist, s.depth_hist, s.branch_taken) == (1, 1, [0, 0, 1], [0, 0, 1], 1)
    assert s.by_source == {"alt": [1, 1]}
