"""A reduced draft vocabulary (speculation/draft_vocab.py): the ranking and the sizes; the native head over a
subset of the entries is bitwise the whole head's columns; and a draft over a subset leaves every output as it
is without speculation: greedy, guided where the grammar needs entries outside the subset, seeded sampling, and
the distribution under rejection sampling (whose q is zero outside the subset)."""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch

from specgram.config import EngineConfig
from specgram.engine.engine import Engine
from specgram.errors import ModelLoadError
from specgram.model import kernels
from specgram.model.choice import choose_for
from specgram.model.runner import ModelRunner
from specgram.request import SamplingParams
from specgram.speculation import draft_vocab

from .distributions import chi2_critical, chi2_stat, exact_joint
from .helpers import PROMPTS, reference_model, run_to_end, tokens_of
from .tiny import build_model, build_tokenizer, save_checkpoint

NATIVE = kernels.load() is not None and os.environ.get("SPECGRAM_TEST_LINEAR", "auto") != "torch"
needs_native = pytest.mark.skipif(not NATIVE, reason="a reduced draft vocabulary runs on the native CPU forward")


def test_ranking_keeps_first_then_counts_then_ids():
    counts = Counter({5: 3, 7: 9, 2: 3, 11: 1, 40: 8})  # 40: outside a vocabulary of 12
    assert draft_vocab.ranked(counts, 12, keep={9, 7}) == [7, 9, 2, 5, 11, 0, 1, 3, 4, 6, 8, 10]


@pytest.mark.parametrize(
    "setting,vocab,size",
    [(-1, 262144, 32768), (-1, 65536, 65536), (-1, 49152, 49152), (0, 262144, 262144), (100, 50, 50), (8, 50, 8)],
)
def test_sizes(setting, vocab, size):
    assert draft_vocab.size_of(setting, vocab) == size


def test_head_ids_are_the_most_frequent_with_the_special_tokens():
    tok = build_tokenizer()
    corpus = ["aaaa bbb cc d", "aaa"]
    ids = draft_vocab.head_ids(tok, 259, 8, corpus, keep={2})
    assert ids.tolist() == sorted(ids.tolist()) and len(ids) == 8
    chars = tok.convert_tokens_to_ids(["a", "b", "c", "Ġ", "d"])  # byte-level: the space is "Ġ"
    assert set(ids.tolist()) == {0, 1, 2, *chars}  # the specials, then by count (the rest fills in id order)
    assert draft_vocab.head_ids(tok, 259, 259, corpus, keep={2}) is None
    assert draft_vocab.head_ids(tok, 259, 2, corpus, keep={2}).tolist() == [0, 1, 2]  # a size below the specials'


