"""What the unit tests share: driving an engine, target + draft engines on tiny checkpoints, pinning the EOS id,
and loading model.py (the exact distributions and the chi-square test: distributions.py)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import torch

from specgram.config import EngineConfig
from specgram.drafting import registry
from specgram.engine.engine import Engine
from specgram.engine.generate import generate
from specgram.request import SamplingParams

from . import fake_pb_utils as pb
from .tiny import save_checkpoint

MODEL_DIR = Path(__file__).resolve().parents[2] / "model_repository" / "llm"


# ---- driving an engine -------------------------------------------------------------------------------------


def assert_rows_bitwise_independent(runner) -> None:
    """A verify row's logits on `runner` (slots 0-3, 96 positions) are bitwise the same alone, at width 1, beside
    a prefill row, after a batched prefill and beside a prompt chunk in one forward_step."""
    prompt, other = list(range(10, 40)), list(range(50, 62))
    runner.forward_rows([prompt], [0], [0], last_only=True)
    alone = runner.forward_rows([[7, 8, 9]], [0], [30], last_only=False)[0]  # a verify row of width 3
    one = runner.forward_rows([[7]], [0], [30], last_only=False)[0]  # its first token, width 1
    assert torch.equal(alone[0], one[0])
    runner.forward_rows([prompt], [0], [0], last_only=True)
    mixed = runner.forward_rows([[7, 8, 9], other], [0, 2], [30, 0], last_only=False)[0]
    assert torch.equal(mixed[:3], alone)  # beside a prefill row
    runner.forward_rows([prompt, other + other], [0, 3], [0, 0], last_only=True)  # prefilled in a batch
    first, rest = runner.forward_step([other, [7, 8, 9]], [2, 0], [0, 30], n_last=1)  # beside a prompt chunk
    assert torch.equal(rest[0], alone)
    assert torch.equal(first[0], runner.forward_rows([other], [1], [0], last_only=True)[0])


def logits_against(reference, runner) -> tuple[torch.Tensor, float]:
    """60 seeded token ids prefilled on both runners (slot 0) -> (per-position relative error of runner's logits
    against reference's [60], the share of positions with the same top-1 token)."""
    ids = torch.randint(3, 259, (60,), generator=torch.Generator().manual_seed(0)).tolist()
    ref = reference.forward_rows([ids], [0], [0], last_only=False)[0]  # [60, V]
    got = runner.forward_rows([ids], [0], [0], last_only=False)[0]
    rel = (got - ref).norm(dim=-1) / ref.norm(dim=-1)  # per position
    return rel, (got.argmax(-1) == ref.argmax(-1)).float().mean().item()


def run_to_end(engine, requests):
    """Drive the engine until all requests finish; -> {request_id: [outputs]}."""
    return {g.request.request_id: g.outputs for g in generate(engine, requests).generations}


def run(engine, prompts, **params):
    """One request per prompt, submitted together; a list value (except `stop`) gives one value per request.
    -> each request's outputs, in prompt order."""
    per_request = [
        {k: (v[i] if isinstance(v, list) and k != "stop" else v) for k, v in params.items()}
        for i in range(len(prompts))
    ]
    reqs = [engine.make_request(SamplingParams(**p), text=t) for t, p in zip(prompts, per_request, strict=True)]
    outs = run_to_end(engine, reqs)
    return [outs[r.request_id] for r in reqs]


def seeded_samples(engine, prompt_ids, n, max_tokens, **params):
    """n requests of prompt_ids, seeds 0 .. n - 1, max_tokens each (ignore_eos), run together -> (each one's
    tokens as a tuple, each one's final speculation statistics)."""
    reqs = [
        engine.make_request(
            SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=i, **params), prompt_ids=prompt_ids
        )
        for i in range(n)
    ]
    outs = run_to_end(engine, reqs)
    return [tuple(tokens_of(outs[r.request_id])) for r in reqs], [outs[r.request_id][-1].spec for r in reqs]


def lines_all_accepted(stats) -> bool:
    """Whether every draft of the lines was accepted (a tree's branch drafts, sources alt and branch, aside: a
    perfect drafter's runner-ups are never the target's choice)."""
    return all(a == d for s in stats for src, (d, a) in s.by_source.items() if src not in ("alt", "branch"))


def tokens_of(outputs):
    return [t for o in outputs for t in o.token_ids]


def text_of(outputs):
    return "".join(o.text for o in outputs)


@contextlib.contextmanager
def pinned_eos(engine, eos: int):
    """The engine stops on `eos` alone, and min_tokens bans only it, while inside (the grammar compiler keeps its
    own stop tokens)."""
    saved = engine.output.eos_ids, engine.logits.eos_ids
    engine.output.eos_ids = engine.logits.eos_ids = {eos}
    try:
        yield
    finally:
        engine.output.eos_ids, engine.logits.eos_ids = saved


