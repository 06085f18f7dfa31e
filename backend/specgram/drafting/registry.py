"""The drafters, declared once: how the planner treats each, the sources it tags its drafts with and their priors.

The planner, the tree planner, config validation, the settings' default, the contract's text and the statistics
read these declarations when they use them (never a copy made at import), so a drafter registered later — a
plug-in (plugins.py) — is treated as a built-in one; none of them compares a drafter's name. A drafter is its
declaration here and its module (`make`: where the engine builds it, "module:function" called with (config,), or
None where the model loader provides it: a draft model).

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

from . import names

FORCED = names.FORCED  # the source of grammar-forced drafts, which lead every drafter's proposal
FORCED_PRIOR = 0.95
DEFAULT_PRIOR = 0.5  # a source no drafter declares (a drafter's tag missing from its declaration)
# tags the statistics give other drafts (wire.BRANCH_SOURCES: a tree's branches): no drafter may declare them
RESERVED = (FORCED, names.ALT, names.BRANCH)
TREES = ("", "others", "alts")  # DrafterSpec.tree's words (speculation/trees.py)


@dataclass(frozen=True)
class DrafterSpec:
    name: str  # the `drafter` a request or the config names
    summary: str  # the contract's text
    sources: dict[str, float]  # the source tags of its drafts (spec_detail, metrics) -> each one's prior acceptance
    # (the engine-wide estimate's start, before evidence); a forward drafter tags its drafts with its first
    forward: bool = False  # runs a model forward per depth (planned, timed, shadowed by free drafters)
    companion: bool = False  # free: consulted beside a request's own drafter under auto k
    consults: bool = True  # under auto k its requests also consult the companions
    reads_guide: bool = False  # drafts from the guide's text: its guided requests carry it as tokens (guide_ids)
    hears_all: bool = False  # learns from every request's end, not only its own requests' (release(): its store)
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
            names.NGRAM,
            "prompt lookup: the latest earlier occurrence of the last tokens in the prompt, the output or the guide's "
            "text, continued",
            {names.PROMPT: 0.5, names.OUTPUT: 0.5, names.GUIDE: 0.4},
            companion=True,
            reads_guide=True,
            tree="others",
            make="specgram.speculation.ngram:build",
        ),
        DrafterSpec(
            names.SUFFIX,
            "suffix decoding: the last tokens continued as recent outputs of other requests of the same adapter and "
            "`cache_salt` continued them; config `suffix_store_mb`",
            {names.SUFFIX_STORE: 0.5},
            companion=True,
            hears_all=True,
            make="specgram.speculation.suffix:build",
            needs="suffix_store_mb > 0",
            enabled_by="suffix_store_mb",
        ),
        DrafterSpec(
            names.DRAFT_MODEL,
            "a draft model: `draft_checkpoint`, or on CPU the target's own copy, int8 or from 1B matmul weights int4, "
            "config `draft_quantization` auto; under `num_draft_tokens` auto it drafts beside the lookups",
            {names.DRAFT_MODEL_SOURCE: 0.6},
            forward=True,
            tree="alts",
            needs="a draft model",
        ),
        DrafterSpec(
            names.COPY,
            "the target's own int8 or int4 copy beside a `draft_checkpoint` (`draft_quantization` auto, native CPU "
            "forward): under `num_draft_tokens` auto a `draft_model` request drafts each step with whichever of the "
            "two models expects more tokens per second",
            {names.COPY_SOURCE: 0.6},
            forward=True,
            tree="alts",
            needs="a draft_checkpoint beside which the target's copy loads (draft_quantization auto, native CPU "
            "forward)",
            beside=names.DRAFT_MODEL,
        ),
        DrafterSpec(
            names.GRAMMAR,
            "grammar-forced tokens only",
            {},
            consults=False,
            make="specgram.speculation.drafter:build_grammar_only",
        ),
    )
}
BUILTIN = frozenset(DRAFTERS)  # this package's drafters (the rest: plug-ins and tests' drafters, registered later)
# the order in which `drafter auto` picks a request's default drafter among those the engine has
DEFAULT_ORDER = (names.DRAFT_MODEL, names.NGRAM)


def register(spec: DrafterSpec) -> None:
    """Declare a drafter from outside this package (a plug-in: plugins.py, a test's drafter): from then on configs
    and requests may name it, the planners treat it by its traits, its sources' priors seed the acceptance
    estimates and its tags are the statistics' labels (spec_detail, the metrics built after it). The engine gets
    the drafter itself from `make`, or as Engine.drafters[name]. Declaring the same spec again does nothing;
    ValueError where the name or a source tag is already another drafter's, or the spec does not hold."""
    check(spec)
    if DRAFTERS.get(spec.name, spec) != spec:
        raise ValueError(f"drafter {spec.name!r} is already declared otherwise")
    for other in DRAFTERS.values():
        taken = set(spec.sources) & set(other.sources)
        if other.name != spec.name and taken:
            raise ValueError(f"drafter {spec.name!r}: source tag(s) {sorted(taken)} already tag drafter {other.name!r}")
    DRAFTERS[spec.name] = spec


def check(spec: DrafterSpec) -> None:
    """ValueError naming what does not hold in a declaration."""
    why = []
    if not spec.name or spec.name == "auto":
        why.append("a name other than auto")
    if any(s in RESERVED or not s for s in spec.sources):
        why.append(f"source tags other than {', '.join(RESERVED)}")
    if any(not 0 <= p <= 1 for p in spec.sources.values()):
        why.append("priors in [0, 1]")
    if spec.forward and not spec.sources:
        why.append("a forward drafter declares the source tag of its drafts")
    if spec.make is not None and spec.make.count(":") != 1:
        why.append('make as "module:function"')
    if spec.tree not in TREES:
        why.append(f"tree one of {TREES}")
    if spec.beside and not spec.forward:
        why.append("beside for a forward drafter only")
    if why:
        raise ValueError(f"drafter {spec.name!r} needs {'; '.join(why)}")


def sources() -> tuple[str, ...]:
    """Every draft source tag, the grammar's first."""
    return (FORCED, *(s for spec in DRAFTERS.values() for s in spec.sources))


def prior(source: str) -> float:
    """A source's prior acceptance, as its drafter declares it (adaptive.py: a request's estimate before evidence)."""
    if source == FORCED:
        return FORCED_PRIOR
    return next((spec.sources[source] for spec in DRAFTERS.values() if source in spec.sources), DEFAULT_PRIOR)


def priors() -> dict[str, float]:
    """Each declared source's prior acceptance."""
    return {s: prior(s) for s in sources()}


def source_of(name: str) -> str:
    """The source tag the planner gives a drafter's drafts where its proposal tags none (Proposal.sources None):
    its first declared, else its name (a drafter that declares no tags: grammar, which drafts only forced ones)."""
    return next(iter(DRAFTERS[name].sources), name)


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
    listed = ", ".join(f"`{n}` ({s.summary})" for n, s in DRAFTERS.items())
    companions = " and ".join(f"`{n}`" for n, s in DRAFTERS.items() if s.companion)
    return (
        f"{listed}, and the drafters of the config's `drafter_plugins` modules; under `num_draft_tokens` auto a "
        f"request also looks up with {companions} and verifies the drafts expected to win"
    )


def default(available) -> str:
    """`drafter auto`: the first of DEFAULT_ORDER the engine has."""
    return next(n for n in DEFAULT_ORDER if n in available)
