"""Drafter plug-ins (drafting/plugins.py): the modules `drafter_plugins` names register their drafters when the
config is read, and every reader of the declarations (the acceptance priors, the statistics' labels, the
contract's text, the planners) reads them when it uses them, so a plug-in's drafter is served as a built-in one.
The plug-ins are tests/plugins' (a free drafter and a forward one, outside the engine package)."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from specgram.config import EngineConfig
from specgram.drafting import plugins, registry
from specgram.drafting.acceptance import Population, RequestAcceptance
from specgram.drafting.proposal import Proposal
from specgram.errors import ModelLoadError
from specgram.request import SamplingParams
from specgram.serving import contract
from specgram.serving.metrics import Metrics
from specgram.speculation.drafter import Drafter
from specgram.wire import draft_sources
from tests.plugins import TOKEN, forward, free

from . import fake_pb_utils as pb
from .helpers import cheap_draft_model, run, run_to_end, tokens_of

PLUGINS = "tests.plugins.free, tests.plugins.forward"
NAMES = (free.NAME, forward.NAME)
PROMPT = "abcabc abcabc abc"  # repeats itself: n-gram lookup finds drafts


@pytest.fixture
def restored_registry():
    """The declarations as they were before the test (a plug-in registers into the process's registry)."""
    saved = dict(registry.DRAFTERS)
    yield
    registry.DRAFTERS.clear()
    registry.DRAFTERS.update(saved)


def _rows(markdown: str, field: str) -> str:
    return next(line for line in markdown.splitlines() if line.startswith(f"| `{field}` |"))


def test_what_a_plugin_declares_is_read_where_it_is_used(restored_registry, tiny_ckpt):
    assert not set(NAMES) & set(draft_sources())
    assert RequestAcceptance().get(free.NAME).prior == registry.DEFAULT_PRIOR  # undeclared: the default
    config = EngineConfig(checkpoint=str(tiny_ckpt), drafter_plugins=PLUGINS, drafter=free.NAME)
    assert config.drafter == free.NAME  # the setting may name a plug-in's drafter
    assert draft_sources()[-2:] == NAMES  # the statistics' labels (spec_detail, metrics)
    for name, declared in ((free.NAME, free.PRIOR), (forward.NAME, forward.PRIOR)):
        assert registry.prior(name) == declared != registry.DEFAULT_PRIOR
        assert RequestAcceptance().get(name).rate == declared  # a request's estimate before evidence
        assert Population().rate(name, registry.prior(name)) == declared
    assert registry.forward_sources() >= {forward.NAME} and free.NAME not in registry.forward_sources()
    text = contract.markdown()  # docs/api.md's contract, as the registry reads now
    for field in ("drafter", "spec_detail"):
        assert all(f"`{n}`" in _rows(text, field) for n in NAMES), field
    # the same modules named again (a second config, a reload in the same process) register nothing new
    before = dict(registry.DRAFTERS)
    EngineConfig(checkpoint=str(tiny_ckpt), drafter_plugins="tests.plugins.forward")
    assert registry.DRAFTERS == before


def test_the_metrics_label_every_declared_source_and_one_declared_after_them(restored_registry):
    plugins.load(plugins.parse(PLUGINS))
    labels = {"model": "plugins-test", "version": "1", "instance": "plugins-test"}
    metrics = Metrics(pb.MetricFamily, labels, 4, 2, "native")
    try:
        by_source = pb.MetricFamily.registry["specgram_draft_tokens_by_source_total"]
        have = {m.labels["source"] for m in by_source if m.labels.get("model") == "plugins-test"}
        assert have >= {*NAMES, registry.FORCED, "prompt", "alt"}
        late = dataclasses.replace(free.DRAFTERS[0], name="late", sources={"late": 0.3})
        registry.register(late)  # after the metrics were built: its series is made on first use
        metrics.drafted_by["late"].increment(2)
        assert metrics.drafted_by["late"].labels["source"] == "late" and metrics.drafted_by["late"].value() == 2
    finally:
        for series in pb.MetricFamily.registry.values():
            series[:] = [m for m in series if m.labels.get("model") != "plugins-test"]


def _module(monkeypatch, name: str, **attrs) -> str:
    """A module importable as `name` for this test, with these attributes."""
    module = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(module, k, v)
    monkeypatch.setitem(sys.modules, name, module)
    return name


def test_a_plugin_that_cannot_load_fails_the_load_naming_it(restored_registry, tiny_ckpt, monkeypatch):
    spec = free.DRAFTERS[0]
    cases = {
        "tests.plugins.absent": "could not import 'tests.plugins.absent'",
        "tests.plugins": "module 'tests.plugins' declares no drafters",  # a module that registers nothing
        _module(monkeypatch, "empty_plugin", DRAFTERS=[]): "declares no drafters",
        _module(monkeypatch, "not_specs", DRAFTERS=["fixed_token"]): "declares no drafters",
        _module(
            monkeypatch, "no_make", DRAFTERS=[dataclasses.replace(spec, name="x", sources={"x": 0.5}, make=None)]
        ): "needs `make`",
        _module(
            monkeypatch, "reserved_tag", DRAFTERS=[dataclasses.replace(spec, name="y", sources={"forced": 0.5})]
        ): "source tags other than forced",
        _module(
            monkeypatch, "bad_prior", DRAFTERS=[dataclasses.replace(spec, name="z", sources={"z": 1.5})]
        ): "priors in [0, 1]",
        _module(
            monkeypatch, "taken_tag", DRAFTERS=[dataclasses.replace(spec, name="w", sources={"prompt": 0.5})]
        ): "already tag drafter 'ngram'",
        _module(
            monkeypatch, "taken_name", DRAFTERS=[dataclasses.replace(spec, name="ngram")]
        ): "'ngram' is already declared otherwise",
    }
    for path, words in cases.items():
        with pytest.raises(ModelLoadError, match="drafter_plugins") as e:
            EngineConfig.from_dict({"checkpoint": str(tiny_ckpt), "drafter_plugins": f"tests.plugins.free, {path}"})
        assert words in str(e.value), (path, str(e.value))
    with pytest.raises(ModelLoadError, match="engine setting drafter must be auto or one of"):
        EngineConfig(checkpoint=str(tiny_ckpt), drafter="no_such_drafter")


def test_plugin_drafters_serve_with_their_declared_priors(restored_registry, make_engine, monkeypatch):
    engine = make_engine(drafter_plugins=PLUGINS, max_draft_len=4)
    assert set(NAMES) <= set(engine.drafters)
    want = tokens_of(run(engine, [PROMPT], max_tokens=12, num_draft_tokens=0)[0])
    for name in NAMES:  # a fixed k verifies every draft: each drafter drafts, tagged with its source
        out = run(engine, [PROMPT], max_tokens=12, num_draft_tokens=3, drafter=name)[0]
        assert tokens_of(out) == want, name
        assert out[-1].spec.by_source[name][0] > 0, (name, out[-1].spec.by_source)
    assert engine.drafters[forward.NAME].forwards > 0
    # its depths timed apart from the draft model's (the planner's own costs: none here)
    assert engine.planner.costs.of(forward.NAME).draft_calls > 0 and engine.planner.costs.draft_calls == 0

    # auto k where the step costs say a likely draft pays: drafts banned by the request's logit_bias, so that
    # only the declared prior can get one verified (a free observation never finds one right)
    cheap_draft_model(monkeypatch, engine)
    ban = {"logit_bias": {TOKEN: -100.0}, "max_tokens": 12, "num_draft_tokens": -1}
    banned = tokens_of(run(engine, [PROMPT], max_tokens=12, num_draft_tokens=0, logit_bias={TOKEN: -100.0})[0])

    def auto_drafted(name: str) -> int:
        engine.planner.population = Population()  # the engine-wide rates back at the declared priors
        out = run(engine, [PROMPT], drafter=name, **ban)[0]
        assert tokens_of(out) == banned, name
        return out[-1].spec.by_source.get(name, (0, 0))[0]

    assert [auto_drafted(n) for n in NAMES] == [0, 0]  # priors 0: never expected to pay
    for name in NAMES:  # the same drafters declared likely: now auto k verifies their drafts
        registry.DRAFTERS[name] = dataclasses.replace(registry.DRAFTERS[name], sources={name: 0.9})
    assert all(auto_drafted(n) > 0 for n in NAMES)


def test_a_forward_plugin_gets_the_lookups_drafts_as_hints(restored_registry, make_engine, monkeypatch):
    """Under auto k a forward drafter's requests also look up (consults): the lookup's drafts reach its propose as
    hints, after the prefix, as they reach a draft model's."""
    plugins.load(["tests.plugins.forward"])
    spec = registry.DRAFTERS[forward.NAME]
    registry.DRAFTERS[forward.NAME] = dataclasses.replace(spec, consults=True, sources={forward.NAME: 0.9})
    engine = make_engine(max_draft_len=4, max_seq_len=512)  # built from the registry as it is now
    cheap_draft_model(monkeypatch, engine)
    looked: list[list[int]] = []  # what the lookup found, per call
    lookup = engine.drafters["ngram"]
    propose = lookup.propose
    monkeypatch.setattr(lookup, "propose", lambda *a: [looked.append(p.tokens) or p for p in propose(*a)])
    # a prompt of every token (but the specials): whatever the last token, the lookup finds what followed it
    req = engine.make_request(
        SamplingParams(max_tokens=8, num_draft_tokens=-1, drafter=forward.NAME),
        prompt_ids=list(range(3, engine.target.vocab_size)),
    )
    run_to_end(engine, [req])
    hints = engine.drafters[forward.NAME].hints
    assert any(hints) and all(h in looked for h in hints if h), (hints, looked)


def test_an_untagged_proposal_gets_the_drafters_declared_tag(restored_registry, make_engine, monkeypatch):
    """A plug-in whose proposals tag nothing (Proposal.sources None): the planner tags its drafts with the first
    source tag it declares, so that its declared prior and its metric label apply to them."""

    class Untagged(Drafter):
        def propose(self, reqs, ks, pick, prefixes, hints):
            return [Proposal(list(p) + [TOKEN] * max(k - len(p), 0)) for k, p in zip(ks, prefixes, strict=True)]

    spec = registry.DrafterSpec(
        "untagged", "a test's drafter", {"its_tag": 0.5}, consults=False, make="untagged_plugin:build"
    )
    _module(monkeypatch, "untagged_plugin", DRAFTERS=[spec], build=lambda config: Untagged())
    engine = make_engine(drafter_plugins="untagged_plugin", max_draft_len=4)
    by_source = run(engine, [PROMPT], max_tokens=8, num_draft_tokens=3, drafter="untagged")[0][-1].spec.by_source
    assert by_source.get("its_tag", (0, 0))[0] > 0 and "untagged" not in by_source, by_source
