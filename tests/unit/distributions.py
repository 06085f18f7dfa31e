"""Sampling's exact reference: the joint distribution of a model's next tokens by enumeration, and the
chi-square test of sampled sequences against it."""

from __future__ import annotations

import math

import numpy as np
import torch

from specgram.sample import sampling


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.09: p = 0.001)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2_stat(samples, expected_probs):
    """samples: sequences; expected_probs: {sequence: probability} -> (statistic, degrees of freedom), with the
    rarest cells merged until each expects >= 5 samples."""
    n = len(samples)
    counts = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    assert set(counts) <= set(expected_probs), "a sampled sequence has probability 0"
    cells = sorted(expected_probs, key=expected_probs.get, reverse=True)
    obs, exp, o_acc, e_acc = [], [], 0, 0.0
    for c in cells:
        o_acc += counts.get(c, 0)
        e_acc += expected_probs[c] * n
        if e_acc >= 5:
            obs.append(o_acc)
            exp.append(e_acc)
            o_acc, e_acc = 0, 0.0
    if e_acc > 0:
        obs[-1] += o_acc
        exp[-1] += e_acc
    obs, exp = np.array(obs), np.array(exp)
    return float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1


def exact_joint(model, prompt, n_tokens, temperature, top_p=1.0, allowed=None, eos=None, min_tokens=0):
    """P(x_1..x_n | prompt) by enumeration -> {tuple: prob}, for sampling from the processed distribution
    (temperature, top-p) of the logits, restricted to the `allowed` token ids when given (a grammar mask).
    With `eos`: a sequence ends at that token (shorter tuples), which is banned at positions below min_tokens."""
    probs, ended = {(): 1.0}, {}
    for position in range(n_tokens):
        nxt = {}
        seqs = list(probs)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + list(s) for s in seqs])).logits[:, -1].float()
        if allowed is not None:
            mask = torch.full_like(logits, float("-inf"))
            mask[:, allowed] = 0
            logits = logits + mask
        if eos is not None and position < min_tokens:
            logits[:, eos] = float("-inf")
        n = len(seqs)
        p = sampling.probabilities(
            logits, torch.full((n,), temperature), torch.zeros(n, dtype=torch.long), torch.full((n,), top_p)
        )
        for s, row in zip(seqs, p.tolist(), strict=True):
            for t, pt in enumerate(row):
                if pt > 0:
                    (ended if t == eos else nxt)[s + (t,)] = probs[s] * pt
        probs = nxt
    return {**ended, **probs}