def test_a_corpus_folder_is_read_file_by_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("one")
    (tmp_path / "sub" / "b.md").write_text("two")
    assert draft_vocab.read_corpus(str(tmp_path)) == ["one", "two"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no files"):
        draft_vocab.read_corpus(str(tmp_path / "empty"))
    with pytest.raises(OSError):
        draft_vocab.read_corpus(str(tmp_path / "none.txt"))


@needs_native
@pytest.mark.parametrize("weights", ["auto", "int8"])
def test_the_reduced_head_is_bitwise_the_whole_heads_columns(weights):
    model = build_model(seed=3)
    ids = torch.tensor([0, 2, 5, 17, 100, 258])
    full = ModelRunner(model, 2, 64, choose_for(model, linear="native", weights=weights))
    part = ModelRunner(model, 2, 64, choose_for(model, linear="native", weights=weights), head_ids=ids)
    rows = [[1, 40, 41, 42, 43], [1, 50, 51]]
    a = full.forward_rows(rows, [0, 1], [0, 0], last_only=False)
    b = part.forward_rows(rows, [0, 1], [0, 0], last_only=False)
    assert b.shape[-1] == len(ids) and torch.equal(b, a[..., ids])


def _engine(ckpt, **kw) -> Engine:
    kw = {"max_slots": 4, "draft_quantization": "int8", **kw}
    return Engine.from_config(EngineConfig(checkpoint=str(ckpt), max_seq_len=256, linear="native", **kw))


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    ckpt = save_checkpoint(tmp_path_factory.mktemp("draft-vocab"))
    if not NATIVE:
        pytest.skip("a reduced draft vocabulary runs on the native CPU forward")
    made = {size: _engine(ckpt, draft_vocab=size) for size in (0, 24)}
    yield made
    for e in made.values():
        e.close()


def _ids(engine, params: dict, text: str) -> tuple[list[int], object]:
    req = engine.make_request(SamplingParams(**params), text=text)
    outs = run_to_end(engine, [req])[req.request_id]
    return tokens_of(outs), outs[-1]


@pytest.mark.parametrize("k", [3, -1])
@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_greedy_output_is_unchanged(engines, prompt, k):
    head = engines[24].drafters["draft_model"].runner.head_ids
    assert head is not None and len(head) == 24
    base, _ = _ids(engines[0], dict(max_tokens=24, num_draft_tokens=0), prompt)
    for size, engine in engines.items():
        got, final = _ids(engine, dict(max_tokens=24, num_draft_tokens=k, drafter="draft_model"), prompt)
        assert got == base
        if k > 0:  # every head drafted (the reduced one's acceptance over all prompts: below)
            assert final.spec.drafted > 0, (size, final.spec)


def test_the_reduced_head_drafts_tokens_the_target_accepts(engines):
    accepted = 0
    for prompt in PROMPTS[:3]:
        _, final = _ids(engines[24], dict(max_tokens=24, num_draft_tokens=3, drafter="draft_model"), prompt)
        assert final.spec.by_source["draft_model"][0] > 0, final.spec
        accepted += final.spec.by_source["draft_model"][1]
    assert accepted > 0


def test_a_guide_outside_the_draft_vocabulary_ends_drafts_not_the_request(engines):
    """A regex over characters the reduced head lacks: every draft row is empty under the mask, so the copy drafts
    nothing, and the request ends as it does without speculation."""
    engine = engines[24]
    head = set(engine.drafters["draft_model"].runner.head_ids.tolist())
    outside = [c for c in "0123456789xyzqjkXYZQJK" if engine.tokenizer.convert_tokens_to_ids(c) not in head][:6]
    assert len(outside) >= 3
    guide = dict(guide_type="regex", guide=f"[{''.join(outside)}]{{12}}", max_tokens=10)  # EOS never allowed
    base, _ = _ids(engine, dict(num_draft_tokens=0, **guide), "Write a code")
    got, final = _ids(engine, dict(num_draft_tokens=3, drafter="draft_model", **guide), "Write a code")
    assert got == base and len(got) == 10 and final.finish_reason == "length" and final.spec.drafted == 0
    assert set(engine.tokenizer.decode(got)) <= set(outside)


def test_seeded_sampling_is_unchanged(engines):
    sampled = dict(max_tokens=24, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)
    base, _ = _ids(engines[0], dict(num_draft_tokens=0, **sampled), PROMPTS[0])
    for k in (3, -1):
        got, final = _ids(engines[24], dict(num_draft_tokens=k, drafter="draft_model", **sampled), PROMPTS[0])
        assert got == base
        if k > 0:
            assert final.spec.drafted > 0 and final.spec.accepted > 0, final.spec


@needs_native
def test_rejection_sampling_keeps_the_distribution(tmp_path):
    """vocab 4 with a draft over 3 of the entries (q zero at the fourth): the output's joint distribution over 3
    tokens is still the target's."""
    target = save_checkpoint(tmp_path / "t", seed=1, vocab_size=4, init=0.08)
    draft = save_checkpoint(tmp_path / "d", seed=2, vocab_size=4, init=0.08)
    engine = _engine(target, draft_checkpoint=str(draft), draft_quantization="none", draft_vocab=2, max_slots=64)
    engine.logits.coupled = False
    assert engine.drafters["draft_model"].runner.head_ids.tolist() == [0, 1, 2]  # size 2 grows to the 3 specials
    prompt, params = [3, 1, 3, 0, 3, 2, 3, 3, 3], dict(temperature=0.9, top_p=0.95)
    reqs = [
        engine.make_request(
            SamplingParams(max_tokens=3, ignore_eos=True, seed=i, num_draft_tokens=3, drafter="draft_model", **params),
            prompt_ids=prompt,
        )
        for i in range(3000)
    ]
    outs = run_to_end(engine, reqs)
    stats = [outs[r.request_id][-1].spec for r in reqs]
    assert sum(s.drafted for s in stats) > 1500 and 0 < sum(s.accepted for s in stats)
    stat, df = chi2_stat(
        [tuple(tokens_of(outs[r.request_id])) for r in reqs], exact_joint(reference_model(engine), prompt, 3, **params)
    )
    assert stat < chi2_critical(df), (stat, df)
    engine.close()


def test_an_explicit_size_off_the_native_forward_is_refused(tiny_ckpt):
    with pytest.raises(ModelLoadError, match="draft_vocab 16 runs on the native CPU forward only"):
        Engine.from_config(
            EngineConfig(checkpoint=str(tiny_ckpt), draft_quantization="int8", linear="torch", draft_vocab=16)
        )


def test_a_missing_corpus_is_a_load_error(tiny_ckpt, tmp_path):
    if not NATIVE:
        pytest.skip("a reduced draft vocabulary runs on the native CPU forward")
    with pytest.raises(ModelLoadError, match="draft_vocab_corpus"):
        _engine(tiny_ckpt, draft_vocab=16, draft_vocab_corpus=str(tmp_path / "none.txt"))


def test_settings_words(tiny_ckpt):
    base = {"checkpoint": str(tiny_ckpt)}
    assert EngineConfig.from_dict({**base, "draft_vocab": "auto"}).draft_vocab == -1
    assert EngineConfig.from_dict({**base, "draft_vocab": "full"}).draft_vocab == 0
    assert EngineConfig.from_dict({**base, "draft_vocab": "4096"}).draft_vocab == 4096
    with pytest.raises(ModelLoadError, match="draft_vocab"):
        EngineConfig.from_dict({**base, "draft_vocab": "-5"})
