"""The GPU path's logic, on CPU where it can run (static forward, bucketing, the graphed engine, mask staging,
host->device copies) and on CUDA where it cannot (no host syncs in a forward, captured graphs): the `gpu`
tests run in scripts/gpu_check.sh."""

import pytest
import torch

from specgram.grammar.masks import StepMasks
from specgram.model import cuda_graphs
from specgram.model.transfer import h2d, long_tensor
from specgram.request import SamplingParams

from ..conftest import TEST_DEVICE
from .helpers import run_to_end, tokens_of

# ---- pure helpers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "b, cap, expected", [(1, 8, 1), (2, 8, 2), (3, 8, 4), (5, 8, 8), (8, 8, 8), (5, 6, 6), (7, 6, 6)]
)
def test_batch_bucket(b, cap, expected):
    assert cuda_graphs.batch_bucket(b, cap) == expected


def test_pad_rows_pads_to_the_bucket_with_scratch_rows():
    tokens, slots, starts, num_new = cuda_graphs.pad_rows([[5, 6, 7], [9]], [3, 1], [10, 4], 4, scratch_slot=8)
    assert tokens.tolist() == [[5, 6, 7], [9, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert slots.tolist() == [3, 1, 8, 8] and starts.tolist() == [10, 4, 0, 0] and num_new.tolist() == [3, 1, 1, 1]


def test_h2d_is_identity_on_cpu():
    t = torch.arange(5)
    assert h2d(t, torch.device("cpu")) is t
    assert long_tensor([1, 2], torch.device("cpu")).tolist() == [1, 2]


# ---- the static forward equals the dynamic one -------------------------------------------------------------


def test_static_forward_matches_dynamic_forward(make_engine):
    """Same rows through forward_rows (eager, exact lengths) and the static path (padded bucket, full-length
    attention): same logits at every real position, same KV afterwards for the real tokens."""
    dyn = make_engine(cuda_graphs=False, max_draft_len=4).target
    sta = make_engine(cuda_graphs=True, max_draft_len=4).target
    assert sta.graphed is not None and sta.cache.k.shape[1] == dyn.cache.k.shape[1] + 1  # + scratch slot
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (7, 12, 3)]
    slots = [2, 0, 3]
    for r in (dyn, sta):  # prefills (wider than the static width: eager in both)
        r.forward_rows(prompts, slots, [0, 0, 0], last_only=True)
    rows = [[11, 12, 13, 14, 15], [21], [31, 32]]  # ragged verify-like rows, B=3 -> bucket 4
    starts = [len(p) for p in prompts]
    a = dyn.forward_rows(rows, slots, starts, last_only=False)
    b = sta.forward_rows(rows, slots, starts, last_only=False)
    for i, row in enumerate(rows):
        torch.testing.assert_close(b[i, : len(row)], a[i, : len(row)], rtol=1e-4, atol=1e-4)
    ends = [s + len(r) for s, r in zip(starts, rows, strict=True)]
    la = dyn.forward_rows([[7], [8], [9]], slots, ends, last_only=True)
    lb = sta.forward_rows([[7], [8], [9]], slots, ends, last_only=True)
    torch.testing.assert_close(lb, la, rtol=1e-4, atol=1e-4)


# ---- the graphed engine (static path on CPU) gives the same tokens -------------------------------------------


@pytest.mark.parametrize(
    "drafter, k, guided",
    [("ngram", 0, False), ("ngram", 4, False), ("draft_model", 3, False), ("ngram", 4, True), ("draft_model", 2, True)],
)
def test_engine_with_static_path_is_token_identical(make_engine, tiny_ckpt, drafter, k, guided):
    prompts = [[5, 9, 14, 5, 9, 14, 5, 9], [7, 7, 8], [30, 31, 32, 33, 30, 31, 32]]
    guide = dict(guide_type="regex", guide=r"[a-e]{3,12}") if guided else {}
    draft = {}
    if drafter == "draft_model":  # int8 runs on CPU only; on CUDA the target checkpoint drafts for itself
        draft = dict(draft_quantization="int8") if TEST_DEVICE == "cpu" else dict(draft_checkpoint=str(tiny_ckpt))

    def run(**kw):
        eng = make_engine(ngram_min=1, **draft, **kw)
        reqs = [
            eng.make_request(SamplingParams(max_tokens=24, num_draft_tokens=k, drafter=drafter, **guide), prompt_ids=p)
            for p in prompts
        ]
        outs = run_to_end(eng, reqs)
        return [tokens_of(outs[r.request_id]) for r in reqs], sum(r.spec.drafted for r in reqs)

    base, _ = run(cuda_graphs=False)
    graphed, drafted = run(cuda_graphs=True)
    assert graphed == base
    assert all(len(t) > 2 for t in base)
    if k:
        assert drafted > 0


@pytest.mark.parametrize("drafter, k", [("ngram", 4), ("draft_model", 3), ("grammar", 4)])
def test_verify_before_seal_order_is_token_identical(make_engine, tiny_ckpt, drafter, k):
    """The CUDA order (verify forward queued before the matchers seal the drafts, so n-gram drafts the grammar
    cuts are verified too) commits exactly what the CPU order (seal, then verify) commits."""
    prompts = [[5, 9, 14, 5, 9, 14, 5, 9], [97, 98, 99, 97, 98, 99, 97], [30, 31, 32, 33, 30, 31, 32]]
    draft = {}
    if drafter == "draft_model":
        draft = dict(draft_quantization="int8") if TEST_DEVICE == "cpu" else dict(draft_checkpoint=str(tiny_ckpt))

    def run(overlap):
        eng = make_engine(ngram_min=1, **draft)
        eng.overlap_grammar = overlap
        reqs = [
            eng.make_request(
                SamplingParams(
                    max_tokens=20,
                    num_draft_tokens=k,
                    drafter=drafter,
                    guide_type="regex",
                    guide=r"(abc|ab|[a-f]x){2,9}",
                ),
                prompt_ids=p,
            )
            for p in prompts
        ]
        outs = run_to_end(eng, reqs)
        return [tokens_of(outs[r.request_id]) for r in reqs], sum(r.spec.drafted for r in reqs)

    (cpu_order, drafted), (cuda_order, _) = run(False), run(True)
    assert cuda_order == cpu_order and drafted > 0


# ---- mask staging ------------------------------------------------------------------------------------------


def test_mask_apply_masks_only_the_listed_rows_with_their_own_masks():
    vocab = 70
    m = StepMasks(vocab, max_slots=2, max_draft_len=2, device=torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    m.buf.copy_(torch.randint(-(2**31), 2**31 - 1, m.buf.shape, generator=g, dtype=torch.int64).to(torch.int32))
    m.stage.fill_(0)  # stale garbage must never leak into unlisted rows
    entries = [(0, 0, 0), (4, 1, 2), (5, 0, 1)]  # (logits row, request b, position i)
    logits = torch.randn(6, vocab, generator=g)
    out = logits.clone()
    m.apply(out, entries)
    for row in range(6):
        listed = [e for e in entries if e[0] == row]
        if not listed:
            assert torch.equal(out[row], logits[row])
            continue
        words = m.buf[m.row(listed[0][1], listed[0][2])]
        allowed = torch.tensor([(int(words[t // 32]) >> (t % 32)) & 1 for t in range(vocab)], dtype=torch.bool)
        assert torch.equal(out[row][allowed], logits[row][allowed])
        assert torch.isneginf(out[row][~allowed]).all()


# ---- CUDA only ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_forward_rows_has_no_host_sync_on_cuda(make_engine):
    runner = make_engine(device="cuda", max_draft_len=4).target
    runner.forward_rows([[5, 6, 7, 8]], [0], [0], last_only=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a host sync inside the forward raises
    try:
        logits = runner.forward_rows([[9, 10], [11]], [0, 1], [4, 0], last_only=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert logits.shape[:2] == (2, 2) and torch.isfinite(logits[0]).all() and torch.isfinite(logits[1, 0]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("k", [0, 3])
def test_cuda_graphs_are_captured_and_token_identical(make_engine, k):
    prompts = [[5, 9, 14, 5, 9, 14, 5, 9], [7, 7, 8], [30, 31, 32, 33, 30, 31, 32]]

    def run(**kw):
        eng = make_engine(device="cuda", ngram_min=1, **kw)
        reqs = [
            eng.make_request(SamplingParams(max_tokens=24, num_draft_tokens=k, drafter="ngram"), prompt_ids=p)
            for p in prompts
        ]
        outs = run_to_end(eng, reqs)
        return [tokens_of(outs[r.request_id]) for r in reqs], eng

    base, _ = run(cuda_graphs=False)
    graphed, eng = run(cuda_graphs=True)
    assert graphed == base
    assert eng.target.graphed.graphs, "no CUDA graph was captured"
