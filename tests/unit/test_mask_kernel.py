"""The native mask kernel (kernels/mask.c) against xgrammar's own CPU kernel: the same logits, bit for bit, for
any vocabulary width, mask width and choice of rows; and StepMasks.apply takes it where it is given the library."""

import pytest
import torch
import xgrammar

from specgram.grammar.guide import bitmask_width
from specgram.grammar.masks import StepMasks, apply_native


def random_masks(rows: int, words: int, gen: torch.Generator) -> torch.Tensor:
    """int32 [rows, words]: random bits, with whole words of zeros and of ones among them (the kernel's shortcuts)."""
    m = torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, generator=gen)
    pick = torch.randint(0, 3, (rows, words), generator=gen)
    m[pick == 1] = 0
    m[pick == 2] = -1
    return m


@pytest.mark.parametrize("V, W", [(1, 1), (31, 1), (32, 1), (33, 2), (1000, 32), (151936, 4748), (70, 2), (40, 3)])
def test_native_mask_equals_xgrammar(lib, V, W):
    """V logits columns, masks of W words (W * 32 may be below V: the columns past it keep their values, or above:
    the bits past V are not read); rows masked out of order, from mask rows in another order."""
    gen = torch.Generator().manual_seed(V * 7 + W)
    logits = torch.randn(6, V, generator=gen)
    buf = random_masks(5, W, gen)
    rows, src = [4, 0, 2], [1, 3, 0]
    want = logits.clone()
    staged = torch.full((5, W), -1, dtype=torch.int32)
    staged[rows] = buf[src]
    xgrammar.apply_token_bitmask_inplace(want, staged, indices=rows)
    got = logits.clone()
    apply_native(lib, got, buf, rows, src)
    assert torch.equal(got, want)
    assert torch.equal(got[[1, 3, 5]], logits[[1, 3, 5]])  # rows not listed are untouched
    if V >= 32:  # whole words of zeros among the rows' masks: something was masked
        assert bool(torch.isinf(got[rows]).any())


def test_step_masks_apply_through_the_native_kernel(lib, monkeypatch):
    """With the library, StepMasks.apply on CPU float32 logits never calls xgrammar's kernel, and masks what
    xgrammar would."""
    V = 3000
    gen = torch.Generator().manual_seed(5)
    plain = StepMasks(V, 2, 3, torch.device("cpu"))
    native = StepMasks(V, 2, 3, torch.device("cpu"), lib=lib)
    masks = random_masks(plain.buf.shape[0], bitmask_width(V), gen)
    plain.buf.copy_(masks)
    native.buf.copy_(masks)
    logits = torch.randn(5, V, generator=gen)
    entries = [(0, 1, 2), (3, 0, 0), (4, 1, 0)]  # (logits row, slot, position)
    want = logits.clone()
    plain.apply(want, entries)

    def refuse(*a, **kw):
        raise AssertionError("xgrammar's kernel called where the native one applies")

    monkeypatch.setattr(xgrammar, "apply_token_bitmask_inplace", refuse)
    got = logits.clone()
    native.apply(got, entries)
    assert torch.equal(got, want)
    assert not torch.equal(got, logits)
