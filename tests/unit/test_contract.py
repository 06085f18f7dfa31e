"""The client contract is declared once (specgram/contract.py): config.pbtxt, the parser, the client and
docs/api.md must agree with it."""

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from specgram.drafting import registry
from specgram.request import SamplingParams
from specgram.serving import contract, protocol

REPO = Path(__file__).resolve().parents[2]


def _pbtxt_block(text: str, kind: str) -> list[dict]:
    """`input [ {...}, ... ]` or `output [...]` of config.pbtxt -> one dict per entry (name, data_type, dims,
    optional); a minimal parser for this file's one-entry-per-line form."""
    block = re.search(rf"^{kind}\s*\[(.*?)^\]", text, re.S | re.M)
    assert block, f"config.pbtxt has no {kind} block"
    entries = []
    for body in re.findall(r"\{([^{}]*)\}", block.group(1)):
        fields = dict(re.findall(r"(\w+):\s*(\"[^\"]*\"|\[[^\]]*\]|\w+)", body))
        entries.append(
            {
                "name": fields["name"].strip('"'),
                "dtype": fields["data_type"].removeprefix("TYPE_"),
                "dims": tuple(int(d) for d in fields["dims"].strip("[]").split(",")),
                "optional": fields.get("optional", "false") == "true",
            }
        )
    return entries


def _table(fields) -> list[dict]:
    return [{"name": f.name, "dtype": f.dtype, "dims": f.dims, "optional": f.optional} for f in fields]


@pytest.mark.parametrize("kind, fields", [("input", contract.INPUTS), ("output", contract.OUTPUTS)])
def test_config_pbtxt_declares_exactly_the_contract(kind, fields):
    text = (REPO / "model_repository" / "llm" / "config.pbtxt").read_text()
    declared = _pbtxt_block(text, kind)
    assert len(declared) == len(fields) > 0
    assert sorted(declared, key=lambda e: e["name"]) == sorted(_table(fields), key=lambda e: e["name"])


def test_pbtxt_parser_sees_a_disagreement():
    text = (REPO / "model_repository" / "llm" / "config.pbtxt").read_text()
    broken = text.replace('name: "top_k", data_type: TYPE_INT32', 'name: "top_k", data_type: TYPE_FP32')
    assert broken != text
    assert _pbtxt_block(broken, "input") != _pbtxt_block(text, "input")


def test_api_doc_table_is_the_generated_one(monkeypatch):
    # the contract as served without plug-ins: only this package's drafters (tests register drafters of their own)
    builtin = {n: s for n, s in registry.DRAFTERS.items() if n in registry.BUILTIN}
    monkeypatch.setattr(registry, "DRAFTERS", builtin)
    spec = importlib.util.spec_from_file_location("contract_table", REPO / "scripts" / "contract_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    block = module.doc_block((REPO / "docs" / "api.md").read_text(encoding="utf-8"))
    assert block, "docs/api.md lacks the contract table markers"
    assert block == contract.markdown(), "docs/api.md is stale: run python scripts/contract_table.py --write"


def test_every_option_has_a_check_and_parameters_exist():
    names = [f.name for f in contract.INPUTS]
    assert len(set(names)) == len(names)
    sp_fields = {f.name for f in dataclasses.fields(SamplingParams)}
    for f in contract.INPUTS:
        if f.option:
            assert f.convert is not None, f.name
        if f.param is not None:
            assert f.option and f.param in sp_fields, f.name
    switches = {n for n in contract.INPUT if n.startswith("return_")}  # vllm_backend's: input tensors only
    assert switches and set(protocol._SWITCHES) == switches and all(contract.INPUT[n].convert for n in switches)
    sampling_keys = {f.name for f in contract.SAMPLING_KEYS}  # sampling_parameters keys, not inputs
    assert sampling_keys and not sampling_keys & set(contract.INPUT)
    assert (
        set(protocol.OPTIONS)
        == ({f.name for f in contract.INPUTS} - {"text_input", "sampling_parameters"} - switches) | sampling_keys
    )


def test_client_dtypes_come_from_the_contract():
    sys.path.insert(0, str(REPO / "client"))
    try:
        import stream_client
    finally:
        sys.path.remove(str(REPO / "client"))
    assert stream_client.INPUT_DTYPES == {
        f.name: ("BYTES" if f.dtype == "STRING" else f.dtype) for f in contract.INPUTS
    }
    assert set(stream_client.SCALAR_OUTPUTS) == {f.name for f in contract.OUTPUTS if f.dims == (1,)}
