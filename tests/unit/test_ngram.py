"""N-gram lookup: which earlier occurrence becomes the draft, with and without the grammar's ranking."""

import json

import numpy as np
import pytest

from specgram.grammar.guide import Guide
from specgram.speculation.ngram import candidates, lookup

from .helpers import target_and_draft


def ids(*xs):
    return np.asarray(xs, dtype=np.int64)


def test_unguided_takes_the_latest_occurrence_of_the_longest_suffix():
    #            0  1  2  3  4  5  6  7  8  9 10
    seq = ids(1, 2, 9, 1, 2, 8, 5, 2, 7, 1, 2)
    assert lookup(seq, 2, 1, 4) == ([8, 5], 5, False)  # (1, 2) last occurs at 3..4, followed by 8 5
    seq = ids(5, 2, 6, 1, 2, 8, 9, 5, 2)
    assert lookup(seq, 3, 1, 4) == ([6, 1, 2], 2, False)  # (5, 2) beats the later single 2 -> 8
    assert lookup(seq, 3, 1, 1) == ([8, 9, 5], 5, False)  # n = 1 only: the latest 2 is at 4
    assert lookup(ids(1, 2, 3), 2, 2, 4) == ([], -1, False)  # no earlier (2, 3)


def test_own_tokens_before_the_extra_corpus_at_equal_length_and_longer_extra_matches_first():
    seq = ids(4, 5, 6, 4, 5)
    extra = ids(4, 5, 7, 3, 4, 5)
    assert lookup(seq, 2, 1, 4, extra) == ([6, 4], 2, False)
    seq = ids(9, 4, 5, 6, 3, 4, 5)
    assert lookup(seq, 2, 1, 4, ids(3, 4, 5, 7, 7)) == ([7, 7], 3, True)  # (3, 4, 5) only in extra


def brute_candidates(seq: list[int], k: int, n_min: int, n_max: int, extra: list[int] | None, limit: int):
    """The lookup's contract written out plainly: for n from the longest down, the latest `limit` earlier
    occurrences of the last n tokens in seq (ending before seq's end), then in extra; non-empty continuations."""
    out = []
    L = len(seq)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        suffix = seq[L - n :]
        for corpus, in_extra, searched in ((seq, False, seq[: L - 1]), (extra, True, extra)):
            if not corpus:
                continue
            starts = [s for s in range(len(searched) - n, -1, -1) if searched[s : s + n] == suffix][:limit]
            out += [(n, corpus[s + n : s + n + k], s + n, in_extra) for s in starts if s + n < len(corpus)]
    return out


@pytest.mark.parametrize("seed", range(40))
def test_candidates_equal_a_plain_search(seed):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(2, 6))  # a small vocabulary: many repeated n-grams
    seq = rng.integers(0, vocab, int(rng.integers(0, 40))).tolist()
    extra = rng.integers(0, vocab, int(rng.integers(0, 12))).tolist() if seed % 3 else None
    k, n_min, n_max, limit = int(rng.integers(1, 6)), int(rng.integers(1, 3)), int(rng.integers(2, 6)), 1 + seed % 4
    got = list(
        candidates(
            np.asarray(seq, dtype=np.int64),
            k,
            n_min,
            n_max,
            None if extra is None else np.asarray(extra, dtype=np.int64),
            limit,
        )
    )
    assert got == brute_candidates(seq, k, n_min, n_max, extra, limit)


def test_grammar_ranking_skips_illegal_continuations_and_prefers_the_longest_legal_one():
    seq = ids(1, 2, 30, 31, 1, 2, 40, 41, 42, 1, 2, 50, 51, 1, 2)
    legal_tokens = {30, 31, 32, 40, 41}
    legal = lambda toks: next((i for i, t in enumerate(toks) if t not in legal_tokens), len(toks))  # noqa: E731
    # latest (1, 2) -> 50 (illegal); then 40 41 42 (2 legal); then 30 31 1 (2 legal, earlier: loses the tie)
    assert lookup(seq, 3, 1, 4, legal=legal) == ([40, 41], 6, False)
    assert lookup(seq, 3, 1, 4) == ([50, 51, 1], 11, False)  # unguided: the latest
    # no legal continuation of (1, 2) -> the shorter suffix (2,) is not tried with n_min 2, is with n_min 1
    seq = ids(2, 32, 7, 1, 2, 50, 1, 2)
    assert lookup(seq, 2, 2, 4, legal=legal) == ([], -1, False)
    assert lookup(seq, 2, 1, 4, legal=legal) == ([32], 1, False)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return target_and_draft(tmp_path_factory.mktemp("ngram"), 256)


def test_a_schema_quoted_in_the_prompt_does_not_hide_the_answers_own_layout(engine):
    """The prompt quotes a schema (`"ok": {"type"`); the answer so far is `{"ok": true, "n": ` . A draft must
    continue with a legal value: the grammar ranking finds it, the latest occurrence alone does not."""
    schema = json.dumps(
        {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}, "n": {"type": "boolean"}},
            "required": ["ok", "n"],
            "additionalProperties": False,
        }
    )
    tok = engine.tokenizer
    prompt = tok.encode('{"ok": true, "n": false} and {"ok": {"type": "boolean"}, "n": {"type": "boolean"}}')
    answer = tok.encode('{"ok": true, "n": ')
    guide = Guide(engine.grammar.compile(engine.grammar.check("json_schema", schema), schema))
    for t in answer:
        guide.commit(t)
    seq = np.asarray(prompt + answer, dtype=np.int64)
    plain, _, _ = lookup(seq, 6, 1, 4)
    assert guide.legal_prefix(plain) == 0  # ' {"type' is not a boolean
    ranked, _, _ = lookup(seq, 6, 1, 4, legal=guide.legal_prefix)
    assert ranked and guide.legal_prefix(ranked) == len(ranked)
    assert tok.decode(ranked).startswith("false")
    assert guide.tentative == 0 and not guide.matcher.is_terminated()  # the matcher is left as it was
