"""The checks against transformers: each forward's logits, and the served greedy ids."""

from __future__ import annotations

import gc

import torch

from .common import TOL, Row, first_diff


def check_logits(source, label: str, ref, dtype, settings, max_seq_len: int, prompt_ids) -> list[Row]:
    """Each forward's prefill, decode and verify rows of the checkpoint `source` (model/source.py; loaded in
    `dtype`, as served) against `ref`, transformers' float32 model of it."""
    from ..engine.loading import model_of
    from ..errors import ModelLoadError
    from ..model import reference
    from ..model.choice import choose
    from ..model.runner import ModelRunner

    rows = []
    for kind in ("native", "torch"):
        weights = settings.target.weights if kind == "native" and label == "target" else "auto"
        model, tensors = model_of(source, settings.device, dtype, kind == "native")  # as the engine loads it
        try:
            choice = choose(model.config, settings.device, dtype, linear=kind, weights=weights)
        except ModelLoadError as e:
            rows.append(Row("logits", f"{label}, {kind}", None, f"not run here: {e}"))
            continue
        runner = ModelRunner(model, len(prompt_ids), max_seq_len, choice, tensors=tensors)
        extra = [[11, 12, 13, 14]] + [[15]] * (len(prompt_ids) - 1)  # a verify row of 4 beside decode rows of 1
        got = [runner.forward_rows(prompt_ids, list(range(len(prompt_ids))), [0] * len(prompt_ids), False)]
        got.append(runner.forward_rows(extra, list(range(len(prompt_ids))), [len(p) for p in prompt_ids], False))
        diff, agree, total, scale = 0.0, 0, 0, 0.0
        for b, p in enumerate(prompt_ids):
            want = reference.logits(ref, p + extra[b], max_seq_len)
            mine = torch.cat([got[0][b, : len(p)], got[1][b, : len(extra[b])]]).float().cpu()
            diff, scale = max(diff, float((mine - want).abs().max())), max(scale, float(want.abs().max()))
            agree += int((mine.argmax(-1) == want.argmax(-1)).sum())
            total += len(want)
        lossy = weights != "auto"
        ok = None if lossy else diff <= TOL.get(runner.dtype, TOL[torch.bfloat16]) * max(scale, 1.0)
        detail = f"max abs diff {diff:.2e} (logits up to {scale:.1f}), top-1 {agree}/{total}" + (
            f", {weights}: lossy, not judged" if lossy else ""
        )
        hint = "" if ok is not False else (
            "the PyTorch forward agrees: serve with linear torch and report the checkpoint"
            if kind == "native" else "this checkpoint sets something its family reader (model/families.py) misses"
        )  # fmt: skip
        rows.append(Row("logits", f"{label}, {kind}", ok, detail, hint))
        del runner, model
        gc.collect()
    return rows


def check_greedy(ref, dtype, max_seq_len: int, prompt_ids, served: list[list[int]], lossy: bool) -> list[Row]:
    """The served greedy ids against `ref`'s (transformers, float32); a first difference where transformers' own
    top-2 gap is within the served dtype's tolerance is a tie, named and not failed."""
    from ..model import reference

    rows = []
    for i, (p, got) in enumerate(zip(prompt_ids, served, strict=True)):
        want, gaps = reference.greedy(ref, p, len(got), max_seq_len)
        at = first_diff(want, got)
        tie = at < len(want) and gaps[at] <= TOL.get(dtype, TOL[torch.bfloat16])
        ok = None if lossy else (at == len(want) or tie)
        detail = "equal" if at == len(want) else f"first differing position {at} (relative top-2 gap {gaps[at]:.1e})"
        if tie:
            detail += ": a tie within float error"
        rows.append(Row("greedy", f"prompt {i} vs transformers", ok, detail, "" if ok is not False else "see logits"))
    return rows
