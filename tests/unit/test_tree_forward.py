"""Tree rows in the target forward (model/tree.py): each node of a verify row that is a tree of drafts gets, on
the native kernels, bitwise the logits of its own path verified as a plain row (and on the PyTorch forward the
same to float tolerance), and keep_path leaves the accepted path's K and V where the plain row would have put
them - for every family (rotary tables per layer, sliding windows, partial and per-call rotary)."""

from __future__ import annotations

import pytest
import torch

from specgram.model import kernels
from specgram.model import tree as tree_rows
from specgram.model.choice import choose_for
from specgram.model.runner import ModelRunner

from ..conftest import TEST_DEVICE
from .tiny import FAMILY_CONFIGS, build_family

# a root (the last committed token) and 7 drafts: a chain 0-1-2-3, a branch 0-4-5 and a leaf 1-6 off the chain
TOKENS = [5, 11, 12, 13, 21, 22, 31, 41]
PARENTS = [-1, 0, 1, 2, 0, 4, 1, 6]
PROMPT = list(range(40, 60))
NATIVE = kernels.load() is not None
TOL = 1e-4 if TEST_DEVICE == "cpu" else 1e-3  # CUDA: other kernels, other summation orders


def _path(i: int) -> list[int]:
    """Row indices from the root to token i."""
    out = []
    while i >= 0:
        out.append(i)
        i = PARENTS[i]
    return out[::-1]


def test_masks_and_depths():
    assert tree_rows.depths(PARENTS) == [0, 1, 2, 3, 1, 2, 2, 3]
    masks = tree_rows.ancestor_masks(PARENTS)
    assert masks[:4] == [tree_rows.ALL] * 4  # the chain attends causally
    # token 5 (row 5): itself, token 4 (1 back) and the root (5 back); not 1, 2, 3
    assert masks[5] & 0b111111 == 0b100011
    with pytest.raises(ValueError):
        tree_rows.depths([-1, 1])


def _check(runner: ModelRunner, exact: bool) -> None:
    start = len(PROMPT)
    for slot in (0, 1):
        runner.forward_rows([PROMPT], [slot], [0], last_only=True)
    tree = runner.forward_step([TOKENS], [0], [start], 0, trees=[PARENTS])[1][0]  # [8, V]
    for i in range(len(TOKENS)):
        rows = _path(i)
        plain = runner.forward_rows([[TOKENS[r] for r in rows]], [1], [start], last_only=False)[0][-1]
        if exact:
            assert torch.equal(tree[i], plain), i
        else:
            torch.testing.assert_close(tree[i], plain, rtol=TOL, atol=TOL)
    # the path 0-4-5 accepted: its K and V move to start + 1, start + 2 (slot 1 holds the plain row's)
    runner.keep_path(0, start, [4, 5])
    runner.forward_rows([[TOKENS[r] for r in _path(5)]], [1], [start], last_only=False)
    cache = runner.cache
    for name in ("k", "v"):
        t = getattr(cache, name)
        a = t[:, 0, :, :, : start + 3] if name == "k" and cache.k_positions_last else t[:, 0, :, : start + 3]
        b = t[:, 1, :, :, : start + 3] if name == "k" and cache.k_positions_last else t[:, 1, :, : start + 3]
        if exact:
            assert torch.equal(a, b), name
        else:
            torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)


@pytest.mark.skipif(not NATIVE, reason="native kernels need AVX-512 or AVX2 and a C compiler")
@pytest.mark.parametrize("name", sorted(FAMILY_CONFIGS))
def test_native_tree_nodes_equal_their_paths_bitwise(lib, name):
    model = build_family(name, seed=3)
    _check(ModelRunner(model, 2, 64, choose_for(model, linear="native")), exact=True)


@pytest.mark.parametrize("name", ["llama", "gemma3_text", "phi4_mini"])
def test_torch_tree_nodes_equal_their_paths(name):  # scripts/gpu_check.sh: on CUDA
    model = build_family(name, seed=3).to(TEST_DEVICE)
    _check(ModelRunner(model, 2, 64, choose_for(model, linear="torch")), exact=False)


@pytest.mark.skipif(not NATIVE, reason="native kernels need AVX-512 or AVX2 and a C compiler")
def test_bad_tree_mask_is_refused(lib):
    model = build_family("llama", seed=3)
    runner = ModelRunner(model, 2, 64, choose_for(model, linear="native"))
    with pytest.raises(ValueError, match="parent"):
        runner.forward_step([[1, 2]], [0], [0], 0, trees=[[-1, 1]])
