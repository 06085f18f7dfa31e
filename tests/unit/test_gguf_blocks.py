"""GGUF block types de-quantized in torch (model/gguf_blocks.py): bitwise the gguf package's values for random
blocks of every type it decodes, scales of every magnitude included (fp16 subnormals, zero, negative)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from specgram.model import gguf_blocks


def random_blocks(type_name: str, n: int, seed: int) -> np.ndarray:
    """n random blocks of the type as raw bytes [n, bytes]; the fp16 scales random finite values (NaN and inf
    patterns replaced: a file never holds them and NaN != NaN)."""
    rng = np.random.default_rng(seed)
    size = gguf_blocks.SIZES[type_name][1]
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    at = {"Q6_K": [208], "Q4_K": [0, 2], "Q5_K": [0, 2]}.get(type_name, [0])
    for a in at:
        half = raw[:, a : a + 2].copy().view(np.float16)
        bad = ~np.isfinite(half)
        half[bad] = np.float16(0.5)
        raw[:, a : a + 2] = half.view(np.uint8)
    return raw


@pytest.mark.parametrize("type_name", sorted(gguf_blocks.DECODERS))
def test_each_type_is_bitwise_the_packages_values(type_name):
    values, size = gguf_blocks.SIZES[type_name]
    raw = random_blocks(type_name, 3 * 40, seed=len(type_name) + size).reshape(40, 3 * size)  # 40 rows, 3 blocks
    ours = gguf_blocks.decode(type_name, torch.from_numpy(raw.copy()))
    theirs = dequantize(raw, GGMLQuantizationType[type_name])
    assert ours.dtype == torch.float32 and ours.shape == (40, 3 * values)
    assert theirs.shape == tuple(ours.shape)
    # bitwise: the same fp32 bit patterns (zeros of either sign included)
    assert torch.equal(ours.view(torch.int32), torch.from_numpy(theirs.astype(np.float32)).view(torch.int32))


def test_a_type_it_lacks_is_left_to_the_package():
    assert gguf_blocks.decode("IQ2_XS", torch.zeros(1, 74, dtype=torch.uint8)) is None
