"""What the scenarios send: JME extraction cases, plain prompts, the engine settings every benchmark shares,
greedy requests, configuration choice; and what they check: percentiles, JSON validity.

A case is a dict with at least prompt_ids (the chat-templated prompt's token ids); JME cases also carry
name, schema, guide (the schema as a JSON string), instance and prompt (the text). Standard library only at
import (scripts/compare/vllm_worker.py imports this module in vLLM's venv).
"""

from __future__ import annotations

import json
import re

from jme import load_jme  # noqa: F401  (the one case loader: the repository's copy, by case number)

INSTRUCTION = "Extract the record as JSON matching the schema. Record: {record} Schema: {schema}"

# Engine settings every benchmark shares: a few JME schemas use keywords the grammar engine would not enforce
# (e.g. properties next to oneOf), which the server refuses by default; benchmarks measure speed on the whole
# workload, so they compile those schemas best effort. Benchmarks send the same prompts run after run: with
# prompt-prefix reuse on, a later run would skip prefills an earlier one paid for, so configurations compare
# with it off (the prefix_cache scenario measures the reuse itself).
BENCH_ENGINE = {"json_unsupported_keywords": "ignore", "prefix_cache": "off"}
SERVED = "served"  # make_requests' drafter: no drafter or num_draft_tokens in the request (the engine's defaults)

# open-ended chat prompts (serving, soak)
CHAT_PROMPTS = [
    "Write a short story about a robot.",
    "Explain how rainbows form.",
    "List ten fruits and their colors.",
    "Describe the water cycle.",
    "What makes a good cup of coffee?",
    "Summarize the history of Rome.",
    "Give tips for learning to code.",
    "Describe a walk in the forest.",
]

# extraction / JSON / code edits whose prompt holds text to copy, so n-gram lookup has something to find
COPY_PROMPTS = [
    "Extract the people in this text as a JSON list of objects with keys name, age and city. Text: Alice Smith is 34 "
    "and lives in Paris. Bob Jones is 27 and lives in Berlin. Carol White is 45 and lives in Madrid.",
    "Rename the variable x to total in this Python code and return the whole code:\n```python\n"
    "def order_value(items):\n    x = 0\n    for item in items:\n        x += item.price * item.quantity\n"
    "    return x\n```",
    "Convert this CSV to a JSON array of objects:\nname,color,price\napple,red,1.2\nbanana,yellow,0.5\ncherry,red,3.0\n"
    "grape,purple,2.1",
    "Return a JSON object describing this book, with keys title, author, year, genre and pages. Title: The Hobbit. "
    "Author: J. R. R. Tolkien. Year: 1937. Genre: Fantasy. Pages: 310.",
    "Turn this into a Markdown table with columns Country and Capital: France - Paris, Germany - Berlin, "
    "Italy - Rome, Spain - Madrid, Portugal - Lisbon, Greece - Athens.",
    "Fix the spelling mistakes in this text and return the corrected text: The quik brown fox jumpd over the lazy "
    "dog. It was a suny day and the fox was very hapy to be outside in the feild.",
    "Add type hints and a docstring to this Python function and return it:\n```python\ndef mean(values):\n"
    "    if not values:\n        return 0.0\n    return sum(values) / len(values)\n```",
    "List the steps of this recipe as a numbered list, one step per line: First boil a pot of salted water. Then add "
    "the pasta. Cook it for ten minutes. Drain the pasta. Add the tomato sauce, stir, and serve with cheese.",
]

# one instruction applied to a stream of related inputs (serving --prompt-set repeat): the answers share most of
# their text with each other (the signature, the docstring's layout, the loop), little with their own prompt
REPEAT_TASKS = [
    ("total", "sum"),
    ("mean", "arithmetic mean"),
    ("largest", "largest value"),
    ("smallest", "smallest value"),
    ("median", "median"),
    ("product", "product"),
    ("spread", "difference between the largest and smallest value"),
    ("positives", "number of positive values"),
    ("negatives", "number of negative values"),
    ("evens", "number of even values"),
    ("odds", "number of odd values"),
    ("squares", "sum of the squares"),
    ("cubes", "sum of the cubes"),
    ("first_negative", "first negative value, or None"),
    ("last_positive", "last positive value, or None"),
    ("doubled", "list of every value doubled"),
    ("halved", "list of every value halved"),
    ("absolute", "list of the absolute values"),
    ("rounded", "list of the values rounded to integers"),
    ("running_total", "list of running totals"),
    ("deduplicated", "list of the values without duplicates, in their first order"),
    ("sorted_desc", "list of the values sorted from largest to smallest"),
    ("zeros", "number of zeros"),
    ("mean_of_positives", "mean of the positive values, or 0.0 when there are none"),
]
REPEAT_PROMPTS = [
    f"Write a Python function `{name}(values)` that returns the {what} of a list of numbers. Give it type hints "
    "and a docstring. Reply with the code only."
    for name, what in REPEAT_TASKS
]


