"""LoRA adapters (model/lora.py, kernels/lora.c): each family's forward with a random PEFT adapter computes what
PEFT's PeftModel computes, on the PyTorch forward and the native one; rows of different adapters and none in one
batch are each bitwise what they are alone (native); through the engine, an adapter's greedy output is PEFT's
greedy continuation at every draft length and beside other adapters' requests; the prefix cache never serves one
adapter's keys to another; a bad adapter or name is one clear error."""

from __future__ import annotations

import json
import os

import pytest
import torch

from specgram.config import EngineConfig
from specgram.engine.engine import Engine
from specgram.errors import InvalidRequest, ModelLoadError
from specgram.model import kernels, lora
from specgram.model.choice import choose_for
from specgram.model.runner import ModelRunner
from specgram.request import SamplingParams

from ..conftest import TEST_DEVICE
from .helpers import run_to_end, tokens_of
from .tiny import FAMILY_CONFIGS, build_family, save_family_with_loras, save_lora

TOL = dict(rtol=1e-4, atol=1e-4) if TEST_DEVICE == "cpu" else dict(rtol=1e-3, atol=1e-3)
PROMPTS = [torch.randint(3, 259, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (45, 13, 20)]
native_only = pytest.mark.skipif(kernels.load() is None, reason="native kernels need AVX-512 or AVX2 and a C compiler")


def reference(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids], device=model.device)).logits[0].float().cpu()


def with_adapters(runner: ModelRunner, model, paths: list) -> None:
    runner.attach_lora(lora.Adapters([lora.read_adapter(f"a{i}", str(p), model, 64) for i, p in enumerate(paths)]))


@pytest.mark.parametrize("linear", ["torch", "native"])
@pytest.mark.parametrize("name", list(FAMILY_CONFIGS))
def test_each_family_with_an_adapter_computes_what_peft_computes(name, linear, tmp_path):
    if linear == "native" and kernels.load() is None:
        pytest.skip("native kernels unavailable")
    model = build_family(name, seed=1).to(TEST_DEVICE if linear == "torch" else "cpu")
    peft = save_lora(model, tmp_path / "a", r=4, seed=3)
    runner = ModelRunner(model, 3, 96, choose_for(model, linear=linear))
    with_adapters(runner, model, [tmp_path / "a"])
    # row 0 under the adapter, row 1 the base model
    got = runner.forward_rows(PROMPTS[:2], [0, 1], [0, 0], last_only=False, adapters=[0, -1]).cpu()
    torch.testing.assert_close(got[0, : len(PROMPTS[0])], reference(peft, PROMPTS[0]), **TOL)
    torch.testing.assert_close(got[1, : len(PROMPTS[1])], reference(model, PROMPTS[1]), **TOL)
    assert (reference(peft, PROMPTS[0]) - reference(model, PROMPTS[0])).abs().max() > 1e-2  # the adapter matters
    row = [7, 8, 9]  # a verify row after the prompt
    got = runner.forward_rows([row], [0], [len(PROMPTS[0])], last_only=False, adapters=[0])[0].cpu()
    torch.testing.assert_close(got[: len(row)], reference(peft, PROMPTS[0] + row)[len(PROMPTS[0]) :], **TOL)


@pytest.mark.parametrize("linear", ["torch", "native"])
def test_an_rslora_adapter_computes_what_peft_computes(linear, tmp_path):
    """rsLoRA scales its update by alpha / sqrt(r), not alpha / r: at r = 8 the two differ by 2.8x."""
    if linear == "native" and kernels.load() is None:
        pytest.skip("native kernels unavailable")
    model = build_family("qwen2", seed=1).to(TEST_DEVICE if linear == "torch" else "cpu")
    peft = save_lora(model, tmp_path / "rs", r=8, seed=4, modules=["q_proj", "v_proj", "down_proj"], rslora=True)
    assert peft.peft_config["default"].use_rslora
    runner = ModelRunner(model, 2, 96, choose_for(model, linear=linear))
    with_adapters(runner, model, [tmp_path / "rs"])
    got = runner.forward_rows(PROMPTS[:1], [0], [0], last_only=False, adapters=[0])[0].cpu()
    torch.testing.assert_close(got[: len(PROMPTS[0])], reference(peft, PROMPTS[0]), **TOL)


