"""Rotary cos/sin are a function of the position alone: the same bits whatever other positions share the call and
whatever the thread count, so a token's keys and queries do not depend on its batch (the native forward's
batch invariance rests on it)."""

import torch

from .tiny import build_model


def _rows(rotary, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.zeros(1, len(positions), 8)
    cos, sin = rotary(x, position_ids=torch.tensor([positions]))
    return cos[0], sin[0]  # [N, head_dim]


def test_rotary_rows_depend_on_the_position_alone():
    rotary = build_model(hidden=64).model.rotary_emb
    everything = list(range(2048))
    cos_all, sin_all = _rows(rotary, everything)
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, threads):
            torch.set_num_threads(n_threads)
            for chunk in ([5], [5, 4, 3, 2, 1, 0], everything[100:107], everything[::17], [2047, 0, 1000]):
                cos, sin = _rows(rotary, chunk)
                at = torch.tensor([everything.index(p) for p in chunk])
                assert torch.equal(cos, cos_all[at]) and torch.equal(sin, sin_all[at]), (n_threads, chunk)
    finally:
        torch.set_num_threads(threads)
