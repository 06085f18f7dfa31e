"""GGUF files as checkpoints (model/gguf_checkpoint.py): which paths name one; every tensor read as transformers'
own GGUF reader de-quantizes it; Q4_K blocks kept exactly in int4's form; an engine serving the file as it comes
(weights auto: int4 where the blocks are Q4_K, int8 elsewhere; weights int4: int4 throughout) with its tokenizer,
chat template and EOS from the metadata, its logits those of transformers' reading of the file up to the
activations' quantization, and its output identical with itself at every draft length and batch."""

from __future__ import annotations

from contextlib import closing

import pytest
import torch

from specgram.config import EngineConfig
from specgram.engine.engine import Engine
from specgram.errors import ModelLoadError
from specgram.model import int4, int8, kernels
from specgram.model.choice import choose_for
from specgram.model.gguf_checkpoint import checkpoint, gguf_file
from specgram.model.kernels import abi
from specgram.model.runner import ModelRunner

from .helpers import PROMPTS, logits_against, run, tokens_of
from .tiny import build_tokenizer
from .tiny_gguf import LAYERS, save_gguf, transformers_model, with_int4_activations

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="native kernels need AVX-512 or AVX2 and a C compiler")

MIXED = {"attn_v.1": "Q8_0", "ffn_down.1": "Q5_0"}  # as a Q4_K_M file mixes: layer 1's v and down in other types


@pytest.fixture(scope="module")
def q4k_file(tmp_path_factory):
    """Every projection and the head in Q4_K (the embedding Q8_0)."""
    return save_gguf(tmp_path_factory.mktemp("gguf-q4k") / "tiny-q4_k.gguf", seed=1, types={"output": "Q4_K"})


@pytest.fixture(scope="module")
def mixed_file(tmp_path_factory):
    return save_gguf(tmp_path_factory.mktemp("gguf-mixed") / "tiny-mixed.gguf", seed=2, types=MIXED)


def engine(path, **kw) -> Engine:
    kw.setdefault("max_slots", 4)
    kw.setdefault("max_seq_len", 256)
    return Engine.from_config(EngineConfig(checkpoint=str(path), device="cpu", **kw))


def test_a_checkpoint_names_a_gguf_file_or_a_folder_holding_only_one(tmp_path, q4k_file):
    assert gguf_file(q4k_file) == q4k_file and gguf_file(q4k_file.parent) == q4k_file
    (tmp_path / "a.gguf").write_bytes(b"")
    assert gguf_file(tmp_path) == tmp_path / "a.gguf"
    (tmp_path / "mmproj-a-f16.gguf").write_bytes(b"")
    assert gguf_file(tmp_path) == tmp_path / "a.gguf"  # a vision projector beside the model is not the model
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"several GGUF models \(a.gguf, b.gguf\)"):
        gguf_file(tmp_path)  # two: ambiguous, and the error says which to name
    (tmp_path / "b.gguf").unlink()
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert gguf_file(tmp_path) is None  # a safetensors checkpoint's folder
    assert gguf_file(tmp_path / "model.safetensors") is None


def test_every_tensor_reads_as_transformers_dequantizes_it_and_q4_k_is_kept_exactly(mixed_file):
    model = transformers_model(mixed_file)
    files = checkpoint(mixed_file).tensors(LAYERS)
    params = dict(model.named_parameters())
    files.expect({name: p.shape for name, p in params.items()})
    assert set(files.meta) == set(params)
    kept = 0
    for name, p in params.items():
        assert torch.equal(files.get(name), p.detach()), name
        stored = files.int4(name) if name.endswith("proj.weight") or name == "lm_head.weight" else None
        if files.block_type(name) == "Q4_K":
            assert torch.equal(stored.dequantize(), p.detach()) and int(stored.q.max()) <= 15, name
            assert int(stored.sc.max()) <= 63 and int(stored.mn.max()) <= 63  # the file's 6-bit sub-scales
            kept += 1
        else:
            assert stored is None
    assert kept == 7 * LAYERS - 2  # every projection but layer 1's v and down


