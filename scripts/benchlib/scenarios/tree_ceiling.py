"""What trees of drafts could add at best: at each step where a line fails, whether the drafters held the target's
token as an alternative there, and what that is worth.

    python scripts/bench.py tree_ceiling                      # chat and guided prompts, one stream (~20 s)
    python scripts/bench.py tree_ceiling --quick              # 2 prompts of each, 32 tokens: a smoke run

The served default in process (drafter auto: the int8 copy with lookup, auto draft length, fp32 target), greedy,
one request at a time, lines only: each step's drafters keep their tree material (the draft model's runner-up at
every draft from 1% probability; further n-gram matches; the lookup drafts that lost to the draft model) but verify
no branch.
A step's line fails at draft j when the target's token t there differs from it. A "hit": the material held t at
j (a runner-up there, or another continuation that agrees with the line up to j and goes on with t).
With a tree, a hit's branch would commit t (which the line's step commits anyway as the target's own token) and
then what the branch drafts after it. Its ceiling: the branch drafts past t what the next step's line drafted (the
same drafter from the same tokens) and costs nothing, so each hit merges the next step into this one:
  ceiling = steps / (steps - hits)    what trees could add over lines at one stream, for steps of equal cost,
                                      branches at most a line deep past the fork, from the alternatives kept
Runner-up leaves (the branches the engine verifies now) commit one token per hit: (tokens + hits) / tokens. And
the bound for a tree of any width, had it held the target's token at every failed line: steps / (steps - failed).
"""

from __future__ import annotations

from .. import report
from ..run import cpu_engine, run_engine
from ..workload import CHAT_PROMPTS, select_cases, text_cases

SHARED = {"prompts": 16, "max_tokens": 64}
QUICK = {"prompts": 2, "max_tokens": 32}
QUICK_HELP = "2 prompts of each set, 32 tokens"
GUIDED_TOKENS = 160  # guided answers are JSON records: room for the whole record
FLOOR = 0.01  # runner-ups kept from this draft probability (the engine's trees: from 5%)


def held_material(engine, log: list) -> None:
    from specgram.speculation.trees import LOOKUP_OTHERS

    """Wrap the engine's tree planner and verifier (this engine only): every step keeps tree material and
    verifies lines; each verified line's (request id, line, alternatives, other continuations, accepted, token)
    goes to log."""
    trees, verifier = engine.trees, engine.verifier
    verify = verifier.verify

    def keep_material(rows, costs, sunk=0.0):
        for name, drafter in trees.drafters.items():
            drafter.alternatives = LOOKUP_OTHERS if name == "ngram" else FLOOR
        for v in rows:
            v.proposal.branches.clear()

    def verify_and_log(plan_, result):
        kept, entries = verify(plan_, result)
        for v in kept:
            p = v.proposal
            if p.tokens:
                others = p.others + ([v.shadow.tokens] if v.shadow else [])
                log.append((v.req.request_id, list(p.tokens), dict(p.alts), others, v.accepted, v.token))
        return kept, entries

    trees.plan, verifier.verify = keep_material, verify_and_log


def count(log: list) -> dict:
    """The logged steps -> steps, tokens, failed lines, hits (runner-up / lookup), and the leaves, ceiling and
    every-failure ratios. A request's last step counts as a step but not as a hit or a failure (nothing follows it
    to merge)."""
    steps = tokens = rejected = alt_hits = lookup_hits = 0
    by_request: dict[int, list] = {}
    for row in log:
        by_request.setdefault(row[0], []).append(row)
    for rows in by_request.values():
        for n, (_, line, alts, others, a, t) in enumerate(rows, 1):
            steps, tokens = steps + 1, tokens + a + 1
            if a >= len(line) or n == len(rows):  # taken whole; or its request's last step: no next step to merge
                continue
            rejected += 1
            alt = alts.get(a)
            if alt is not None and alt[0] == t:
                alt_hits += 1
            elif any(len(s) > a and s[:a] == line[:a] and s[a] == t for s in others):
                lookup_hits += 1
    hits = alt_hits + lookup_hits
    return dict(
        steps=steps,
        tokens=tokens,
        rejected=rejected,
        alt_hits=alt_hits,
        lookup_hits=lookup_hits,
        ceiling=steps / (steps - hits) if steps > hits else float("inf"),
        every=steps / (steps - rejected) if steps > rejected else float("inf"),
        leaves=(tokens + alt_hits) / tokens if tokens else 1.0,
    )


def run(args) -> None:
    from specgram.model.source import open_source

    tok = open_source(args.model).tokenizer()
    sets = {
        "chat": (text_cases(tok, CHAT_PROMPTS[: args.prompts]), args.max_tokens, False),
        "guided (JME)": (select_cases(tok, args.prompts, GUIDED_TOKENS), GUIDED_TOKENS, True),
    }
    longest = max(len(c["prompt_ids"]) for cases, _, _ in sets.values() for c in cases)
    engine = cpu_engine(
        args.model, 1, longest + GUIDED_TOKENS + 16, args.max_tokens, draft_quantization="auto", drafter="auto"
    )
    log: list = []
    held_material(engine, log)
    rows, logs = [], {}
    for name, (cases, max_tokens, guided) in sets.items():
        run_engine(engine, cases[:2], 8, 1, "draft_model", -1, guided=guided)  # warm-up: the step costs, adaptive k
        log.clear()
        run_engine(engine, cases, max_tokens, 1, "draft_model", -1, guided=guided)
        logs[name], c = list(log), count(log)
        report.log(f"{name}: {c}")
        rows.append(
            [
                f"{name}: {len(cases)} prompts, {max_tokens} tokens",
                c["steps"],
                f"{c['tokens'] / max(c['steps'], 1):.2f}",
                c["rejected"],
                f"{c['alt_hits']} + {c['lookup_hits']}",
                f"{c['leaves']:.3f}×",
                f"{c['ceiling']:.3f}×",
                f"{c['every']:.3f}×",
            ]
        )
    lines = report.header(
        "What trees could add: the drafters' alternatives at the lines' failures",
        args,
        "the served default in process (drafter auto, int8 copy, auto k), lines verified, one stream, greedy; chat "
        "prompts and JME extraction cases (those whose answer fits the guided token budget)",
    )
    head = [
        "prompts",
        "steps",
        "tokens/step",
        "lines failed",
        "hits (runner-up + lookup)",
        "runner-up leaves",
        "ceiling",
        "every failure",
    ]
    lines += [*report.table(head, rows), ""]
    lines += [
        "hits: failed lines whose failing position the drafters held the target's token for (a request's last step",
        "not counted); runner-up leaves: tokens with a one-token branch at each runner-up hit ÷ without; ceiling:",
        "steps ÷ (steps − hits), each hit's branch committing what the next step's line did, at no cost (steps of",
        "equal cost, branches at most a line deep past the fork, from the alternatives kept); every failure: the same",
        "had a tree held the target's token at every failed line, steps ÷ (steps − lines failed).",
    ]
    report.write(args, lines, dict(logs=logs))
