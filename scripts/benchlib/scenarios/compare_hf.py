"""The compare scenario's HF transformers peer: `generate` on the same checkpoint, as users run it without a server.

Rows: target only (greedy); JSON-schema guided with xgrammar's own HF logits processor
(xgrammar.contrib.hf.LogitsProcessor); prompt lookup (`prompt_lookup_num_tokens`, HF's n-gram drafter); an
assistant model (`assistant_model` = the same int8 dynamic-quantized copy of the target our engine drafts with).
Concurrency c > 1 = one padded batch of c prompts per generate() call (HF has no continuous batching);
HF's assisted generation (both drafters) supports batch 1 only. Guided + speculative is not offered: the
xgrammar processor advances its matcher by one token per call and has no rollback, while assisted decoding
calls the processors once per candidate position, so drafted tokens would be accepted into the grammar state
and never rolled back.
"""

from __future__ import annotations

import copy
import time

import torch

from ..run import record
from ..workload import trim_at_eos

# config name -> generate() keyword arguments beyond greedy / max_new_tokens (None: built at run time)
CONFIGS = {
    "target only": {},
    "ngram k4": {"prompt_lookup_num_tokens": 4},
    "int8 draft k2": None,
}
UNSUPPORTED = {
    ("ngram k4", True): "xgrammar's HF processor cannot roll back drafted tokens",
    ("int8 draft k2", True): "xgrammar's HF processor cannot roll back drafted tokens",
}


class StepClock:
    """A StoppingCriteria that never stops: it timestamps every generation step and the length reached, so
    TTFT and per-row finish times can be read off afterwards."""

    def __init__(self):
        self.marks: list[tuple[float, int]] = []

    def __call__(self, input_ids, scores, **kwargs):
        self.marks.append((time.perf_counter(), input_ids.shape[1]))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def load(model_path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    return tok, model


def int8_assistant(model):
    from specgram.model.quantize import quantize_dynamic_int8

    return quantize_dynamic_int8(model)


@torch.inference_mode()
def run(
    tok, model, cases, config, guided, concurrency, max_tokens, eos: set[int], assistant=None, compiler=None
) -> dict:
    import xgrammar as xgr
    from transformers import StoppingCriteriaList

    kwargs = (
        dict(CONFIGS[config])
        if CONFIGS[config] is not None
        else {"assistant_model": assistant, "num_assistant_tokens": 2, "num_assistant_tokens_schedule": "constant"}
    )
    reqs = []
    t_start = time.perf_counter()
    for lo in range(0, len(cases), concurrency):
        group = list(range(lo, min(lo + concurrency, len(cases))))
        width = max(len(cases[i]["prompt_ids"]) for i in group)
        ids = torch.full((len(group), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for row, i in enumerate(group):
            p = cases[i]["prompt_ids"]
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        procs = []
        if guided:  # the same compile options as our engine's defaults (json_any_whitespace 1, json_strict 1)
            grammars = [
                compiler.compile_json_schema(cases[i]["guide"], any_whitespace=True, strict_mode=True) for i in group
            ]
            procs = [xgr.contrib.hf.LogitsProcessor(grammars)]
        clock = StepClock()
        t0 = time.perf_counter()
        # a fresh GenerationConfig per call: generate() must not inherit a previous call's drafting settings
        gen_cfg = copy.deepcopy(model.generation_config)
        gen_cfg.update(
            **{
                "max_new_tokens": max_tokens,
                "do_sample": False,
                "pad_token_id": tok.pad_token_id,
                "prompt_lookup_num_tokens": None,
                **{k: v for k, v in kwargs.items() if k != "assistant_model"},
            }
        )
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            generation_config=gen_cfg,
            logits_processor=procs,
            stopping_criteria=StoppingCriteriaList([clock]),
            assistant_model=kwargs.get("assistant_model"),
        )
        end = time.perf_counter()
        for row, i in enumerate(group):
            gen = trim_at_eos(out[row, width:].tolist(), eos)
            # this row's last token (or its EOS) exists once the sequence reached width + len(gen) + 1
            need = width + min(len(gen) + 1, max_tokens)
            finished_at = next((t for t, n in clock.marks if n >= need), end)
            reqs.append(
                dict(
                    case=i,
                    ids=gen,
                    text=tok.decode(gen, skip_special_tokens=True),
                    ttft_s=clock.marks[0][0] - t0 if clock.marks else end - t0,
                    latency_s=finished_at - t0,
                    finish="length" if len(gen) >= max_tokens else "stop",
                )
            )
    wall = time.perf_counter() - t_start
    # no drafted / accepted counts: generate() does not report them
    return record(reqs, wall, concurrency, system="HF transformers", config=config, guided=guided, dtype="float32")