def prompt_text(item: dict) -> str:
    return INSTRUCTION.format(record=json.dumps(item["instance"]), schema=item["guide"])


def chat_ids(tok, text: str) -> list[int]:
    """The ids the engine builds for a request with apply_chat_template=True (its own prompt builder)."""
    from specgram.engine.prompt import prompt_ids

    return prompt_ids(tok, text, None, chat=True)


def select_cases(tok, n: int, max_tokens: int, items: list[dict] | None = None) -> list[dict]:
    """n evenly spaced JME cases (of `items`, default load_jme()) whose reference instance takes at most 60% of
    max_tokens (so a correct answer fits); each with prompt text and ids added."""
    items = [
        it
        for it in (load_jme() if items is None else items)
        if it["instance"] is not None and len(tok(json.dumps(it["instance"]))["input_ids"]) <= 0.6 * max_tokens
    ]
    chosen = items[:: max(len(items) // n, 1)][:n]
    for it in chosen:
        it["prompt"] = prompt_text(it)
        it["prompt_ids"] = chat_ids(tok, it["prompt"])
    return chosen


def text_cases(tok, prompts: list[str]) -> list[dict]:
    """Cases from plain prompts (no guide)."""
    return [dict(name=f"prompt_{i}", prompt=p, prompt_ids=chat_ids(tok, p)) for i, p in enumerate(prompts)]


def eos_ids(model: str, tok) -> set[int]:
    """The EOS ids the engine stops on for this checkpoint (specgram.engine.loading)."""
    from specgram.engine.loading import checkpoint_eos_ids
    from specgram.model.source import open_source

    return checkpoint_eos_ids(open_source(model), tok)


def trim_at_eos(ids: list[int], eos) -> list[int]:
    """Output ids up to, not including, the first EOS: one token count for every system."""
    out = []
    for t in ids:
        if t in eos:
            break
        out.append(t)
    return out


def make_requests(
    engine,
    cases: list[dict],
    max_tokens: int,
    drafter: str | None = None,
    k: int = 0,
    guided: bool = False,
    seeds: list[int] | None = None,
    **params,
) -> list:
    """Requests, one per case (guided: with the case's json_schema guide), greedy unless params set a temperature;
    seeds[i]: case i's seed. The grammars' compiles have finished when this returns, so a timed run that follows
    excludes them."""
    from specgram.request import SamplingParams

    reqs = []
    for i, c in enumerate(cases):
        settings = dict(
            max_tokens=max_tokens,
            temperature=0.0,
            num_draft_tokens=None if drafter == SERVED else k,
            drafter=None if drafter == SERVED else drafter or "ngram",
            guide_type="json_schema" if guided else None,
            guide=c["guide"] if guided else None,
            seed=seeds[i] if seeds else None,
            **({"cache_salt": c["cache_salt"]} if "cache_salt" in c else {}),
        )
        reqs.append(engine.make_request(SamplingParams(**{**settings, **params}), prompt_ids=c["prompt_ids"]))
    for r in reqs:
        if r.pending_grammar is not None:
            r.pending_grammar.future.result()
    return reqs


def compile_guide(engine, guide: str):
    """What a request pays for a json_schema guide: checked, compiled (in a worker, then in the engine process)
    or found in the engine's cache, which it then fills. Raises InvalidRequest."""
    return engine.grammar.submit(engine.grammar.check("json_schema", guide), guide).future.result()


def choose(text: str, known: dict, required: tuple[str, ...] = ()) -> list[str]:
    """'a,b' -> the named configurations in `known`'s order, with the `required` reference ones always in."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown configs {unknown}; known: {list(known)}")
    names += [r for r in required if r not in names]
    return sorted(names, key=list(known).index)


def pct(values: list[float], q: float) -> float:
    """The q-th percentile, linear between the two nearest ranks (numpy's default); nan when empty."""
    if not values:
        return float("nan")
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    lo, frac = int(pos), pos - int(pos)
    return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * frac


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
    """Valid JSON, in every published table: parses (see parse_json) and validates against the schema."""
    import jsonschema

    ok, obj = parse_json(text)
    if not ok:
        return False
    try:
        jsonschema.validate(obj, schema)
        return True
    except (jsonschema.exceptions.ValidationError, jsonschema.exceptions.SchemaError):
        return False