def test_a_matrix_read_by_blocks_of_rows_quantizes_bitwise_as_the_whole(mixed_file, monkeypatch):
    files = checkpoint(mixed_file).tensors(LAYERS)
    files.expect({name: p.shape for name, p in transformers_model(mixed_file).named_parameters()})
    monkeypatch.setattr(int8, "CHUNK", 7)  # several blocks, the last one short
    monkeypatch.setattr(int4, "CHUNK", 7)
    matrices = [n for n, (shape, _) in files.meta.items() if len(shape) == 2]
    assert {files.block_type(n) for n in matrices} >= {"Q4_K", "Q8_0", "Q5_0"}
    for name in matrices:
        whole, rows = files.get(name), files.rows(name)
        assert rows.shape == tuple(whole.shape) and torch.equal(rows[3:20], whole[3:20])
        q, scale = int8.quantize_rows(rows)
        assert all(torch.equal(a, b) for a, b in zip((q, scale), int8.quantize_rows(whole), strict=True)), name
        assert torch.equal(int4.quantize(rows).dequantize(), int4.quantize(whole).dequantize()), name
        pick = torch.tensor([5, 0, 17, 2, 9, 11, 3, 30])  # a reduced head's rows, in its order
        assert rows[pick].shape == (8, whole.shape[1]) and torch.equal(rows[pick][2:6], whole[pick][2:6])
        assert torch.equal(int8.quantize_rows(rows[pick])[0], int8.quantize_rows(whole[pick])[0])


def _kinds(runner) -> list[str]:
    """Each product's form: "int4" or the weight dtype."""
    return ["int4" if lin.weight_dtype == int4.DTYPE else str(lin.weight_dtype) for lin in runner.linear_layers()]


def test_the_file_is_served_as_it_comes_with_its_tokenizer(vnni, q4k_file):
    reference = with_int4_activations(transformers_model(q4k_file))
    with closing(engine(q4k_file)) as e:
        assert e.target.weights == "gguf" and e.target.native.lib is vnni
        assert _kinds(e.target) == ["int4"] * (4 * LAYERS + 1)  # every product kept in its Q4_K blocks
        assert e.tokenizer("Hello there").input_ids == build_tokenizer()("Hello there").input_ids
        assert 2 in e.eos_ids and "<s>assistant: " in e.tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
        )
        rounded = ModelRunner(reference, 2, 96, choose_for(reference, linear="torch"))
        rel, agree = logits_against(rounded, e.target)
    # the file's own weights exactly: transformers' float32 reading of them with the activations rounded as int4's
    # products round theirs gives the same logits (the same values, summed in another order)
    assert rel.max().item() < 1e-3 and agree == 1.0, rel  # measured: max 3e-5


def test_mixed_block_types_take_int8_where_int4_cannot_hold_them(vnni, mixed_file):
    reference = transformers_model(mixed_file)
    fp32 = ModelRunner(reference, 2, 96, choose_for(reference, linear="native"))
    with closing(engine(mixed_file)) as e:
        kinds = _kinds(e.target)
        rel, agree = logits_against(fp32, e.target)
        alone = [tokens_of(run(e, [p], max_tokens=16)[0]) for p in PROMPTS]
        batched = [tokens_of(o) for o in run(e, PROMPTS, max_tokens=16)]
        spec = {k: [tokens_of(o) for o in run(e, PROMPTS, max_tokens=16, num_draft_tokens=k)] for k in (2, -1)}
    # layer 1's q|k|v holds a Q8_0 v, its down is Q5_0; the head is Q8_0
    assert kinds == ["int4"] * 4 + ["torch.int8", "int4", "int4", "torch.int8", "torch.int8"]
    assert batched == alone and spec[2] == alone and spec[-1] == alone
    # the int8 products' second rounding (measured: median 0.0065, max 0.061 of the logits' norm, top-1 all equal)
    assert 1e-4 < rel.median().item() < 0.03 and agree >= 0.9, (rel, agree)
    with closing(engine(mixed_file, weights="int4")) as e:
        assert _kinds(e.target) == ["int4"] * (4 * LAYERS + 1)


