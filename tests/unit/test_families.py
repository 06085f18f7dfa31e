"""Every model family the engine serves computes what transformers computes: on tiny random models of each
family's distinguishing config, the runner's logits for prefill, decode and verify rows (ragged, batched) match
transformers' own forward of each sequence, on the PyTorch forward and on the native one where it covers the
family; greedy output through the engine equals transformers' greedy continuation, with speculation on and off."""

from __future__ import annotations

import pytest
import torch

from specgram.config import EngineConfig
from specgram.engine.engine import Engine
from specgram.errors import ModelLoadError
from specgram.model import families
from specgram.model.choice import choose_for
from specgram.model.runner import ModelRunner
from specgram.model.source import open_source
from specgram.request import SamplingParams

from ..conftest import TEST_DEVICE
from .helpers import assert_rows_bitwise_independent, run_to_end
from .tiny import FAMILY_CONFIGS, build_family, save_family, transformers_logits

NAMES = list(FAMILY_CONFIGS)
TOL = dict(rtol=1e-4, atol=1e-4) if TEST_DEVICE == "cpu" else dict(rtol=1e-3, atol=1e-3)  # CUDA: other kernels
# two prompts of different lengths (the longer past every sliding window and llama3's original context)
PROMPTS = [torch.randint(3, 259, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (45, 13)]


MAX_SEQ_LEN = 96


def reference(model, ids: list[int]) -> torch.Tensor:
    """transformers' own forward of one sequence -> float32 logits [len, V] (as a server of MAX_SEQ_LEN tokens
    computes them: tiny.transformers_logits)."""
    return transformers_logits(model, ids, MAX_SEQ_LEN)


def check_rows(runner: ModelRunner, model) -> None:
    """A ragged batched prefill, then a verify row of 3 beside a decode row of 1, against each sequence alone
    (`model`: a separate copy of the runner's, untouched by it)."""
    got = runner.forward_rows(PROMPTS, [0, 1], [0, 0], last_only=False).cpu()
    for b, ids in enumerate(PROMPTS):
        torch.testing.assert_close(got[b, : len(ids)], reference(model, ids), **TOL)
    rows = [[7, 8, 9], [11]]
    got = runner.forward_rows(rows, [0, 1], [len(p) for p in PROMPTS], last_only=False).cpu()
    for b, (ids, row) in enumerate(zip(PROMPTS, rows, strict=True)):
        torch.testing.assert_close(got[b, : len(row)], reference(model, ids + row)[len(ids) :], **TOL)


@pytest.mark.parametrize("name", NAMES)
def test_the_pytorch_forward_computes_what_transformers_computes(name):
    model = build_family(name, seed=1).to(TEST_DEVICE)  # scripts/gpu_check.sh: on CUDA
    runner = ModelRunner(model, 2, MAX_SEQ_LEN, choose_for(model, linear="torch"))
    check_rows(runner, build_family(name, seed=1).to(TEST_DEVICE))


@pytest.mark.parametrize("name", NAMES)
def test_the_native_forward_covers_a_family_exactly_or_says_why_not(lib, name):
    model = build_family(name, seed=1)
    gap = families.native_gap(families.describe(model.config))
    if gap is not None:
        assert choose_for(model).kind == "torch"
        with pytest.raises(ModelLoadError, match="native CPU forward does not run here: the native forward does not"):
            choose_for(model, linear="native")
        return
    runner = ModelRunner(model, 4, MAX_SEQ_LEN, choose_for(model, linear="native"))
    assert runner.native is not None
    check_rows(runner, build_family(name, seed=1))
    assert_rows_bitwise_independent(runner)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_output_is_transformers_greedy_with_speculation_on_and_off(name, tmp_path):
    model = build_family(name, seed=2, initializer_range=0.3)
    path = save_family(tmp_path / name, name, seed=2)
    prompt, n = PROMPTS[1], 12
    ids = list(prompt)
    for _ in range(n):  # transformers' greedy continuation, without a cache
        ids.append(int(reference(model, ids)[-1].argmax()))
    # the int8 copy drafts on CPU; on CUDA (scripts/gpu_check.sh) the checkpoint drafts for itself
    draft = dict(draft_quantization="int8") if TEST_DEVICE == "cpu" else dict(draft_checkpoint=str(path))
    engine = Engine.from_config(
        EngineConfig(
            checkpoint=str(path), max_slots=2, max_seq_len=MAX_SEQ_LEN, device=TEST_DEVICE, dtype="float32", **draft
        )
    )
    try:
        outs = {}
        for k, drafter in ((0, "ngram"), (3, "ngram"), (3, "draft_model"), (-1, "draft_model")):
            params = SamplingParams(max_tokens=n, ignore_eos=True, num_draft_tokens=k, drafter=drafter)
            req = engine.make_request(params, prompt_ids=list(prompt))
            outs[k, drafter] = [t for o in run_to_end(engine, [req])[req.request_id] for t in o.token_ids]
    finally:
        engine.close()
    assert outs[0, "ngram"] == ids[len(prompt) :]
    assert all(out == outs[0, "ngram"] for out in outs.values()), outs


def test_an_unknown_model_type_is_refused_with_the_families(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ModelLoadError, match=r"model_type 'bert' .* families llama, qwen2, .* docs/models.md"):
        open_source(tmp_path)
    with pytest.raises(ModelLoadError, match="model_type 'bert' is not supported"):
        families.describe(type("Cfg", (), {"model_type": "bert"})())


def test_each_family_reads_what_differs():
    arch = {name: families.describe(build_family(name).config) for name in NAMES}
    assert arch["qwen3"].qk_norm and arch["gemma3_text"].qk_norm and not arch["llama"].qk_norm
    assert arch["gemma3_text"].windows == (8, 8, 8, None) and arch["gemma3_text"].window == 8
    assert arch["gemma3_text"].rope_types == ("full_attention", "sliding_attention")
    assert arch["gemma3_text"].layer_tables == (1, 1, 1, 0)
    assert arch["gemma3_text"].norm_offset == 1.0 and arch["gemma3_text"].embed_scale == 64**0.5
    assert arch["smollm3"].rope_layers == (True, True, True, False)
    assert arch["phi4_mini"].rotary_fraction == 0.75 and arch["phi3"].fused_projections
    assert (arch["granite"].residual_scale, arch["granite"].logits_divisor) == (0.22, 8.0)
    assert arch["mistral"].window == 8 and arch["llama"].window is None
