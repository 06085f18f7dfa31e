"""The side-by-side benchmark's workload and its result record, shared by every system's runner.

A case = one JME schema (the copy under tests/data/jsonschemabench/JME, part of the repository) turned into a
chat-templated extraction prompt ("Extract the record as JSON matching the schema. Record: <its first valid
instance> Schema: <schema>"). Every system gets the same prompt token ids, the same max_tokens, greedy decoding.

A run result (one system x configuration x concurrency) is a plain dict, JSON-serialisable so that the vLLM
worker (another venv) can produce it too:
    system, config, guided, drafter, k, concurrency, dtype, wall_s, drafted, accepted (None = not reported),
    requests: [{case, ids, text, ttft_s, latency_s, finish}]   (times from that request's submission)
"""
from __future__ import annotations

import glob
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the workload is the repository's own copy, so every machine benchmarks the same schemas
JME_DIR = REPO / "tests" / "data" / "jsonschemabench" / "JME"
INSTRUCTION = "Extract the record as JSON matching the schema. Record: {record} Schema: {schema}"


def load_jme(folder: str | None = None) -> list[dict]:
    """-> [{name, schema, guide (the schema as a JSON string), instance (first valid test or None)}]."""
    folder = folder or str(JME_DIR)
    files = sorted(glob.glob(f"{folder}/*.json"), key=lambda f: int(re.findall(r"\d+", Path(f).stem)[-1]))
    out = []
    for f in files:
        d = json.loads(Path(f).read_text())
        valid = [t["data"] for t in d.get("tests", []) if t.get("valid", True)]
        out.append(dict(name=Path(f).stem, schema=d["schema"], guide=json.dumps(d["schema"]),
                        instance=valid[0] if valid else None))
    return out


def prompt_text(item: dict) -> str:
    return INSTRUCTION.format(record=json.dumps(item["instance"]), schema=item["guide"])


def chat_ids(tok, text: str) -> list[int]:
    """The ids the engine builds for a request with apply_chat_template=True (its own prompt builder)."""
    from specgram.prompt import prompt_ids

    return prompt_ids(tok, text, None, chat=True)


def eos_ids(model: str, tok) -> set[int]:
    """The tokenizer's EOS and the checkpoint's generation_config EOS ids."""
    from transformers import GenerationConfig

    ids = {tok.eos_token_id}
    try:
        gen = GenerationConfig.from_pretrained(model).eos_token_id
        ids.update(gen if isinstance(gen, (list, tuple)) else [gen] if gen is not None else [])
    except OSError:
        pass
    return ids


def trim_at_eos(ids: list[int], eos: set[int]) -> list[int]:
    """Output ids up to, not including, the first EOS: one token count for every system."""
    out = []
    for t in ids:
        if t in eos:
            break
        out.append(t)
    return out


def select_cases(tok, n: int, max_tokens: int, items: list[dict] | None = None) -> list[dict]:
    """n evenly spaced JME schemas (of `items`, default load_jme()) whose reference instance takes at most 60% of
    max_tokens (so a correct answer fits); each with prompt text and ids added."""
    items = [it for it in (load_jme() if items is None else items) if it["instance"] is not None
             and len(tok(json.dumps(it["instance"]))["input_ids"]) <= 0.6 * max_tokens]
    chosen = items[::max(len(items) // n, 1)][:n]
    for it in chosen:
        it["prompt"] = prompt_text(it)
        it["prompt_ids"] = chat_ids(tok, it["prompt"])
    return chosen


def parse_json(text: str):
    """-> (ok, object): the whole output, or the text inside a ```json fence (how unguided models answer)."""
    text = text.strip()
    m = re.search(r"```(?:json)?\s*(.*?)```", text, re.S)
    for candidate in (text, m.group(1) if m else None):
        if candidate is None:
            continue
        try:
            return True, json.loads(candidate)
        except ValueError:
            pass
    return False, None


def is_valid(text: str, schema: dict) -> bool:
    """Parses (see parse_json) and validates against the schema (jsonschema)."""
    import jsonschema

    ok, obj = parse_json(text)
    if not ok:
        return False
    try:
        jsonschema.validate(obj, schema)
        return True
    except (jsonschema.exceptions.ValidationError, jsonschema.exceptions.SchemaError):
        return False


def job_for_worker(cases: list[dict]) -> list[dict]:
    """What a worker in another process needs of each case."""
    return [dict(name=c["name"], guide=c["guide"], prompt_ids=c["prompt_ids"]) for c in cases]
