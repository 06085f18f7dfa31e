"""The checks on the served engine itself: identical ids across draft lengths, batch and adapters, a guided
answer, and a decode step against the memory bound."""

from __future__ import annotations

import json
import time

import torch

from ..drafting import registry
from .common import SCHEMA, TOKENS, Row, first_diff, gib


def _ids(engine, prompt_ids, k: int, drafter=None, lora=None, guide: str | None = None, max_tokens: int = TOKENS):
    """Each prompt's greedy ids through the engine, all submitted together -> (ids, final outputs, texts).
    Unguided requests run to max_tokens (ignore_eos); a guided one ends where its grammar does."""
    from ..engine.generate import generate
    from ..request import SamplingParams

    params = dict(max_tokens=max_tokens, num_draft_tokens=k, drafter=drafter, lora_name=lora)
    if guide is None:
        params["ignore_eos"] = True
    else:
        params.update(guide_type="json_schema", guide=guide, guide_options=(("json_any_whitespace", False),))
    reqs = [engine.make_request(SamplingParams(**params), prompt_ids=list(p)) for p in prompt_ids]
    run = generate(engine, reqs)
    gens = run.generations
    return [g.token_ids for g in gens], [g.final for g in gens], [g.text for g in gens]


def check_engine(engine, prompt_ids: list[list[int]], adapters: list[str]) -> tuple[list[Row], list[list[int]]]:
    """The engine's own exactness (draft lengths, batch, adapters), a guided answer, and a decode's speed."""
    rows, base = [], None
    drafter = next((n for n in engine.drafters if registry.DRAFTERS[n].forward), None)  # a draft model, if any
    for lora in [None, *adapters]:
        alone = [_ids(engine, [p], 0, lora=lora)[0][0] for p in prompt_ids]
        base = base or alone
        tried = [(f"k={k}", [_ids(engine, [p], k, drafter, lora)[0][0] for p in prompt_ids]) for k in (4, -1)]
        tried.append(("batched, k=auto", _ids(engine, prompt_ids, -1, lora=lora)[0]))
        for name, got in tried:
            bad = next((i for i, (a, g) in enumerate(zip(alone, got, strict=True)) if a != g), None)
            what = f"{name} vs k=0 alone" + (f", adapter {lora}" if lora else "")
            detail = "identical ids" if bad is None else (
                f"prompt {bad}: first differing position {first_diff(alone[bad], got[bad])}"
            )  # fmt: skip
            hint = "speculation must be exact: serve with default_num_draft_tokens 0 and report the checkpoint"
            rows.append(Row("exact", what, bad is None, detail, "" if bad is None else hint))
    rows.append(_guided(engine, prompt_ids[0]))
    rows.append(_speed(engine, prompt_ids[0]))
    return rows, base


def _guided(engine, prompt: list[int]) -> Row:
    import jsonschema

    (_,), (final,), (text,) = _ids(engine, [prompt], -1, guide=json.dumps(SCHEMA), max_tokens=96)
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
        return Row("guided", "json_schema, k=auto", True, f"valid: {text.strip()[:60]}")
    except (ValueError, jsonschema.ValidationError) as e:
        why = final.error or f"finish_reason {final.finish_reason}, {type(e).__name__}"
        return Row("guided", "json_schema, k=auto", False, f"{why}: {text[:60]!r}", "report the checkpoint")


def _bandwidth() -> float:
    """A plain read's bytes per second here (the best of a few sums of a 256 MiB buffer)."""
    buf = torch.ones(64 * 2**20)
    best = float("inf")
    for _ in range(4):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return buf.numel() * 4 / best


def _weight_bytes(runner) -> int:
    """What a decode step streams: the matmul weights in their served form (with scales)."""
    if runner.native is not None:
        mods = runner.native.linear_layers()
        return sum(b.numel() * b.element_size() for m in mods for b in m.buffers() if b is not None)
    from ..model.choice import projections

    return sum(p.numel() * p.element_size() for m in projections(runner.model) for p in m.parameters())


def _speed(engine, prompt: list[int]) -> Row:
    if engine.device.type != "cpu":
        return Row("speed", f"decode ({engine.device})", None, "the memory bound is measured on the CPU only")
    from ..engine.generate import generate
    from ..request import SamplingParams

    req = engine.make_request(SamplingParams(max_tokens=32, ignore_eos=True, num_draft_tokens=0), prompt_ids=prompt)
    run = generate(engine, [req])
    step = sorted(run.step_s[2:])[len(run.step_s[2:]) // 2]  # the median decode step (past prefill)
    bw, weights = _bandwidth(), _weight_bytes(engine.target)
    bound = weights / bw
    detail = f"{step * 1e3:.1f} ms/step = {step / bound:.2f}x the bound ({gib(weights)} at {bw / 1e9:.0f} GB/s)"
    return Row("speed", f"decode, one stream ({engine.target.linear_kind})", None, detail)
