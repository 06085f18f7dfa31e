#!/usr/bin/env python3
"""perf_analyzer `--input-data` JSON files from the JSONSchemaBench JME schemas.

    python client/make_perf_inputs.py --out-dir /tmp/pa_inputs --max-tokens 48
    python client/make_perf_inputs.py --prompt extract --variants guided_k4 --out-dir /tmp/pa_inputs

One file per variant (guided/unguided x num_draft_tokens), named `<variant>.json`, each holding one
data entry per schema (perf_analyzer cycles through them):

    {"data": [{"text_input": ["..."], "stream": [true], "max_tokens": [48], "apply_chat_template": [true],
               "ignore_eos": [false], "num_draft_tokens": [4],
               "guided_decoding_guide_type": ["json_schema"], "guided_decoding_guide": ["{...}"]}, ...]}

Value formats perf_analyzer 2.51 accepts for the `llm` inputs (all `dims [1]`): STRING as a list of
JSON strings, BOOL as a list of JSON `true`/`false`, INT32 as a list of JSON integers.  Unguided
variants leave the two guide inputs out (they are optional), so the model runs unconstrained.

Prompts: `schema` (default) asks for a JSON object that conforms to the schema; `extract` also gives the
schema's reference values (tests[0].data) as plain "key: value" lines, as an extraction task.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from jme import load_jme

# name -> (guided, num_draft_tokens; -1 = auto: the engine chooses k per step)
VARIANTS = {
    "unguided_k0": (False, 0),
    "unguided_k2": (False, 2),
    "unguided_k4": (False, 4),
    "unguided_k8": (False, 8),
    "unguided_auto": (False, -1),
    "guided_k0": (True, 0),
    "guided_k2": (True, 2),
    "guided_k4": (True, 4),
    "guided_k8": (True, 8),
    "guided_auto": (True, -1),
}


def _flatten(value, prefix: str = "") -> list[str]:
    """Reference values as "path: value" lines (the facts of an extraction prompt)."""
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            out += _flatten(v, f"{prefix}{k}" if not prefix else f"{prefix}.{k}")
        return out
    if isinstance(value, list):
        if all(not isinstance(v, (dict, list)) for v in value):
            return [f"{prefix}: {', '.join(str(v) for v in value)}"]
        out = []
        for i, v in enumerate(value):
            out += _flatten(v, f"{prefix}[{i}]")
        return out
    return [f"{prefix}: {value}"]


def make_prompt(schema: dict, data, mode: str) -> str:
    schema_s = json.dumps(schema)
    if mode == "extract" and data is not None:
        facts = "\n".join(_flatten(data))
        return (
            "Extract the information below into a JSON object that conforms to this JSON schema:\n"
            f"{schema_s}\n\nInformation:\n{facts}\n\nRespond with the JSON object only."
        )
    title = schema.get("title") if isinstance(schema, dict) else None
    what = f"a {title} " if title else "a "
    return (
        f"Write {what}JSON object that conforms to this JSON schema:\n{schema_s}\n\nRespond with the JSON object only."
    )


def make_entries(
    schemas, guided: bool, k: int, max_tokens: int, prompt_mode: str, ignore_eos: bool = False
) -> list[dict]:
    entries = []
    for case in schemas:
        schema = case["schema"]
        e = {
            "text_input": [make_prompt(schema, case["instance"], prompt_mode)],
            "stream": [True],
            "max_tokens": [int(max_tokens)],
            "apply_chat_template": [True],
            "ignore_eos": [bool(ignore_eos)],
            "num_draft_tokens": [int(k)],
        }
        if guided:
            e["guided_decoding_guide_type"] = ["json_schema"]
            e["guided_decoding_guide"] = [json.dumps(schema)]
        entries.append(e)
    return entries


def write_inputs(
    out_dir: Path,
    variants: list[str],
    max_tokens: int,
    prompt_mode: str = "schema",
    limit: int | None = None,
    ignore_eos: bool = False,
) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    schemas = load_jme(limit)
    if not schemas:
        raise SystemExit("no JME schemas in tests/data/jsonschemabench/JME")
    paths = {}
    for v in variants:
        guided, k = VARIANTS[v]
        p = out_dir / f"{v}.json"
        p.write_text(
            json.dumps({"data": make_entries(schemas, guided, k, max_tokens, prompt_mode, ignore_eos)}, indent=1)
        )
        paths[v] = p
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--prompt", choices=["schema", "extract"], default="schema")
    ap.add_argument("--ignore-eos", action="store_true", help="fixed-length generations (unguided only makes sense)")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N schemas")
    args = ap.parse_args()
    for v, p in write_inputs(
        args.out_dir, args.variants, args.max_tokens, args.prompt, args.limit, args.ignore_eos
    ).items():
        print(f"{v}: {p}")


if __name__ == "__main__":
    main()
