"""The cases every native product's tests run (fp32, bf16, int8 weights; int16 / int8 activations): one table of
weight shapes and one check of batch invariance, so that a new product gets the same coverage."""

from __future__ import annotations

import torch

# (N outputs, K inputs, bias): whole and partial 32-output blocks, K of 1, 3 and 5 (shorter than a vector) and
# odd ones (a k4 step's remainder), a SmolLM2-sized projection, a long N
LINEAR_SHAPES = [
    (64, 64, False),
    (100, 70, True),
    (576, 1536, False),
    (1000, 96, True),
    (1000, 97, True),
    (31, 5, True),
    (40, 1, False),
    (33, 3, True),
]
PREFILL_ROWS = 130  # 17 tiles of 8 rows: the prefill-sized (dynamic) schedule
ROW_COUNTS = (*range(2, 26), 29, 36, 40, 41, 64, 129)  # every tile height (12 / 8 / 3 rows) and split of both


def assert_batch_invariant(product, x: torch.Tensor) -> torch.Tensor:
    """product(x[rows]) is bitwise the same rows of product(x) for one row alone, every leading and trailing
    block of ROW_COUNTS rows, and for 1 and 3 threads; -> product(x) (x: PREFILL_ROWS rows)."""
    full = product(x)
    for i in range(41):
        assert torch.equal(product(x[i : i + 1])[0], full[i]), i
    for m in ROW_COUNTS:
        assert torch.equal(product(x[:m]), full[:m]), m
        assert torch.equal(product(x[len(x) - m :]), full[len(x) - m :]), m
    threads = torch.get_num_threads()
    try:
        for nt in (1, 3):  # other deals of the blocks to threads
            torch.set_num_threads(nt)
            assert torch.equal(product(x), full) and torch.equal(product(x[:5]), full[:5]), nt
    finally:
        torch.set_num_threads(threads)
    return full


def outlier_rows(m: int, k: int, seed: int) -> torch.Tensor:
    """[m, k] rows of very different magnitudes, row 3 all zeros, one row with a single large outlier: inputs for
    products that quantize each row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 2, m)[torch.randperm(m, generator=g)][:, None]
    x[3] = 0
    x[5, k // 2] = 1e3
    return x


def vnni_builds() -> list:
    """Every ISA's kernel library that builds here and whose VNNI this CPU has."""
    from specgram.model import kernels

    libs = []
    for isa in kernels.ISAS:
        try:
            lib = kernels.load_isa(isa)
        except kernels.KernelsUnavailable:
            continue
        if kernels.has_vnni(lib):
            libs.append(lib)
    return libs
