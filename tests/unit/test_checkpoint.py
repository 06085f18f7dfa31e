"""Loading in the served form (model/checkpoint.py, model/footprint.py): on the native forward a checkpoint's
tensors go one at a time from its safetensors files into the packed weights, which are bitwise those packed from
transformers' whole model; a bfloat16 checkpoint is never widened whole; sharded and .bin checkpoints load; the
load's peak memory stays near what it keeps; a load that cannot fit is refused before it reads anything."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from specgram.config import EngineConfig
from specgram.engine.engine import Engine
from specgram.engine.loading import footprint_of, model_of
from specgram.engine.settings import resolve
from specgram.errors import ModelLoadError
from specgram.model import footprint, kernels
from specgram.model.checkpoint import ModuleTensors, TensorFiles
from specgram.model.choice import choose
from specgram.model.runner import ModelRunner
from specgram.model.source import open_source

from .tiny import build_family, build_tokenizer, save_family

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="the native CPU forward's kernels do not build here")
PROMPTS = [torch.randint(3, 259, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (45, 13)]
CPU = torch.device("cpu")


def _logits(model, tensors, weights="auto") -> torch.Tensor:
    choice = choose(model.config, CPU, torch.float32, linear="native", weights=weights)
    runner = ModelRunner(model, 2, 96, choice, tensors=tensors)
    assert runner.native is not None
    first = runner.forward_rows(PROMPTS, [0, 1], [0, 0], last_only=False)
    return torch.cat([first, runner.forward_rows([[7, 8, 9], [11, 12, 13]], [0, 1], [45, 13], last_only=False)], 1)


@pytest.mark.parametrize("name", ["llama", "qwen3_bias", "gemma3_text", "phi4_mini"])
@pytest.mark.parametrize("weights", ["auto", "int8"])
def test_read_tensor_by_tensor_the_forward_is_bitwise_the_whole_models(name, weights, tmp_path):
    path = str(save_family(tmp_path / name, name, seed=2))
    skeleton, tensors = model_of(open_source(path), CPU, torch.float32, native=True)
    assert tensors is not None and next(skeleton.parameters()).device.type == "meta"
    whole, none = model_of(open_source(path), CPU, torch.float32, native=False)
    assert none is None and next(whole.parameters()).device.type == "cpu"
    assert torch.equal(_logits(skeleton, tensors, weights), _logits(whole, None, weights))


def test_no_mapping_of_the_checkpoint_outlives_the_load(tmp_path):
    import gc
    from pathlib import Path

    path = save_family(tmp_path / "maps", "qwen2", seed=2)  # biases and norms: small tensors kept as they are
    skeleton, tensors = model_of(open_source(path), CPU, torch.float32, native=True)
    runner = ModelRunner(skeleton, 2, 96, choose(skeleton.config, CPU, torch.float32, linear="native"), tensors=tensors)
    gc.collect()
    maps = [line for line in Path("/proc/self/maps").read_text().splitlines() if str(path) in line]
    assert runner.native is not None and not maps, maps


def test_a_bfloat16_checkpoint_is_served_in_float32_without_a_float32_copy_of_its_embedding(tmp_path):
    path = tmp_path / "bf16"
    build_family("llama", seed=2).to(torch.bfloat16).save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    skeleton, tensors = model_of(open_source(path), CPU, torch.float32, native=True)
    assert tensors.embedding().dtype == torch.bfloat16  # rows widen exactly in the kernels
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()  # bfloat16 values, widened
    with torch.inference_mode():
        want = ref(torch.tensor([PROMPTS[0]])).logits[0]
    got = _logits(skeleton, tensors)[0, : len(PROMPTS[0])]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_sharded_and_bin_checkpoints_load(tmp_path):
    model = build_family("qwen2", seed=2)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    files = TensorFiles(tmp_path / "sharded")
    assert len({f.name for f in files.files.values()}) > 1
    skeleton, tensors = model_of(open_source(tmp_path / "sharded"), CPU, torch.float32, native=True)
    assert tensors is not None and torch.equal(_logits(skeleton, tensors), _logits(model, None))
    (tmp_path / "bin").mkdir()
    model.config.save_pretrained(tmp_path / "bin")
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    whole, tensors = model_of(open_source(tmp_path / "bin"), CPU, torch.float32, native=True)  # transformers reads it
    assert tensors is None and torch.equal(_logits(whole, None), _logits(model, None))


def test_tensors_that_do_not_fit_the_model_are_refused_or_read_by_transformers(tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_family(tmp_path / "cut", "llama", seed=2)
    state = load_file(str(path / "model.safetensors"))
    state["model.layers.1.mlp.down_proj.weight"] = state["model.layers.1.mlp.down_proj.weight"][:, :120].clone()
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    model = open_source(path).skeleton(torch.float32)
    assert "down_proj" in ModuleTensors(model, TensorFiles(path)).unfit(model)
    with pytest.raises(ModelLoadError, match="could not load the checkpoint"):  # transformers refuses the shape
        model_of(open_source(path), CPU, torch.float32, native=True)
    (tmp_path / "lost").mkdir()
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
    (tmp_path / "lost" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="could not read the checkpoint"):
        TensorFiles(tmp_path / "lost")


def test_the_estimate_reads_the_embedding_as_stored(tmp_path):
    path = save_family(tmp_path / "f32", "llama", seed=2)
    config = EngineConfig(checkpoint=str(path), max_slots=2, max_seq_len=64, dtype="bfloat16", linear="native")
    parts, remedies = footprint_of(config, resolve(config))
    sizes = {p.what: p.nbytes for p in parts}
    assert sizes["target embedding"] == 259 * 64 * 4  # float32 as stored, though served in bfloat16
    assert TensorFiles(path).dtype("model.embed_tokens.weight") == torch.float32
    assert TensorFiles(path).dtype("no.such.tensor") is None  # other names: the served dtype is assumed
    assert "weights int8" in remedies


def test_a_load_that_cannot_fit_is_refused_before_it_reads_anything(tmp_path):
    parts = [footprint.Part("target weights (float32)", 3 * footprint.GiB), footprint.Part("target KV cache", 2**30)]
    with pytest.raises(ModelLoadError, match=r"needs about 4\.4 GiB \(target weights \(float32\) 3\.00, .* 2\.0 GiB"):
        footprint.check(parts, free=2 * footprint.GiB)
    footprint.check(parts, free=5 * footprint.GiB)
    path = save_family(tmp_path / "llama", "llama", seed=2)
    huge = EngineConfig(checkpoint=str(path), max_slots=256, max_seq_len=2**24, linear="native")  # a 2 TiB cache
    with pytest.raises(ModelLoadError, match=r"needs about .* target KV cache 4096\.00 .* lower max_slots"):
        Engine.from_config(huge)


def test_a_draft_checkpoint_with_another_vocabulary_is_refused_naming_it(tmp_path):
    target, draft = save_family(tmp_path / "target", "llama", seed=2), save_family(tmp_path / "draft", "llama", seed=3)
    tok = build_tokenizer()
    tok.add_tokens(["<other>"])  # one token more than the target's
    tok.save_pretrained(draft)
    config = EngineConfig(checkpoint=str(target), draft_checkpoint=str(draft), max_slots=2, max_seq_len=64)
    want = rf"the draft model at '{re.escape(str(draft.resolve()))}' does not share .*: {len(tok)} vs 259 tokens"
    with pytest.raises(ModelLoadError, match=want):
        Engine.from_config(config)


# A subprocess, so that its peak is its load's own: a random llama of ~60M parameters (240 MB in float32).
MEASURE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    def status():
        f = dict(l.split(":", 1) for l in Path("/proc/self/status").read_text().splitlines())
        return {k: int(f[k].split()[0]) * 1024 for k in ("VmHWM", "VmRSS")}
    from specgram.config import EngineConfig
    from specgram.engine.engine import Engine
    before = status()
    engine = Engine.from_config(EngineConfig(checkpoint=sys.argv[1], max_slots=2, max_seq_len=256,
                                             draft_quantization="int8", linear="native"))
    after = status()
    weights = sum(b.numel() * b.element_size() for r in (engine.target, engine.drafters["draft_model"].runner)
                  for m in r.native.linear_layers() for b in m.buffers() if b is not None)
    from specgram.engine.loading import footprint_of
    estimate = sum(p.nbytes for p in footprint_of(engine.config, engine.settings)[0])
    print(json.dumps(dict(peak=after["VmHWM"] - before["VmRSS"], kept=after["VmRSS"] - before["VmRSS"],
                          weights=weights, embedding=engine.target.native._embed_weight.nbytes, estimate=estimate)))
    engine.close()
""")


def _measure(path) -> dict:
    r = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_load_peaks_near_what_it_keeps(tmp_path):
    """What stays resident is the packed weights (float32 and the int8 copy) and the embedding over what a tiny
    model's load keeps (imports, tokenizer, grammar tables: measured here, not assumed); the peak is near it."""
    tiny = _measure(save_family(tmp_path / "tiny", "llama", seed=2))
    mid = _measure(
        save_family(tmp_path / "mid", "llama", seed=2, hidden_size=768, intermediate_size=2304, num_hidden_layers=8)
    )
    assert mid["weights"] > 200e6  # the float32 packs and the int8 copy
    grew = mid["kept"] - tiny["kept"]
    assert grew <= 1.1 * (mid["weights"] + mid["embedding"] - tiny["weights"] - tiny["embedding"]) + 30e6, (tiny, mid)
    assert abs(grew - (mid["estimate"] - tiny["estimate"])) <= 0.1 * grew, (tiny, mid)  # the load's own estimate
    # a layer's temporaries in flight weigh more against 300 MB than GB, and when other threads allocate during
    # the load moves the peak: 1.10-1.26x over repeated loads of this model; a second whole copy would be ~2x
    assert mid["peak"] <= 1.3 * mid["kept"], mid
