"""The suffix drafter: its store (bounded, scoped, the likeliest continuation), and output unchanged by it."""

import tracemalloc

import pytest

from specgram.drafting import registry
from specgram.request import AUTO_DRAFT, SamplingParams
from specgram.speculation.suffix_store import BYTES_PER_TOKEN, KEY, SHIFT, SuffixStore
from specgram.wire import FinishReason

from .helpers import run, seeded_samples, tokens_of

A = ("base", None)  # a scope: (adapter, cache_salt)
B = ("base", "tenant-b")


def store(**kw) -> SuffixStore:
    return SuffixStore(kw.pop("max_entries", 100), kw.pop("max_bytes", 1 << 20), **kw)


def test_it_continues_a_context_as_a_stored_output_did():
    s = store()
    s.add(A, [1, 2, 3, 4, 5, 6])
    assert s.lookup(A, [9, 9, 2, 3], 3) == ([4, 5, 6], [1.0, 1.0, 1.0])
    assert s.lookup(A, [9, 9, 2, 3], 8)[0] == [4, 5, 6]  # the output ends there
    assert s.lookup(A, [3, 2], 3) == ([], [])  # no occurrence of the window


def test_the_majority_continuation_wins_and_the_depth_follows_the_counts():
    s = store(min_prob=0.5)
    for tail in ([7, 8, 9], [7, 8, 9], [7, 5, 5]):
        s.add(A, [1, 2, 3, *tail])
    tokens, shares = s.lookup(A, [0, 2, 3], 3)
    # all three continue with 7 (share 1), two of three with 8 (2/3), both of those with 9 (1): 2/3 >= 0.5
    assert tokens == [7, 8, 9] and shares == [1.0, pytest.approx(2 / 3), 1.0]
    strict = store(min_prob=0.7)
    for tail in ([7, 8, 9], [7, 8, 9], [7, 5, 5]):
        strict.add(A, [1, 2, 3, *tail])
    assert strict.lookup(A, [0, 2, 3], 3)[0] == [7]  # 2/3 < 0.7: the draft stops before 8


def test_a_longer_match_outranks_a_more_frequent_shorter_one():
    s = store()
    s.add(A, [5, 6, 2, 3, 40, 41])
    for _ in range(3):
        s.add(A, [8, 9, 2, 3, 50, 51])
    assert s.lookup(A, [5, 6, 2, 3], 2)[0] == [40, 41]
    assert s.lookup(A, [8, 9, 2, 3], 2)[0] == [50, 51]


def test_scopes_never_see_each_other():
    s = store()
    s.add(A, [1, 2, 3, 4])
    assert s.lookup(B, [1, 2, 3], 2) == ([], [])
    assert s.lookup(("lora-1", None), [1, 2, 3], 2) == ([], [])
    assert s.lookup(A, [1, 2, 3], 2)[0] == [4]


def test_entries_and_bytes_are_bounded_least_recently_used_first():
    s = store(max_entries=2)
    s.add(A, [1, 2, 3, 4])
    s.add(A, [5, 6, 7, 8])
    assert s.lookup(A, [1, 2, 3], 1)[0] == [4]  # used: now the most recent
    s.add(A, [9, 10, 11, 12])  # evicts [5, 6, 7, 8], the least recently used
    assert s.lookup(A, [5, 6, 7], 1)[0] == []
    assert s.lookup(A, [1, 2, 3], 1)[0] == [4] and s.lookup(A, [9, 10, 11], 1)[0] == [12]
    small = store(max_bytes=10 * BYTES_PER_TOKEN)
    for i in range(10):
        small.add(A, [100 + i] * 6)
    assert small.bytes <= 10 * BYTES_PER_TOKEN and len(small.entries) == 1
    (kept,) = small.entries
    # the evicted entries' occurrences left the index: the window (x, x) occurs 4 times in the kept entry alone
    assert [o >> SHIFT for w in small.index[A].values() for o in w] == [kept] * 4


def test_eviction_empties_the_index():
    s = store(max_entries=1)
    s.add(A, [1, 2, 3, 4])
    s.add(B, [5, 6, 7, 8])
    assert A not in s.index and list(s.index) == [B]


def test_short_outputs_teach_nothing():
    s = store()
    s.add(A, list(range(KEY)))
    assert not s.entries


def test_bytes_per_token_bounds_the_real_memory():
    """BYTES_PER_TOKEN, what the byte cap counts per stored token, is at least what the store really holds per
    token (its lists, its index), measured over outputs of a realistic vocabulary spread."""
    import random

    rng = random.Random(0)
    s = store(max_entries=10_000, max_bytes=1 << 30)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    n = 0
    for _ in range(200):
        out = [rng.randrange(32000) for _ in range(200)]
        s.add(A, out)
        n += len(out)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert used / n <= BYTES_PER_TOKEN, used / n


def test_every_source_has_a_prior_and_the_registry_answers_the_planner():
    assert set(registry.sources()) == set(registry.priors())
    assert registry.consulted("ngram", False, {"ngram", "suffix"}) == ["ngram"]
    assert registry.consulted("ngram", True, {"ngram", "suffix"}) == ["ngram", "suffix"]
    assert registry.consulted("draft_model", True, {"ngram", "draft_model"}) == ["ngram"]
    assert registry.consulted("draft_model", False, {"ngram", "draft_model"}) == []
    assert registry.consulted("grammar", True, {"ngram", "grammar", "suffix"}) == ["grammar"]
    assert registry.default({"ngram", "grammar"}) == "ngram"
    assert registry.default({"ngram", "draft_model"}) == "draft_model"


