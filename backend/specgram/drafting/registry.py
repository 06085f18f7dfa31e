"""The drafters, declared once: what each reads, how the planner treats it, the sources it tags its drafts with.

The planner, the tree planner, config validation, the settings' default, the contract's text and the statistics
read these declarations; none of them compares a drafter's name. A drafter is its declaration here and its
module (`make`: where the engine builds it, "module:function" called with (config,), or None where the model
loader provides it: a draft model).

Kinds of drafters:
- a *forward* drafter runs a model per draft depth: its depth is planned before drafting (adaptive.plan_depths),
  its seconds are timed by the step-cost model, and a free drafter's drafts that lose to it are still judged
  (they "shadow" it: their estimates stay current);
- a *free* drafter costs no forward (a lookup). Under num_draft_tokens auto a request consults every free
  drafter that is a `companion` beside its own and takes the drafts with the most expected accepted tokens;
- a forward drafter declared `beside` another is a second model a request of that other may draft with under
  auto k: each step the request drafts with whichever of the two expects more tokens per second
  (speculation/forward_depths.py: choose).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DrafterSpec:
    name: str  # the `drafter` a request or the config names
    summary: str  # the contract's text
    sources: dict[str, float]  # the source tags of its drafts (spec_detail, metrics) -> each one's prior acceptance
    reads: frozenset[str]  # what it drafts from: "prompt", "output", "guide" (its text), "model", "other requests"
    forward: bool = False  # runs a model forward per depth (planned, timed, shadowed by free drafters)
    companion: bool = False  # free: consulted beside a request's own drafter under auto k
    consults: bool = True  # under auto k its requests also consult the companions
    tree: str = ""  # the branches it offers a tree (trees.py): "others" (other whole continuations), "alts"
    # (a runner-up token per draft), "" none
    make: str | None = None  # "module:function" (config) -> Drafter | None (None: off in this config); None:
    # the model loader provides it (engine/loading.py)
    needs: str = ""  # what the config must give for a request to name it (its error's words)
    enabled_by: str = ""  # the config setting that turns it off at 0 ("" always on where it can be built)
    beside: str = ""  # forward: the forward drafter whose auto requests may draft with this one instead


DRAFTERS: dict[str, DrafterSpec] = {
    spec.name: spec
    for spec in (
        DrafterSpec(
            "ngram",
            "prompt lookup: the latest earlier occurrence of the last tokens in the prompt, the output or the guide's "
            "text, continued",
            {"prompt": 0.5, "output": 0.5, "guide": 0.4},
            frozenset({"prompt", "output", "guide"}),
            companion=True,
            tree="others",
            make="specgram.speculation.ngram:build",
        ),
        DrafterSpec(
            "suffix",
            "suffix decoding: the last tokens continued as recent outputs of other requests of the same adapter and "
            "`cache_salt` continued them; config `suffix_store_mb`",
            {"suffix": 0.5},
            frozenset({"output", "other requests"}),
            companion=True,
            make="specgram.speculation.suffix:build",
            needs="suffix_store_mb > 0",
            enabled_by="suffix_store_mb",
        ),
        DrafterSpec(
            "draft_model",
            "a draft model: `draft_checkpoint`, or on CPU the target's own copy, int8 or from 1B matmul weights int4, "
            "config `draft_quantization` auto; under `num_draft_tokens` auto it drafts beside the lookups",
            {"draft_model": 0.6},
            frozenset({"prompt", "output", "model"}),
            forward=True,
            tree="alts",
            needs="a draft model",
        ),
        DrafterSpec(
            "copy",
            "the target's own int8 or int4 copy beside a `draft_checkpoint` (`draft_quantization` auto, native CPU "
            "forward): under `num_draft_tokens` auto a `draft_model` request drafts each step with whichever of the "
            "two models expects more tokens per second",
            {"copy": 0.6},
            frozenset({"prompt", "output", "model"}),
            forward=True,
            tree="alts",
            needs="a draft_checkpoint beside which the target's copy loads (draft_quantization auto, native CPU "
            "forward)",
            beside="draft_model",
        ),
        DrafterSpec(
            "grammar",
            "grammar-forced tokens only",
            {},
            frozenset({"guide"}),
            consults=False,
            make="specgram.speculation.drafter:build_grammar_only",
        ),
    )
}
FORCED = "forced"  # the source of grammar-forced drafts, which lead every drafter's proposal
FORCED_PRIOR = 0.95
# the order in which `drafter auto` picks a request's default drafter among those the engine has
DEFAULT_ORDER = ("draft_model", "ngram")


def register(spec: DrafterSpec) -> None:
    """Declare a drafter from outside this package (a plug-in, a test's drafter): from then on configs and
    requests may name it and the planners treat it by its traits. The engine gets the drafter itself from `make`,
    or as Engine.drafters[name]. The statistics' source labels (wire.DRAFT_SOURCES) are the built-in ones: a
    plug-in's own tags count in spec_detail, and its priors default to 0.5."""
    if DRAFTERS.get(spec.name, spec) != spec:
        raise ValueError(f"drafter {spec.name!r} is already declared otherwise")
    DRAFTERS[spec.name] = spec


def sources() -> tuple[str, ...]:
    """Every draft source tag, the grammar's first."""
    return (FORCED, *(s for spec in DRAFTERS.values() for s in spec.sources))


def priors() -> dict[str, float]:
    """Each source's prior acceptance (adaptive.py: a request's estimate before evidence)."""
    return {FORCED: FORCED_PRIOR, **{s: p for spec in DRAFTERS.values() for s, p in spec.sources.items()}}


def forward_sources() -> frozenset[str]:
    """The sources a forward drafter tags (drafts that cost a forward each)."""
    return frozenset(s for spec in DRAFTERS.values() if spec.forward for s in spec.sources)


def consulted(drafter: str, auto: bool, available) -> list[str]:
    """The free drafters a request of `drafter` looks up with: its own if free, and under auto k (where its
    drafter consults) the companions the engine has (`available`), its own first."""
    spec = DRAFTERS[drafter]
    own = [] if spec.forward else [drafter]
    if not (auto and spec.consults):
        return own
    return own + [n for n, s in DRAFTERS.items() if s.companion and n != drafter and n in available]


def forward_options(drafter: str, auto: bool, available) -> list[str]:
    """The forward drafters a request of `drafter` may draft with this step: its own if forward, and under auto k
    those declared beside it that the engine has (`available`), its own first."""
    if not DRAFTERS[drafter].forward:
        return []
    return [drafter] + ([n for n, s in DRAFTERS.items() if s.beside == drafter and n in available] if auto else [])


def describe() -> str:
    """The `drafter` input's text in the contract."""
    names = ", ".join(f"`{n}` ({s.summary})" for n, s in DRAFTERS.items())
    companions = " and ".join(f"`{n}`" for n, s in DRAFTERS.items() if s.companion)
    return (
        f"{names}; under `num_draft_tokens` auto a request also looks up with {companions} and verifies the drafts "
        "expected to win"
    )


def default(available) -> str:
    """`drafter auto`: the first of DEFAULT_ORDER the engine has."""
    return next(n for n in DEFAULT_ORDER if n in available)
