"""Would a shallower copy of the target draft well (self-speculation by layer skipping)? Teacher-forced agreement
of layer subsets of the target with the whole target, beside a draft model's, in process (HF transformers, the
checkpoint's own dtype), one run.

    python scripts/bench.py layer_skip --model models/Qwen2.5-Coder-1.5B-Instruct \
        --draft models/Qwen2.5-Coder-0.5B-Instruct          # 4 chat prompts, 96 tokens (~3 min on 2 cores)
    python scripts/bench.py layer_skip --quick              # 1 prompt, 16 tokens: a smoke run

The whole target writes --max-tokens tokens greedily for each chat prompt. Then, one forward per subset over each
prompt and its answer, a model that runs only the subset's decoder layers (in order, then the final norm and the
head) picks its most likely token at each answer position: alpha = the share of positions where that is the token
the whole target wrote next, i.e. a first draft's acceptance under greedy verification, each position given the
target's own prefix (a draft deeper in a line is accepted at most that often). A draft model's alpha the same way.
A subset's draft forward reads its share of the layers' weights and the head, so it pays only where its alpha is
high for that share: the docs weigh both against the step's costs (docs/performance.md).
Subsets (--subsets, specs over layers 0 .. L-1): first:N (layers 0 .. N-1), skip:A-B (all but A .. B), odd:A-B (all
but the odd layers of A .. B); the default set spreads over L. Each subset runs with a cache of its own over the
prefix: a served drafter that skipped layers would read the target's cache at the layers it keeps after a gap, so the
skip and odd rows describe that drafter only approximately (the first:N rows exactly).
"""

from __future__ import annotations

from pathlib import Path

from .. import report
from ..workload import CHAT_PROMPTS, chat_ids

SHARED = {"prompts": 4, "max_tokens": 96}
QUICK = {"prompts": 1, "max_tokens": 16}
QUICK_HELP = "1 prompt, 16 tokens"


def add_options(ap) -> None:
    ap.add_argument("--draft", default="", help="a draft model folder (same tokenizer) to set beside the subsets")
    ap.add_argument("--subsets", nargs="+", default=[], help="first:N, skip:A-B, odd:A-B (default: a spread over L)")


def default_subsets(n: int) -> list[str]:
    """A spread for n layers (for 28: first 14, 20, 24; skip 12-19, 16-23, 20-25, 22-25; odd 4-23, 8-25)."""

    def at(f: float) -> int:
        return round(n * f)

    return [
        f"first:{at(1 / 2)}",
        f"first:{at(5 / 7)}",
        f"first:{at(6 / 7)}",
        f"skip:{at(3 / 7)}-{at(5 / 7) - 1}",
        f"skip:{at(4 / 7)}-{at(6 / 7) - 1}",
        f"skip:{at(5 / 7)}-{at(13 / 14) - 1}",
        f"skip:{at(11 / 14)}-{at(13 / 14) - 1}",
        f"odd:{at(1 / 7)}-{at(6 / 7) - 1}",
        f"odd:{at(2 / 7)}-{at(13 / 14) - 1}",
    ]


def keep(spec: str, n: int) -> list[int]:
    """A subset spec -> the layer indices it keeps, in order."""
    kind, _, arg = spec.partition(":")
    lo, _, hi = arg.partition("-")
    try:
        if kind == "first" and not hi and 0 < int(arg) < n:
            return list(range(int(arg)))
        a, b = int(lo), int(hi)
    except ValueError:
        a = b = -1
    if kind == "skip" and 0 <= a <= b < n and b - a + 1 < n:
        return [i for i in range(n) if not a <= i <= b]
    if kind == "odd" and 0 <= a <= b < n:
        return [i for i in range(n) if not (a <= i <= b and i % 2)]
    raise SystemExit(f"--subsets: {spec!r} is not first:N, skip:A-B or odd:A-B over {n} layers (0 <= A <= B < {n})")


def agreement(model, seqs: list[tuple[int, object]]) -> float:
    """Share of answer positions where model's most likely next token is the one the target wrote."""
    import torch

    hit = total = 0
    with torch.no_grad():
        for n, ids in seqs:
            pred = model(ids, use_cache=False).logits[0, n - 1 : ids.shape[1] - 1].argmax(-1)
            hit += int((pred == ids[0, n:]).sum())
            total += ids.shape[1] - n
    return hit / max(total, 1)


def run(args) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype="auto").eval()
    layers, n = model.model.layers, model.config.num_hidden_layers
    types = getattr(model.config, "layer_types", None)  # per layer: its attention's mask (and RoPE) where they differ
    seqs = []
    with torch.no_grad():
        for p in CHAT_PROMPTS[: args.prompts]:
            ids = torch.tensor([chat_ids(tok, p)])
            out = model.generate(ids, max_new_tokens=args.max_tokens, do_sample=False, repetition_penalty=1.0)
            seqs.append((ids.shape[1], out))  # plain greedy: no penalty a checkpoint's generation config may set
    answered = sum(s.shape[1] - k for k, s in seqs)
    rows = []
    for spec in ["all", *(args.subsets or default_subsets(n))]:
        kept = list(range(n)) if spec == "all" else keep(spec, n)
        # the kept layers in order, each with its own attention type (the model reads them by position); the rest of
        # the model as it is
        model.model.layers = torch.nn.ModuleList([layers[i] for i in kept])
        model.config.num_hidden_layers = len(kept)
        if types is not None:
            model.config.layer_types = [types[i] for i in kept]
        try:
            a = agreement(model, seqs)
        finally:
            model.model.layers, model.config.num_hidden_layers = layers, n
            if types is not None:
                model.config.layer_types = types
        report.log(f"{spec}: {len(kept)}/{n} layers, alpha {a:.3f}")
        rows.append([spec if spec != "all" else "all (the target)", f"{len(kept)} / {n}", f"{a:.3f}"])
    if args.draft:
        draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype="auto").eval()
        a = agreement(draft, seqs)
        rows.append([f"draft model {Path(args.draft).name}", "-", f"{a:.3f}"])
    lines = report.header(
        "Layer-skipping drafts: teacher-forced agreement with the whole target",
        args,
        f"{Path(args.model).name}, {len(seqs)} chat prompts, greedy answers of up to {args.max_tokens} tokens "
        f"({answered} answer positions); HF transformers, the checkpoint's dtype",
    )
    lines += [*report.table(["layers run", "layers kept", "alpha"], rows), ""]
    lines += [
        "alpha: the share of answer positions where the subset's (or draft model's) most likely next token is the",
        "one the whole target wrote there, each given the target's own prefix: a first draft's acceptance.",
    ]
    report.write(args, lines, dict(rows=rows))
