"""Pure functions: sampling math, stop-string hold-back, UTF-8-safe incremental detokenization."""

import numpy as np
import pytest
import torch

from specgram.engine.detokenize import IncrementalDetokenizer
from specgram.engine.stopping import find_stop, holdback
from specgram.sample import noise, sampling

from .tiny import build_tokenizer


def test_probabilities_temperature_top_k_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    p = sampling.probabilities(logits, torch.tensor([1.0, 1.0]), torch.tensor([0, 2]), torch.tensor([1.0, 1.0]))
    assert torch.allclose(p[0], logits[0].softmax(-1))
    assert torch.allclose(p[1].sort(descending=True).values, torch.tensor([0.5, 0.5, 0.0, 0.0]))
    p = sampling.probabilities(logits[:1], torch.tensor([1.0]), torch.tensor([0]), torch.tensor([0.7]))
    sm = logits[0].softmax(-1)  # 0.644 + 0.237 >= 0.7 -> nucleus of two tokens
    assert torch.allclose(p[0], torch.cat([sm[:2] / sm[:2].sum(), torch.zeros(2)]))
    p = sampling.probabilities(logits[:1], torch.tensor([0.5]), torch.tensor([0]), torch.tensor([1.0]))
    assert torch.allclose(p[0], (logits[0] / 0.5).softmax(-1))


def test_masked_logits_stay_at_zero_probability():
    logits = torch.tensor([[1.0, float("-inf"), 0.5, float("-inf")]])
    p = sampling.probabilities(logits, torch.tensor([1.3]), torch.tensor([3]), torch.tensor([0.99]))
    assert p[0, 1] == 0 and p[0, 3] == 0 and torch.isclose(p.sum(), torch.tensor(1.0))


def test_gumbel_max_sampling_matches_distribution():
    """chi-square goodness of fit at 20k (seed, position) rows; the critical value (df=4, p=0.001) is 18.47.
    The masked token (-inf) is never drawn."""
    probs = torch.tensor([0.1, 0.4, 0.05, 0.25, 0.2, 0.0])
    n = 20000
    rows = noise.NoiseRows(len(probs))
    g = rows.get([(seed, position) for seed in range(n // 4) for position in range(4)])
    ids = noise.gumbel_argmax(probs.log().expand(n, -1), None, g)
    counts = np.bincount(ids.numpy(), minlength=6)
    assert counts[5] == 0
    expected = probs[:5].numpy() * n
    chi2 = ((counts[:5] - expected) ** 2 / expected).sum()
    assert chi2 < 18.47, (counts, chi2)


def test_the_support_restricts_the_draw():
    support = torch.tensor([[False, True, True, False]]).expand(200, -1)
    g = noise.NoiseRows(4).get([(s, 0) for s in range(200)])
    ids = noise.gumbel_argmax(torch.zeros(200, 4), support, g)
    assert set(ids.tolist()) == {1, 2}


def test_gumbel_values_are_finite_for_every_word():
    """The extreme words map inside (0, 1): no +inf (a token that would win whatever its probability)."""
    words = np.array([0, 1, 2**12 - 1, 2**63, 2**64 - 2**12, 2**64 - 1], dtype=np.uint64)
    g = noise.gumbel_of_words(words)
    assert np.isfinite(g).all() and g.max() < 37 and g.min() > -4
    assert g[0] == g[1] == g[2] and g[-1] == g[-2]  # the low 12 bits are dropped


@pytest.mark.parametrize("vocab", [49152, 70001])
def test_noise_depends_on_seed_and_position_alone(vocab):
    """The same rows whatever the thread count, the rows beside them, their order or the cache; full 64-bit
    seeds and positions each change the row."""
    keys = [(7, 0), (7, 1), (2**64 - 1, 0), (7 + 2**32, 0)]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = noise.NoiseRows(vocab).get(keys)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(noise.NoiseRows(vocab).get(keys[::-1]), one.flip(0))
    assert torch.equal(noise.NoiseRows(vocab, max_bytes=1).get(keys[1:2])[0], one[1])
    assert torch.isfinite(one).all()
    assert len({tuple(r[:8].tolist()) for r in one}) == len(keys), "seeds 7 and 7 + 2^32 must differ too"


def test_find_stop_across_steps_and_holdback():
    assert find_stop("abc STOP", ["STOP"], search_from=6) == 4
    assert find_stop("abc STO", ["STOP"], search_from=6) == -1
    assert find_stop("xx\n\nyy", ["\n\n", "yy"], search_from=3) == 2
    # only stop strings that end in the new text: "ab" ended before it (a completion below min_tokens, not a
    # stop), and a longer stop string in the list must not widen the search back onto it
    assert find_stop("xxabc", ["ab", "zzzzzz"], search_from=4) == -1
    assert find_stop("xxabcab", ["ab", "zzzzzz"], search_from=6) == 5
    assert holdback("hello ST", ["STOP"]) == 2
    assert holdback("hello S", ["STOP", "Sx"]) == 1
    assert holdback("hello", ["STOP"]) == 0
    assert holdback("ab", ["abc"]) == 2


@pytest.mark.parametrize("text", ["plain ascii text", "ünïcödé ✓ 🚀 日本語", " leading and  double  spaces"])
def test_incremental_detokenizer_never_emits_broken_characters(text):
    tok = build_tokenizer()
    prompt = tok("prompt: ")["input_ids"]
    ids = tok(text)["input_ids"]
    d = IncrementalDetokenizer(tok, prompt)
    pieces = [d.push(t) for t in ids] + [d.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert len(ids) > len(text) or text.isascii()  # multi-byte characters did span several tokens
