"""Guided JSON sampled hot from random-weight models through the engine: whatever the model favours, every output
that finishes is JSON a strict parser takes (json.loads, strict) and its schema validates (jsonschema), and most
finish before max_tokens. Two vocabularies, each the test of one guarantee of json_grammar.py:
- the byte-level one (every byte a token): a raw control character is one token among the few a string allows,
  so a hot model writes one within a few characters wherever the grammar lets it;
- the default model's (many whitespace tokens, up to dozens of characters each): where whitespace is free, a
  random model's mass is mostly on it, and only the bound on a run lets the text go on."""

import json
import os
from pathlib import Path

import pytest

from specgram.config import EngineConfig
from specgram.engine.engine import Engine

from ..conftest import TEST_DEVICE
from .helpers import run, text_of
from .tiny import build_model, save_checkpoint

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "data" / "jsonschemabench"
DEFAULT_TOKENIZER = REPO / "models" / "SmolLM2-135M-Instruct"
# a string bounded in length: the one string rule of xgrammar's that admits raw control characters (the corpus
# sample's bounded strings sit beside free ones, which a random byte-level model rarely ends within the budget)
BOUNDED = {
    "type": "object",
    "properties": {"code": {"type": "string", "minLength": 1, "maxLength": 4}, "n": {"type": "integer"}},
    "required": ["code", "n"],
}
SEEDS = 8


def corpus_schema(name: str) -> dict:
    return json.loads((CORPUS / name).read_text())["schema"]


def engine_of(checkpoint: Path) -> Engine:
    return Engine.from_config(
        EngineConfig(
            checkpoint=str(checkpoint),
            max_slots=SEEDS,
            max_seq_len=256,
            device=TEST_DEVICE,
            dtype="float32",
            linear=os.environ.get("SPECGRAM_TEST_LINEAR", "auto"),
        )
    )


def sample_hot(engine: Engine, schema: dict | None, max_tokens: int):
    """SEEDS requests at temperature 1.5, half without speculation and half with k auto -> (texts that finished
    by stop, how many ran to max_tokens)."""
    guide = (
        dict(guide_type="json", guide="")
        if schema is None
        else dict(guide_type="json_schema", guide=json.dumps(schema))
    )
    outs = run(
        engine,
        ["Answer in JSON:"] * SEEDS,
        max_tokens=max_tokens,
        temperature=1.5,
        seed=list(range(SEEDS)),
        num_draft_tokens=[0, -1] * (SEEDS // 2),
        **guide,
    )
    assert all(o[-1].finish_reason in ("stop", "length") for o in outs)
    return [text_of(o) for o in outs if o[-1].finish_reason == "stop"], sum(
        o[-1].finish_reason == "length" for o in outs
    )


def assert_strict_and_valid(texts: list[str], schema: dict | None) -> None:
    import jsonschema

    for text in texts:
        value = json.loads(text)  # strict: no raw control character inside a string
        jsonschema.validate(value, schema if schema is not None else {"type": ["object", "array"]})


@pytest.fixture(scope="module")
def byte_engine(tmp_path_factory):
    engine = engine_of(save_checkpoint(tmp_path_factory.mktemp("json-bytes"), random_norms=True))
    yield engine
    engine.close()


@pytest.mark.parametrize(
    "schema",
    [
        None,
        BOUNDED,
        corpus_schema("BFCL_simple/BFCL_simple_11.json"),
        corpus_schema("Github_easy/Github_easy---o10086.json"),
    ],
    ids=["any-json", "bounded-string", "BFCL_simple_11", "Github_easy-o10086"],
)
def test_hot_byte_level_model_writes_strict_json(byte_engine, schema):
    finished, ran_out = sample_hot(byte_engine, schema, max_tokens=160)
    assert_strict_and_valid(finished, schema)
    assert len(finished) > ran_out, (len(finished), ran_out)


@pytest.fixture(scope="module")
def default_vocab_engine(tmp_path_factory):
    """A tiny random model over the default model's tokenizer (its whitespace tokens are what a bound must stop)."""
    if not DEFAULT_TOKENIZER.is_dir():
        pytest.skip("the default model's tokenizer is fetched by scripts/setup.sh")
    from specgram.model.source import open_source

    path = tmp_path_factory.mktemp("json-default-vocab")
    tok = open_source(DEFAULT_TOKENIZER).tokenizer()
    build_model(
        random_norms=True, vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id
    ).save_pretrained(path)
    tok.save_pretrained(path)
    engine = engine_of(path)
    yield engine
    engine.close()


@pytest.mark.parametrize(
    "schema",
    [corpus_schema("BFCL_simple/BFCL_simple_11.json"), corpus_schema("JME/JME_10.json")],
    ids=["BFCL_simple_11", "JME_10"],
)
def test_hot_model_on_a_real_vocabulary_does_not_wander_in_whitespace(default_vocab_engine, schema):
    finished, ran_out = sample_hot(default_vocab_engine, schema, max_tokens=96)
    assert_strict_and_valid(finished, schema)
    assert len(finished) > ran_out, (len(finished), ran_out)