@native_only
@pytest.mark.parametrize("weights", ["auto", "int8"])
def test_mixed_adapters_in_one_batch_are_bitwise_each_alone(tmp_path, weights):
    model = build_family("llama", seed=1)
    save_lora(model, tmp_path / "a", r=4, seed=3)
    save_lora(model, tmp_path / "b", r=8, seed=4, modules=["q_proj", "v_proj", "down_proj"], rslora=True)
    runner = ModelRunner(model, 4, 96, choose_for(model, linear="native", weights=weights))
    with_adapters(runner, model, [tmp_path / "a", tmp_path / "b"])
    adapters = [0, 1, -1]
    together = runner.forward_rows(PROMPTS, [0, 1, 2], [0, 0, 0], last_only=False, adapters=adapters)
    for b, ids in enumerate(PROMPTS):
        alone = runner.forward_rows([ids], [b], [0], last_only=False, adapters=[adapters[b]])[0]
        assert torch.equal(together[b, : len(ids)], alone[: len(ids)])
    verify = runner.forward_rows([[5, 6], [7]], [1, 0], [20, 45], last_only=False, adapters=[1, 0])
    assert torch.equal(verify[0, :2], runner.forward_rows([[5, 6]], [1], [20], last_only=False, adapters=[1])[0])
    assert not torch.equal(verify[0, :2], runner.forward_rows([[5, 6]], [1], [20], last_only=False)[0])


# ---- through the engine ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny llama checkpoint, two adapters in a multi_lora.json, and an engine serving them."""
    root = tmp_path_factory.mktemp("lora")
    loras = {"json-a": dict(r=4, seed=5), "json-b": dict(r=16, seed=6, modules=["o_proj", "gate_proj"])}
    path, model, pefts, listing = save_family_with_loras(root, "llama", 2, loras)
    config = dict(checkpoint=str(path), max_slots=4, max_seq_len=96, device=TEST_DEVICE, dtype="float32")
    config["linear"] = os.environ.get("SPECGRAM_TEST_LINEAR", "auto")  # scripts/test.sh: also the PyTorch forward
    draft = dict(draft_quantization="int8") if TEST_DEVICE == "cpu" else {}
    engine = Engine.from_config(EngineConfig(**config, **draft, enable_lora=True, lora_adapters=str(listing)))
    yield engine, model, pefts, root, config
    engine.close()


def greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(reference(model, ids)[-1].argmax()))
    return ids[len(prompt) :]


def _request(engine, prompt, lora_name=None, k=0, drafter="ngram", n=12):
    params = SamplingParams(max_tokens=n, ignore_eos=True, num_draft_tokens=k, drafter=drafter, lora_name=lora_name)
    return engine.make_request(params, prompt_ids=list(prompt))


def test_greedy_output_is_pefts_at_every_draft_length(served):
    engine, model, pefts, _, _ = served
    drafts = [(0, "ngram"), (4, "ngram"), (-1, "ngram")]
    if "draft_model" in engine.drafters:
        drafts += [(3, "draft_model"), (-1, "draft_model")]
    for name, peft in pefts.items():
        expected = greedy(peft, PROMPTS[1], 12)
        for k, drafter in drafts:
            req = _request(engine, PROMPTS[1], name, k, drafter)
            assert tokens_of(run_to_end(engine, [req])[req.request_id]) == expected, (name, k, drafter)
    req = _request(engine, PROMPTS[1])
    assert tokens_of(run_to_end(engine, [req])[req.request_id]) == greedy(model, PROMPTS[1], 12)


def test_a_batch_of_adapters_and_the_base_is_each_as_alone(served):
    engine = served[0]
    names = ["json-a", "json-b", None, "json-a"]
    alone = []
    for i, name in enumerate(names):
        req = _request(engine, PROMPTS[i % 3], name, 4)
        alone.append(tokens_of(run_to_end(engine, [req])[req.request_id]))
    reqs = [_request(engine, PROMPTS[i % 3], name, 4) for i, name in enumerate(names)]
    outs = run_to_end(engine, reqs)
    assert [tokens_of(outs[r.request_id]) for r in reqs] == alone
    assert alone[0] != alone[1] != alone[2]  # the adapters change the output


