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


def _cos(rotary, positions: list[int]) -> torch.Tensor:
    return rotary(torch.zeros(1, 1, 1), position_ids=torch.tensor([positions]))[0][0]


def test_a_length_dependent_rotary_keeps_the_frequencies_of_the_servers_longest_sequence():
    """longrope's factor is transformers' choice for a call reaching max_seq_len - 1, for every later call: the
    long one where max_seq_len crosses the original context (32 here), the short one where it does not."""
    from specgram.model import rotary as frozen

    from .tiny import build_family

    fresh = build_family("phi4_long").model.rotary_emb
    long_rows, short_rows = _cos(fresh, list(range(40))), _cos(fresh, list(range(32)))  # by the call's length
    assert not torch.equal(long_rows[:32], short_rows)
    for max_seq_len, want in ((40, long_rows), (32, short_rows)):
        rotary = build_family("phi4_long").model.rotary_emb
        assert frozen.freeze(rotary, max_seq_len)
        for positions in ([3], list(range(10)), [31, 0, 17], list(range(20, max_seq_len))):
            assert torch.equal(_cos(rotary, positions), want[positions]), (max_seq_len, positions)
    plain = build_model().model.rotary_emb
    assert not frozen.freeze(plain, 96) and "forward" not in vars(plain)  # a fixed rotary is left as it is