PROMPTS = ["the cat sat on the mat. the cat", "one two three four five", "abc abd abe abf", "red green blue red"]


@pytest.fixture
def engine(suffix_store, make_engine):
    return make_engine(max_slots=4)


def by_source(outs, source: str) -> tuple[int, int]:
    """(drafted, accepted) from `source` over the requests' final statistics."""
    pairs = [o[-1].spec.by_source.get(source, (0, 0)) for o in outs]
    return sum(d for d, _ in pairs), sum(a for _, a in pairs)


def test_greedy_output_is_identical_with_suffix_drafts_at_every_draft_length(engine):
    """The store holds each reference output with every fifth token changed: drafts right for a stretch, then
    wrong; the target must turn the wrong ones down at every k, in a batch of four."""
    base = run(engine, PROMPTS, max_tokens=24, cache_salt="reference")
    store, vocab = engine.drafters["suffix"].store, engine.target.vocab_size

    def warm():  # the changed outputs alone (a run's own outputs join the store as it ends)
        store.entries.clear(), store.index.clear()
        store.bytes = 0
        for out in base:
            store.add((-1, "warm"), [(t + 1) % vocab if i % 5 == 4 else t for i, t in enumerate(tokens_of(out))])

    drafted = accepted = 0
    for k in [*range(1, 9), AUTO_DRAFT]:
        warm()
        spec = run(engine, PROMPTS, max_tokens=24, num_draft_tokens=k, drafter="suffix", cache_salt="warm")
        assert [tokens_of(o) for o in spec] == [tokens_of(o) for o in base], k
        d, a = by_source(spec, "suffix")
        drafted, accepted = drafted + d, accepted + a
    assert 0 < accepted < drafted  # drafts were made, some right and some turned down


def test_seeded_sampled_output_is_unchanged_by_suffix_drafts(engine):
    ids = engine.make_request(SamplingParams(), text=PROMPTS[0]).prompt_ids
    base, _ = seeded_samples(engine, ids, 8, 16, temperature=1.0, num_draft_tokens=0)
    # the store now holds those 8 outputs (the unsalted scope): the same seeds draft from them
    spec, stats = seeded_samples(engine, ids, 8, 16, temperature=1.0, num_draft_tokens=4, drafter="suffix")
    assert spec == base
    assert sum(s.by_source.get("suffix", (0, 0))[0] for s in stats) > 0


def test_a_salt_sees_only_its_own_outputs_and_prompts(engine):
    prompt = [PROMPTS[1]]
    first = run(engine, prompt, max_tokens=20, cache_salt="tenant-a")  # stored under tenant-a
    other = run(engine, prompt, max_tokens=20, num_draft_tokens=4, drafter="suffix", cache_salt="tenant-b")
    again = run(engine, prompt, max_tokens=20, num_draft_tokens=4, drafter="suffix", cache_salt="tenant-a")
    assert tokens_of(other[0]) == tokens_of(again[0]) == tokens_of(first[0])
    assert by_source(other, "suffix") == (0, 0)  # tenant-b has no outputs
    assert by_source(again, "suffix")[1] > 0  # tenant-a drafts its own earlier output
    if engine.settings.prefix_cache:  # the prompt's KV: reused within a salt only
        assert other[0][-1].num_cached_tokens == 0 and again[0][-1].num_cached_tokens > 0


def test_auto_requests_weigh_the_suffix_store_beside_lookup(engine):
    base = run(engine, PROMPTS, max_tokens=24)
    auto = run(engine, PROMPTS, max_tokens=24, num_draft_tokens=AUTO_DRAFT, drafter="ngram")
    assert [tokens_of(o) for o in auto] == [tokens_of(o) for o in base]
    assert by_source(auto, "suffix")[1] > 0  # the same prompts' outputs are in the store: its drafts won
    fixed = run(engine, PROMPTS, max_tokens=24, num_draft_tokens=4, drafter="ngram")
    assert by_source(fixed, "suffix") == (0, 0)  # a fixed k drafts with the named drafter alone


def test_only_answers_that_finished_and_outlast_the_key_join_the_store(engine):
    drafter = engine.drafters["suffix"]
    store = drafter.store
    endings = [(FinishReason.CANCELLED, 10), (FinishReason.ERROR, 10), (FinishReason.TIMEOUT, 10)]
    endings += [(FinishReason.STOP, KEY), (FinishReason.LENGTH, 0), (FinishReason.STOP, KEY + 1)]
    endings += [(FinishReason.LENGTH, 10)]
    stored = []
    for reason, n in endings:
        req = engine.make_request(SamplingParams(), text=PROMPTS[0])
        req.output_ids, req.finish_reason = list(range(5, 5 + n)), reason
        before = len(store.entries)
        drafter.release(req)
        stored.append(len(store.entries) - before)
    assert stored == [0, 0, 0, 0, 0, 1, 1]
    before = len(store.entries)
    run(engine, [PROMPTS[1]], max_tokens=1)  # an answer of one token: nothing to draft from
    assert len(store.entries) == before
    run(engine, [PROMPTS[1]], max_tokens=8)
    assert len(store.entries) == before + 1


def test_drafter_suffix_needs_a_store(make_engine):
    from specgram.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="suffix_store_mb"):
        make_engine(drafter="suffix", suffix_store_mb=0)