def test_the_prefix_cache_is_keyed_by_adapter(served):
    engine = served[0]
    if engine.prefix is None:
        pytest.skip("no prefix cache on this forward")
    first = _request(engine, PROMPTS[0], "json-a")
    run_to_end(engine, [first])
    other = _request(engine, PROMPTS[0], "json-b")
    same = _request(engine, PROMPTS[0], "json-a")
    run_to_end(engine, [other])
    run_to_end(engine, [same])
    assert other.cached_prompt_tokens == 0 and same.cached_prompt_tokens == len(PROMPTS[0]) - 1


def test_an_unknown_adapter_is_an_error_for_that_request(served):
    engine = served[0]
    with pytest.raises(InvalidRequest) as e:
        _request(engine, PROMPTS[0], "nope")
    assert str(e.value) == "LoRA nope is not supported, we currently support ['json-a', 'json-b']"  # vllm_backend's


def test_a_model_without_adapters_refuses_a_lora_name(make_engine):
    engine = make_engine()
    try:
        with pytest.raises(InvalidRequest) as e:
            _request(engine, PROMPTS[0], "json-a")
        assert str(e.value) == "LoRA feature is not enabled."
    finally:
        engine.close()


def test_adapters_that_do_not_fit_are_load_errors(served, tmp_path):
    _, model, _, root, config = served
    big = build_family("llama", seed=2, hidden=96)  # other shapes
    save_lora(big, tmp_path / "other", r=4, seed=1)
    save_lora(model, tmp_path / "wide", r=128, seed=1, modules=["q_proj"])
    cases = {
        "other": "do not fit this model",
        "wide": "rank 128 is above max_lora_rank 64",
    }
    for name, message in cases.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({name: str(tmp_path / name)}))
        with pytest.raises(ModelLoadError, match=message):
            Engine.from_config(EngineConfig(**config, enable_lora=True, lora_adapters=str(tmp_path / f"{name}.json")))
    (tmp_path / "many.json").write_text(json.dumps({f"x{i}": str(root / "adapters" / "json-a") for i in range(3)}))
    with pytest.raises(ModelLoadError, match="lists 3 adapters; max_loras is 2"):
        Engine.from_config(
            EngineConfig(**config, enable_lora=True, max_loras=2, lora_adapters=str(tmp_path / "many.json"))
        )
    with pytest.raises(ModelLoadError, match="could not read the LoRA list"):
        Engine.from_config(EngineConfig(**config, enable_lora=True, lora_adapters=str(tmp_path / "none.json")))


def test_the_int8_copy_drafts_with_the_adapter(served):
    """lora_draft (default on): the target's int8 copy applies the request's adapter, so its drafts are the
    adapter's model's; off, it drafts as the base model. The output is the same either way, and the adapter's
    drafts are accepted more often."""
    engine, _, _, root, config = served
    if "draft_model" not in engine.drafters or engine.drafters["draft_model"].runner.native is None:
        pytest.skip("the int8 copy on the native forward drafts with adapters")
    assert engine.drafters["draft_model"].runner.adapters is engine.target.adapters
    listing = str(root / "multi_lora.json")
    base_copy = Engine.from_config(
        EngineConfig(**config, draft_quantization="int8", enable_lora=True, lora_adapters=listing, lora_draft=False)
    )
    try:
        assert base_copy.drafters["draft_model"].runner.adapters is None
        got = {}
        for name, e in (("with", engine), ("base", base_copy)):
            reqs = [_request(e, p, "json-a", 4, "draft_model", 24) for p in PROMPTS]
            outs = run_to_end(e, reqs)
            got[name] = (
                [tokens_of(outs[r.request_id]) for r in reqs],
                sum(outs[r.request_id][-1].spec.accepted for r in reqs),
            )
        assert got["with"][0] == got["base"][0]
        assert got["with"][1] > got["base"][1], got
    finally:
        base_copy.close()