# prompts of the speculation tests: the second and third repeat themselves, so n-gram lookup has matches
PROMPTS = ["Hello there", "abcabc abcabc abc", "The quick brown fox jumps", "x"]


def wrong_and_right(root: Path) -> dict[str, Engine]:
    """Two tiny engines (96 positions): "wrong" drafts with other random weights (mostly rejected), "right"
    drafts with the target's own weights (every draft accepted)."""
    return {"wrong": target_and_draft(root, 96), "right": target_and_draft(root, 96, draft_seed=0)}


def target_and_draft(
    root: Path, max_seq_len: int, max_slots: int = 4, target_seed: int = 0, draft_seed: int = 11, **ckpt
) -> Engine:
    """A tiny target with a draft model of other random weights (mostly wrong drafts); draft_seed == target_seed
    drafts with the target itself (every draft right)."""
    target = save_checkpoint(root / f"target-{target_seed}", seed=target_seed, **ckpt)
    draft = save_checkpoint(root / f"draft-{draft_seed}", seed=draft_seed, **ckpt)
    return Engine.from_config(
        EngineConfig(
            checkpoint=str(target),
            draft_checkpoint=str(draft),
            max_slots=max_slots,
            max_seq_len=max_seq_len,
            linear=os.environ.get("SPECGRAM_TEST_LINEAR", "auto"),
        )
    )


def vocab4_target_and_draft(root: Path) -> Engine:
    """A target and draft over a vocabulary of 4 with flat logits (every token likely), 64 slots of 32 positions:
    small enough that the exact distribution of a few tokens can be enumerated and compared with thousands of
    samples in one batch."""
    return target_and_draft(root, 32, max_slots=64, target_seed=1, draft_seed=2, vocab_size=4, init=0.08)


def cheap_draft_model(monkeypatch, engine) -> None:
    """Freeze engine's step-cost model at a 30 ms step and a 2 ms draft forward: what a draft model much smaller
    than its target costs, where auto k drafts (the tiny test drafts cost what their targets do, where it need
    not draft at all); frozen (freeze)."""
    from specgram.speculation.costs import StepCosts

    costs = StepCosts()
    for _ in range(50):
        for n in (1, 2, 4, 8, 16):
            costs.record(n, 0.030 + 1e-4 * n)
    costs.draft_depth_s = 0.002
    costs.read_token_s = 0.0002  # a prompt read at 0.2 ms a token: cheap beside the drafts' gain
    freeze(monkeypatch, engine, costs)


def freeze(monkeypatch, engine, costs) -> None:
    """engine's planner costs, not updated by the engine's own timings while a test runs; the measured fallback
    (speculation/fallback.py) off: it would see the real costs, and the cost model alone is under test."""
    monkeypatch.setattr(costs, "record", lambda *a: None)
    monkeypatch.setattr(costs, "record_draft", lambda *a: None)
    monkeypatch.setattr(costs, "record_read", lambda *a: None)
    monkeypatch.setattr(engine.planner, "costs", costs)
    monkeypatch.setattr(engine.fallback, "enabled", False)


# ---- model.py with a fake triton_python_backend_utils -------------------------------------------------------


def config_parameters() -> dict:
    """The parameters block of config.pbtxt, parsed minimally (key/string_value pairs)."""
    text = (MODEL_DIR / "config.pbtxt").read_text()
    return {
        k: {"string_value": v}
        for k, v in re.findall(r'key:\s*"([^"]+)",\s*value:\s*{\s*string_value:\s*"([^"]*)"', text)
    }


def load_model_py(name: str = "llm_model"):
    """model.py as a module, with triton_python_backend_utils = the fake (left in sys.modules)."""
    sys.modules["triton_python_backend_utils"] = pb
    spec = importlib.util.spec_from_file_location(name, MODEL_DIR / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module._server_argv = pb.server_argv  # the fake server's command line: the model-control mode the test sets
    return module


def initialize_args(params: dict, kind: str = "CPU", device_id: str = "0") -> dict:
    return {
        "model_config": json.dumps({"parameters": params, "model_transaction_policy": {"decoupled": True}}),
        "model_repository": str(MODEL_DIR),
        "model_instance_kind": kind,
        "model_instance_device_id": device_id,
        "model_name": "llm",
        "model_version": "1",
    }


@functools.cache
def _reference(path: str, device: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()


def reference_model(engine) -> torch.nn.Module:
    """transformers' own float32 model of an engine's checkpoint, loaded whole (the engine's native forward never
    makes one: its weights are read straight into their served form), one per checkpoint and device."""
    return _reference(str(engine.config.checkpoint), str(engine.target.device))


def declare(name: str) -> None:
    """Declare a test's own drafter (drafting/registry.py): free, drafting alone (no lookups beside it)."""
    registry.register(registry.DrafterSpec(name, "a test's drafter", {name: 0.5}, consults=False))


def no_drafter(config) -> None:
    """A drafter's `make` that builds none (tests/unit/conftest.py: no suffix store by default)."""
    return None