def test_without_vnni_the_file_is_served_in_its_forms_too(lib, mixed_file, monkeypatch):
    with closing(engine(mixed_file)) as e:  # the CPU's VNNI where it has it
        vnni_ids = [tokens_of(o) for o in run(e, PROMPTS, max_tokens=16)]
    monkeypatch.setenv(kernels.VNNI_ENV, "0")
    with closing(engine(mixed_file)) as e:
        assert e.target.weights == "gguf"
        lins = e.target.linear_layers()
        # Q4_K blocks on gemm_i4.c's loops without VNNI; the other types int8 with float32 activations
        assert [lin.descriptor().kind for lin in lins if lin.weight_dtype == int4.DTYPE] == [abi.LIN_I4_MADD] * 6
        assert {lin.activations for lin in lins if lin.weight_dtype == torch.int8} == {"float32"}
        alone = [tokens_of(run(e, [p], max_tokens=16)[0]) for p in PROMPTS]
        spec = [tokens_of(o) for o in run(e, PROMPTS, max_tokens=16, num_draft_tokens=3)]
    assert spec == alone
    # the int8 products' activations differ (float32 here, int16 on VNNI): the same text on these prompts
    assert sum(a == b for a, b in zip(alone, vnni_ids, strict=True)) >= len(PROMPTS) - 1


def test_a_folder_holding_the_file_is_the_same_checkpoint(vnni, q4k_file):
    with closing(engine(q4k_file)) as a, closing(engine(q4k_file.parent)) as b:
        assert [tokens_of(o) for o in run(a, PROMPTS, max_tokens=8)] == [
            tokens_of(o) for o in run(b, PROMPTS, max_tokens=8)
        ]


def test_a_gguf_draft_model_is_served_in_its_own_forms(vnni, q4k_file, mixed_file):
    with closing(engine(q4k_file, draft_checkpoint=str(mixed_file))) as e:
        draft = e.drafters["draft_model"].runner
        assert draft.weights == "gguf" and _kinds(draft)[4:] == [
            "torch.int8",
            "int4",
            "int4",
            "torch.int8",
            "torch.int8",
        ]
        alone = [tokens_of(run(e, [p], max_tokens=12)[0]) for p in PROMPTS]
        spec = run(e, PROMPTS, max_tokens=12, num_draft_tokens=3, drafter="draft_model")
    assert [tokens_of(o) for o in spec] == alone and sum(o[-1].spec.drafted for o in spec) > 0


def test_a_tied_head_is_served_as_the_embedding_in_every_form(vnni, tmp_path):
    """A file without output.weight (llama.cpp's tied model): the head is the embedding, in int4 too; the same ids
    as a file whose output.weight holds the embedding's bytes. With a Q4_K embedding the head keeps its blocks
    exactly (the same packed bytes as the copy's head), never a second rounding of their values."""
    for embedding in ("Q8_0", "Q4_K"):
        types = {"token_embd": embedding}
        tied = save_gguf(tmp_path / f"tied-{embedding}.gguf", seed=6, types=types, head="tied")
        copy = save_gguf(tmp_path / f"copy-{embedding}.gguf", seed=6, types=types, head="copy")
        assert "output.weight" not in checkpoint(tied).header.tensors and checkpoint(tied).config().tie_word_embeddings
        for weights in ("auto", "int4", "int8"):
            with closing(engine(tied, weights=weights)) as a, closing(engine(copy, weights=weights)) as b:
                ids = [tokens_of(o) for o in run(a, PROMPTS, max_tokens=12)]
                assert ids == [tokens_of(o) for o in run(b, PROMPTS, max_tokens=12)], (embedding, weights)
                assert [tokens_of(o) for o in run(a, PROMPTS, max_tokens=12, num_draft_tokens=3)] == ids, weights
                heads = [e.target.linear_layers()[-1].packed for e in (a, b)]
                assert torch.equal(*heads), (embedding, weights)
