"""Pure functions: sampling math, stop-string hold-back, UTF-8-safe incremental detokenization."""
import numpy as np
import pytest
import torch

from specgram.engine.detokenize import IncrementalDetokenizer
from specgram.engine.stopping import find_stop, holdback
from specgram.speculation import sampling

from .tiny import build_tokenizer


def test_probabilities_temperature_top_k_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    p = sampling.probabilities(logits, torch.tensor([1.0, 1.0]), torch.tensor([0, 2]), torch.tensor([1.0, 1.0]))
    assert torch.allclose(p[0], logits[0].softmax(-1))
    assert torch.allclose(p[1].sort(descending=True).values, torch.tensor([0.5, 0.5, 0.0, 0.0]))
    p = sampling.probabilities(logits[:1], torch.tensor([1.0]), torch.tensor([0]), torch.tensor([0.7]))
    sm = logits[0].softmax(-1)   # 0.644 + 0.237 >= 0.7 -> nucleus of two tokens
    assert torch.allclose(p[0], torch.cat([sm[:2] / sm[:2].sum(), torch.zeros(2)]))
    p = sampling.probabilities(logits[:1], torch.tensor([0.5]), torch.tensor([0]), torch.tensor([1.0]))
    assert torch.allclose(p[0], (logits[0] / 0.5).softmax(-1))


def test_masked_logits_stay_at_zero_probability():
    logits = torch.tensor([[1.0, float("-inf"), 0.5, float("-inf")]])
    p = sampling.probabilities(logits, torch.tensor([1.3]), torch.tensor([3]), torch.tensor([0.99]))
    assert p[0, 1] == 0 and p[0, 3] == 0 and torch.isclose(p.sum(), torch.tensor(1.0))


def test_inverse_cdf_sampling_matches_distribution():
    """chi-square goodness of fit at 20k draws; the critical value (df=4, p=0.001) is 18.47."""
    probs = torch.tensor([[0.1, 0.4, 0.05, 0.25, 0.2]])
    g = torch.Generator().manual_seed(0)
    n = 20000
    ids = torch.cat([sampling.sample(probs, sampling.draw_uniforms([g])) for _ in range(n)])
    counts = np.bincount(ids.numpy(), minlength=5)
    expected = probs[0].numpy() * n
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 18.47, (counts, chi2)


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
    assert len(ids) > len(text) or text.isascii()   # multi-byte characters did span several tokens
