"""Adaptive draft length (num_draft_tokens = auto): the goodput allocation and the online estimates, and that
output stays exact whatever k the engine chooses (greedy: token-identical; sampled: the target's distribution)."""

import pytest

from specgram.drafting import acceptance, registry
from specgram.drafting.acceptance import Acceptance, RequestAcceptance
from specgram.request import AUTO_DRAFT, SamplingParams
from specgram.speculation import adaptive
from specgram.speculation import costs as step_costs
from specgram.speculation.adaptive import allocate
from specgram.speculation.costs import StepCosts

from .distributions import chi2_critical, chi2_stat, exact_joint
from .helpers import (
    PROMPTS,
    cheap_draft_model,
    freeze,
    reference_model,
    run,
    run_to_end,
    tokens_of,
    vocab4_target_and_draft,
    wrong_and_right,
)
from .test_speculative import PROMPT, SAMPLE_PARAMS, with_oracle


def costs_of(a: float, b: float, rows=(1, 2, 4, 8, 16)) -> StepCosts:
    c = StepCosts()
    for _ in range(50):
        for n in rows:
            c.record(n, a + b * n)
    return c


# ---- pure parts -------------------------------------------------------------------------------------------


def test_step_costs_recover_a_line():
    a, b, c = costs_of(0.030, 0.002).fit()
    assert a == pytest.approx(0.030, rel=0.02) and b == pytest.approx(0.002, rel=0.05)
    assert c * 16**2 < 0.02 * (a + 16 * b)  # no bend worth the name (the slope prior's pull)


def test_step_costs_recover_a_knee():
    # a CPU target: nearly flat while it streams its weights, then compute-bound (SmolLM2-135M at 8 streams)
    measured = {8: 0.0135, 16: 0.0150, 24: 0.0175, 32: 0.0228, 40: 0.0288}
    c = StepCosts()
    for _ in range(30):
        for n, s in measured.items():
            c.record(n, s)
    cost = c.curve()
    for n, s in measured.items():
        assert cost(n) == pytest.approx(s, rel=0.05)  # a line through these misses by 11-12%
    assert c.fit()[2] > 0


def test_step_costs_that_bend_down_fit_the_line():
    c = StepCosts()
    for _ in range(30):
        for n in (1, 4, 9, 16):
            c.record(n, 0.010 + 0.001 * n**0.5)  # concave: no square term, the least-squares line
    a, b, curvature = c.fit()
    assert curvature == 0 and b > 0 and a > 0


def test_step_costs_with_one_row_count_use_the_prior_slope():
    c = StepCosts()
    for _ in range(10):
        c.record(4, 0.024)
    a, b, curvature = c.fit()
    assert a + 4 * b == pytest.approx(0.024) and b == pytest.approx(StepCosts.SLOPE_PRIOR * a, rel=1e-6)
    assert curvature == 0


def test_a_depth_is_planned_by_the_knee_not_by_a_line_across_it():
    """8 streams, the int8 copy drafting at ~5.5 ms a depth: the planned depth is the one that maximises tokens
    per second at the measured step costs (2: +30% over none). A line fitted to the same steps prices every row
    at the knee's slope and planned no drafts at all."""
    measured = {8: 0.0135, 16: 0.0150, 24: 0.0175, 32: 0.0228, 40: 0.0288, 48: 0.0346}
    costs = StepCosts()
    for _ in range(30):
        for n, s in measured.items():
            costs.record(n, s)
    costs.draft_depth_s = 0.0055
    model = [0.93, 0.86, 0.80, 0.74, 0.69]
    ratios = {}
    for depth in range(6):
        tokens = 8 * (1 + sum(model[:depth]))
        ratios[depth] = tokens / (measured[8 * (1 + depth)] + depth * costs.draft_depth_s)
    best = max(ratios, key=ratios.get)
    assert best == 2 and ratios[2] > 1.05 * ratios[3]
    assert adaptive.plan_depths([model] * 8, [None] * 8, [0] * 8, costs) == [best] * 8


def test_a_depth_that_gains_a_little_is_planned_without_a_margin_over_none():
    """A depth whose step expects only ~1.5% more tokens per second than no drafts is still planned (the depth
    forward is timed; allocate's MIN_GAIN margin is for untimed per-draft work), and one that loses is not."""
    costs = costs_of(0.016, 0.0005)  # 8 rows 20 ms, 16 rows 24 ms
    cost = costs.curve()
    for d, planned in ((0.0059, 1), (0.0075, 0)):
        costs.draft_depth_s = d
        p = 0.52
        gain = 8 * (1 + p) / (cost(16) + d) / (8 / cost(8)) - 1
        assert (0 < gain < adaptive.MIN_GAIN) if planned else gain < 0, gain
        assert adaptive.plan_depths([[p]] * 8, [None] * 8, [0] * 8, costs) == [planned] * 8


def test_allocate_drafts_while_a_draft_pays_for_its_row():
    # one request, cost 30 ms + 3 ms per row: draft j pays iff its chance beats the running tokens/cost ratio
    costs = costs_of(0.030, 0.003)
    chances = [0.9, 0.8, 0.5, 0.05]
    [cut] = allocate([chances], [False], costs)
    cost = costs.curve()
    tokens, rows, expected = 1.0, 1, 0
    for p in chances:  # the greedy rule written out: keep adding while the ratio improves
        if (tokens + p) / cost(rows + 1) <= tokens / cost(rows):
            break
        tokens, rows, expected = tokens + p, rows + 1, expected + 1
    assert cut == expected == 3


def test_allocate_none_when_rows_are_dear_all_when_free():
    chances = [[0.6, 0.4, 0.2]] * 4
    assert allocate(chances, [False] * 4, costs_of(0.001, 0.010)) == [0, 0, 0, 0]
    assert allocate(chances, [False] * 4, costs_of(0.030, 1e-6)) == [3, 3, 3, 3]


def test_allocate_prefers_the_likelier_drafts_across_the_batch():
    cuts = allocate([[0.95, 0.9, 0.85], [0.2, 0.1, 0.05]], [False, False], costs_of(0.030, 0.004))
    assert cuts[0] == 3 and cuts[1] == 0


def test_allocate_drafts_nothing_when_the_gain_is_within_the_margin():
    # 8 rows, 16 ms + 0.4 ms a row: one 30%-likely draft raises tokens/s by ~1.4%, below MIN_GAIN
    costs = costs_of(0.016, 0.0004)
    weak = [[0.3]] + [[]] * 7
    assert allocate(weak, [False] * 8, costs) == [0] * 8
    cost = costs.curve()
    gain = (8 + 0.3) / cost(9) / (8 / cost(8)) - 1
    assert 0 < gain <= adaptive.MIN_GAIN  # it would pay without the margin
    strong = [[0.9, 0.8]] * 4 + [[]] * 4  # ~+35%: verified
    assert allocate(strong, [False] * 8, costs) == [2] * 4 + [0] * 4
    # a fixed-k request's sure drafts are the step's base, not a gain that carries the weak draft past the margin
    mixed = [[0.3], [1.0, 1.0]] + [[]] * 6
    assert allocate(mixed, [False] * 8, costs) == [1, 2] + [0] * 6
    assert allocate(mixed, [False] * 8, costs, [False, True] + [False] * 6) == [0, 2] + [0] * 6


def test_lookup_drafts_win_where_they_expect_as_many_tokens_for_less():
    costs = costs_of(0.014, 0.0004)
    costs.draft_depth_s = 0.006  # a draft forward ~ 0.4 of a target step
    model = [0.9, 0.81, 0.73]
    plan = adaptive.plan_depths
    assert plan([model], [[0.9, 0.8, 0.7]], [0], costs) == [0]  # as good and free: no model drafts
    assert plan([model], [[0.3, 0.1]], [0], costs) == [3]  # the model's drafts pay more
    assert plan([model], [None], [0], costs) == [3]  # nothing found
    assert plan([[]], [[0.3]], [0], costs) == [0]  # the model may not draft for it
    # a forced first token costs the model no draft forward: its drafts win only then (2.05 tokens in 15.2 ms
    # for lookup; 3.85 in 33.6 ms when the model drafts all three, 3.85 in 27.6 ms after a forced one)
    assert plan([[0.95] * 3], [[0.95, 0.1]], [0], costs) == [0]
    assert plan([[0.95] * 3], [[0.95, 0.1]], [1], costs) == [3]
    assert plan([model, model], [[0.1], None], [0, 0], StepCosts()) == [0, 3]  # before any timing


def test_a_depth_is_priced_by_the_requests_drafting_in_it():
    # an int8 copy on AVX2: a draft forward costs 11 ms for one row and 30 ms for eight (a 42 ms target step at
    # eight rows); one mean over both row counts (~20 ms) would have all eight streams draft, 15.6 tokens in
    # 74 ms against 8 in 42 ms; priced at eight rows the depth loses (15.6 in 84 ms), while one stream still
    # drafts two (2.8 tokens in 56 ms against 1 in 31.5 ms)
    costs = costs_of(0.030, 0.0015)
    for _ in range(10):
        costs.record_draft(1, 0.011, rows=1)
        costs.record_draft(2, 0.060, rows=8)
    d = costs.depth_curve()
    assert d(0) == 0 and abs(d(1) - 0.011) < 0.001 and abs(d(8) - 0.030) < 0.001 and d(1) < d(4) < d(8)
    model = [[0.95, 0.9]] * 8
    assert adaptive.plan_depths(model, [None] * 8, [0] * 8, costs) == [0] * 8
    assert adaptive.plan_depths(model[:1], [None], [0], costs) == [2]
    flat = costs_of(0.030, 0.0015)
    flat.draft_depth_s = costs.draft_depth_s  # the mean alone: the old pricing
    assert 0.015 < flat.draft_depth_s < 0.025
    assert adaptive.plan_depths(model, [None] * 8, [0] * 8, flat) != [0] * 8
    # after the cuts a depth is priced by the drafts the model will make: two streams at depth 1, not eight
    assert adaptive.depth_seconds(d, [1, 1, 0, 0]) == d(2) and adaptive.depth_seconds(d, [2, 1]) == d(2) + d(1)


def test_a_draft_depth_shared_by_many_streams_pays_where_one_streams_drafts_would_not():
    # 8 streams, a 19 ms step, a draft forward 6 ms: one stream's 0.9-likely draft alone would cost the step
    # 6.4 ms for 0.9 tokens (-15% tokens/s); all eight drafting in the same depth forwards gain ~40%
    costs = costs_of(0.016, 0.0004)
    costs.draft_depth_s = 0.006
    model = [[0.9, 0.81]] * 8
    assert not step_costs.probe_can_pay(8, costs) and step_costs.depth_can_pay(8, costs, 0.9)
    assert not step_costs.depth_can_pay(8, costs, 0.3)  # drafts rarely accepted
    assert step_costs.depth_can_pay(8, costs, 0.6) and not step_costs.depth_can_pay(32, costs, 0.6)  # rows cost too
    assert adaptive.plan_depths(model, [None] * 8, [0] * 8, costs) == [2] * 8
    assert allocate(model, [True] * 8, costs) == [2] * 8
    assert adaptive.plan_depths(model[:1], [None], [0], costs) == [2]  # one stream: it pays alone too
    assert adaptive.plan_depths([[0.9, 0.81]] + [[]] * 7, [None] * 8, [0] * 8, costs) == [0] * 8  # alone at 8
    # a fixed-k draft-model request's two depths are made anyway: the auto one rides along
    assert adaptive.plan_depths([[0.9, 0.81]] + [[]] * 7, [None] * 8, [0] * 8, costs, paid=2) == [2] + [0] * 7
    # the paid depths' seconds are in every option's cost: with 4 paid, two depths beat one (257 vs 242 tok/s)
    assert (
        adaptive.plan_depths([[]] + [[0.45, 0.2, 0.1, 0.05]] * 7, [None] * 8, [0] * 8, costs, paid=4) == [0] + [2] * 7
    )


def test_a_prompt_read_pays_where_the_drafts_save_more_than_it_costs_over_the_tokens_left():
    one = costs_of(0.014, 0.0004)
    one.draft_depth_s, one.read_token_s = 0.004, 0.0005  # a draft forward ~0.28 of a step; 0.5 ms a token
    # one stream: the drafts save ~25% of 64 tokens' 14.4 ms steps (0.23 s) against a 40 ms read of 80 tokens
    assert step_costs.read_pays(1, one, 0.75, 64, 80)
    assert not step_costs.read_pays(1, one, 0.75, 8, 80)  # 8 tokens left save 29 ms: less
    eight = costs_of(0.011, 0.0005)
    eight.draft_depth_s, eight.read_token_s = 0.006, 0.0005
    # 8 streams: a shared depth gains ~3% of each stream's share of a step (1.9 ms of 15 ms): 64 tokens save
    # ~4 ms, less than the read; 2000 tokens save more
    assert not step_costs.read_pays(8, eight, 0.72, 64, 80) and step_costs.read_pays(8, eight, 0.72, 2000, 80)
    assert not step_costs.read_pays(8, eight, 0.2, 10**6, 1)  # no gain at all: never
    assert step_costs.read_pays(8, costs_of(0.011, 0.0005), 0.72, 1, 10**6)  # nothing measured yet: read
    # 8 streams, 0.87-likely drafts, a 37-token read (18.5 ms): a depth shared by all saves 14 ms over 64 tokens,
    # not enough; joining the depths 7 others draft in anyway costs two verify rows and two rows of the depth
    # forwards (2.2 ms a step) for 1.63 tokens at a token's share of a step (1.9 ms): 0.9 ms a step, 22 ms over
    # the 24 steps. At 0.72 and an 80-token read (40 ms) neither pays (5 ms)
    chat = costs_of(0.011, 0.0005)
    chat.draft_depth_s, chat.read_token_s = 0.0058, 0.0005
    assert not step_costs.read_pays(8, chat, 0.87, 64, 37) and step_costs.read_pays(8, chat, 0.87, 64, 37, joined=7)
    assert not step_costs.read_pays(8, chat, 0.72, 64, 80, joined=7)


def test_drafts_already_made_are_cut_against_the_steps_whole_cost():
    # the draft forwards that made them are spent: a second draft at 0.2 pays for its row once they are counted
    costs = costs_of(0.016, 0.0004)
    costs.draft_depth_s = 0.006
    chances = [[0.4, 0.2, 0.1]] * 8
    assert allocate(chances, [False] * 8, costs) == [1] * 8
    assert allocate(chances, [False] * 8, costs, sunk=2 * 0.006) == [2] * 8


def test_allocate_counts_draft_model_depth():
    chances = [[0.7, 0.5]]
    cheap = costs_of(0.030, 0.001)
    assert allocate(chances, [True], cheap) == [2]
    cheap.draft_depth_s = 0.050  # a draft forward dearer than the target step: drafting never pays
    assert allocate(chances, [True], cheap) == [0]


def test_allocate_before_any_timing_verifies_everything():
    assert allocate([[0.1, 0.1], []], [False, False], StepCosts()) == [2, 0]


def test_acceptance_observations_and_the_free_one():
    est = RequestAcceptance()
    est.observe(["prompt"] * 4, verified=4, accepted=1, next_matches=None)  # first: hit; the one after: miss
    first, follow = est.get("prompt"), est.get("prompt", follows=True)
    assert (first.successes, first.trials, follow.successes, follow.trials) == (1, 1, 0, 1)
    est.observe(["prompt"] * 2, verified=1, accepted=1, next_matches=True)  # verified one, the cut one hit too
    decayed = pytest.approx(acceptance.DECAY + 1)
    assert first.successes == decayed and first.trials == decayed
    assert follow.successes == pytest.approx(1) and follow.trials == pytest.approx(acceptance.DECAY + 1)
    est.observe(["output"], verified=0, accepted=0, next_matches=False)  # k = 0: the shadow draft missed
    assert est.get("output").trials == 1 and est.get("output").successes == 0
    chances = est.chances(["forced", "prompt", "prompt"])
    assert chances[1] == pytest.approx(est.get("forced").rate * follow.rate)
    assert chances[2] == pytest.approx(chances[1] * follow.rate)


def test_an_idle_request_looks_up_every_few_steps_only():
    est = RequestAcceptance()
    rests = []
    for idle in range(2 * acceptance.LOOKUP_EVERY + 1):
        est.idle_steps = idle
        rests.append(est.lookup_rests)
    every = acceptance.LOOKUP_EVERY
    assert rests == [idle > 0 and idle % every != 0 for idle in range(2 * every + 1)]
    assert rests[0] is False and rests[every] is False and rests[1] is True  # drafting: every step


def test_acceptance_rate_follows_recent_steps():
    s = Acceptance(prior=0.5)
    for _ in range(20):
        s.observe(1, 1)
    high = s.rate
    for _ in range(15):
        s.observe(0, 1)
    assert high > 0.75 and s.rate < 0.25  # the prior (weight PRIOR_WEIGHT) keeps it off 0 and 1


def test_a_new_request_starts_from_the_engine_wide_rate_of_each_source():
    population = acceptance.Population()
    old = RequestAcceptance(population)
    for _ in range(50):
        old.observe(["prompt", "prompt"], verified=2, accepted=2, next_matches=None)  # lookup always right
        old.observe(["output"], verified=1, accepted=0, next_matches=None)  # own output never
    new, fixed = RequestAcceptance(population), RequestAcceptance()
    assert new.get("prompt").rate > 0.9 and new.get("prompt", follows=True).rate > 0.9
    assert new.get("output").rate < 0.1
    assert fixed.get("prompt").rate == registry.DRAFTERS["ngram"].sources["prompt"]  # its declared prior
    for _ in range(5):  # the request's own evidence moves it off the population's
        new.observe(["prompt"], verified=1, accepted=0, next_matches=None)
    assert new.get("prompt").rate < 0.6 < old.get("prompt").rate


# ---- the engine: exact whatever k it picks ------------------------------------------------------------------


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return wrong_and_right(tmp_path_factory.mktemp("adaptive"))


@pytest.mark.parametrize("drafter", ["ngram", "draft_model", "right"])
def test_greedy_auto_identical_batch1_and_batch4(engines, drafter, monkeypatch):
    engine = engines["right" if drafter == "right" else "wrong"]
    name = "draft_model" if drafter == "right" else drafter
    if drafter == "right":
        cheap_draft_model(monkeypatch, engine)
    for prompts in (PROMPTS[:1], PROMPTS):
        base = run(engine, prompts, max_tokens=30)
        auto = run(engine, prompts, max_tokens=30, num_draft_tokens=AUTO_DRAFT, drafter=name)
        assert [tokens_of(o) for o in auto] == [tokens_of(o) for o in base]
    if drafter == "right":
        assert sum(o[-1].spec.accepted for o in auto) > 0, "with always-right drafts auto must draft"


def test_a_draft_model_request_under_auto_drafts_by_lookup_where_the_model_does_not_pay(engines, monkeypatch):
    """Auto k with the draft model also looks up n-grams: with a draft forward dearer than a target step the
    model never drafts (its propose is never called), and lookup drafts still run; output exact."""
    engine = engines["right"]
    costs = costs_of(0.030, 1e-5)
    costs.draft_depth_s = 0.050
    freeze(monkeypatch, engine, costs)
    fed = []
    drafter = engine.drafters["draft_model"]
    monkeypatch.setattr(drafter, "propose", lambda reqs, *a: fed.append(reqs) or [])
    base = run(engine, PROMPTS, max_tokens=30)
    auto = run(engine, PROMPTS, max_tokens=30, num_draft_tokens=AUTO_DRAFT, drafter="draft_model")
    assert [tokens_of(o) for o in auto] == [tokens_of(o) for o in base]
    by_source = [o[-1].spec.by_source for o in auto]
    assert not fed and all("draft_model" not in s for s in by_source)
    free = ("prompt", "output", "suffix")  # the lookups: n-gram, and the suffix store (these prompts ran before)
    assert sum(s.get(f, (0, 0))[0] for s in by_source for f in free) > 0


def test_the_draft_model_reads_an_auto_prompt_at_admission_only_where_a_draft_could_pay(engines, monkeypatch):
    engine = engines["right"]
    drafter = engine.drafters["draft_model"]
    seen = []
    admit = drafter.admit
    monkeypatch.setattr(drafter, "admit", lambda reqs, now=True: seen.append(now) or admit(reqs, now))
    cheap_draft_model(monkeypatch, engine)  # a draft forward 2 ms, a step 30 ms: drafts pay
    base = run(engine, PROMPTS[:1], max_tokens=20)
    auto = run(engine, PROMPTS[:1], max_tokens=20, num_draft_tokens=AUTO_DRAFT, drafter="draft_model")
    assert seen == [True] and tokens_of(auto[0]) == tokens_of(base[0])
    assert auto[0][-1].spec.by_source.get("draft_model", (0, 0))[0] > 0
    engine.planner.costs.draft_depth_s = 0.050  # dearer than a step: not even a sure draft pays
    auto = run(engine, PROMPTS[:1], max_tokens=20, num_draft_tokens=AUTO_DRAFT, drafter="draft_model")
    assert seen == [True, False] and tokens_of(auto[0]) == tokens_of(base[0])
    assert "draft_model" not in auto[0][-1].spec.by_source  # never read: never drafts under auto
    fixed = run(engine, PROMPTS[:1], max_tokens=20, num_draft_tokens=3, drafter="draft_model")
    assert seen == [True, False, True] and tokens_of(fixed[0]) == tokens_of(base[0])  # a fixed k: read now


def test_the_draft_model_skips_an_auto_prompt_whose_read_would_cost_more_than_its_drafts_save(engines, monkeypatch):
    engine = engines["right"]
    if engine.drafters["draft_model"].runner.native is None:
        pytest.skip("a prompt read is deferred on native draft runners only (their rows are packed, not padded)")
    drafter = engine.drafters["draft_model"]
    seen = []
    admit = drafter.admit
    monkeypatch.setattr(drafter, "admit", lambda reqs, now=True: seen.append((len(reqs), now)) or admit(reqs, now))
    cheap_draft_model(monkeypatch, engine)  # drafts pay ...
    engine.planner.costs.read_token_s = 0.05  # ... but a read at 50 ms a token does not, for 20
    base = run(engine, PROMPTS[:2], max_tokens=20)
    mixed = run(engine, PROMPTS[:2], max_tokens=20, num_draft_tokens=AUTO_DRAFT, drafter="draft_model")
    assert seen == [(2, False)] and [tokens_of(o) for o in mixed] == [tokens_of(o) for o in base]
    assert all("draft_model" not in o[-1].spec.by_source for o in mixed)
    many = run(engine, PROMPTS[:1], max_tokens=20, num_draft_tokens=3, drafter="draft_model")  # a fixed k
    assert seen[-1] == (1, True) and tokens_of(many[0]) == tokens_of(base[0])


def test_an_auto_request_whose_prompt_the_draft_model_did_not_read_gets_no_model_drafts(engines, monkeypatch):
    engine = engines["right"]
    if engine.drafters["draft_model"].runner.native is None:
        pytest.skip("a prompt read is deferred on native draft runners only (their rows are packed, not padded)")
    drafter = engine.drafters["draft_model"]
    admit = drafter.admit
    monkeypatch.setattr(drafter, "admit", lambda reqs, now=True: admit(reqs, False))  # deferred, whatever
    cheap_draft_model(monkeypatch, engine)  # where model drafts would pay (the test above)
    base = run(engine, PROMPTS[:1], max_tokens=20)
    auto = run(engine, PROMPTS[:1], max_tokens=20, num_draft_tokens=AUTO_DRAFT, drafter="draft_model")
    assert tokens_of(auto[0]) == tokens_of(base[0])
    assert "draft_model" not in auto[0][-1].spec.by_source  # a late prompt read would be a prefill


def test_lookup_drafts_that_lost_to_the_model_are_observed_against_what_was_committed():
    from specgram.drafting.proposal import Proposal
    from specgram.request import Request
    from specgram.speculation.planner import DraftPlanner

    planner = DraftPlanner({}, None, 8, 96, False)
    r = Request(prompt_ids=[1, 2], params=SamplingParams())
    planner.start(r)
    planner._observe_shadow(r, Proposal([5, 6, 7], sources=["prompt"] * 3), [5, 6, 9, 4])  # 2 right, 1 wrong
    first, follow = r.acceptance.get("prompt"), r.acceptance.get("prompt", follows=True)
    assert (first.successes, first.trials, follow.successes, follow.trials) == (1, 1, 1, 2)
    planner._observe_shadow(r, Proposal([3], sources=["forced"]), [3])  # forced: counted by the verified one
    assert r.acceptance.get("forced").trials == 0


def test_auto_mixed_with_fixed_k_and_no_speculation(engines):
    engine = engines["wrong"]
    prompts = PROMPTS * 2
    base = run(engine, prompts, max_tokens=25)
    spec = run(
        engine,
        prompts,
        max_tokens=25,
        num_draft_tokens=[AUTO_DRAFT, 0, 3, AUTO_DRAFT, 8, AUTO_DRAFT, 1, 2],
        drafter=["ngram", "draft_model"] * 4,
    )
    assert [tokens_of(o) for o in spec] == [tokens_of(o) for o in base]


def test_auto_follows_the_cost_model(engines, monkeypatch):
    """Always-right drafts: with free rows auto verifies the longest drafts it may; where a step costs only its
    rows (a = 0), a draft pays only if sure, and an estimate never is: none."""
    engine = engines["wrong"]
    base = with_oracle(engine, PROMPTS, 30)
    only_rows = costs_of(0.0, 0.05)
    monkeypatch.setattr(only_rows, "fit", lambda: (0.0, 0.05, 0.0))  # the fit's intercept is not exactly 0
    for costs, expect_drafts in ((costs_of(0.030, 1e-7), True), (only_rows, False)):
        freeze(monkeypatch, engine, costs)
        monkeypatch.setattr(engine.planner, "population", acceptance.Population())  # no history from other tests
        spec = run(engine, PROMPTS, max_tokens=30, num_draft_tokens=AUTO_DRAFT, drafter="oracle")
        assert [tokens_of(o) for o in spec] == [tokens_of(o) for o in base]
        hists = [o[-1].spec.k_hist for o in spec]
        if expect_drafts:
            assert all(max(k for k, n in enumerate(h) if n) == engine.config.max_draft_len for h in hists)
        else:
            assert all(len(h) == 1 for h in hists), hists  # every step verified 0 drafts


def test_auto_is_the_configured_default_and_validated(engines):
    engine = engines["wrong"]
    req = engine.make_request(SamplingParams(num_draft_tokens=AUTO_DRAFT), text="hi")
    assert req.params.auto_draft
    with pytest.raises(Exception, match="num_draft_tokens"):
        engine.make_request(SamplingParams(num_draft_tokens=-2), text="hi")


def test_per_source_statistics_add_up(engines):
    engine = engines["wrong"]
    outs = run(engine, PROMPTS, max_tokens=30, num_draft_tokens=4, drafter="ngram")
    for o in outs:
        s = o[-1].spec
        assert sum(d for d, _ in s.by_source.values()) == s.drafted
        assert sum(a for _, a in s.by_source.values()) == s.accepted
        assert set(s.by_source) <= {"prompt", "output", "guide"}
        assert sum(s.k_hist) == len(o) - 1  # one response per decode step, and the first one (prefill)
    assert any(s.drafted for s in (o[-1].spec for o in outs))


# ---- sampling -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_vocab(tmp_path_factory):
    return vocab4_target_and_draft(tmp_path_factory.mktemp("vocab4auto"))


@pytest.mark.parametrize("drafter", ["draft_model", "ngram"])
def test_auto_sampling_matches_target_distribution(tiny_vocab, drafter, monkeypatch):
    engine = tiny_vocab
    # 64 rows, rows nearly free: drafts pay (above MIN_GAIN for the batch) wherever lookup finds some
    freeze(monkeypatch, engine, costs_of(0.030, 0.000001))
    expected = exact_joint(reference_model(engine), PROMPT, 3, **SAMPLE_PARAMS)
    reqs = [
        engine.make_request(
            SamplingParams(
                max_tokens=3, ignore_eos=True, seed=i, num_draft_tokens=AUTO_DRAFT, drafter=drafter, **SAMPLE_PARAMS
            ),
            prompt_ids=PROMPT,
        )
        for i in range(3000)
    ]
    outs = run_to_end(engine, reqs)
    samples = [tuple(tokens_of(outs[r.request_id])) for r in reqs]
    stats = [outs[r.request_id][-1].spec for r in reqs]
    assert 0 < sum(s.accepted for s in stats) < sum(s.drafted for s in stats)
    stat, df = chi2_stat(samples, expected)
    assert stat < chi2_critical(df), (stat, df)


def test_a_probe_is_skipped_where_even_a_sure_draft_cannot_pay():
    """A draft-model probe first feeds the draft every token it missed: only worth it where a draft could pay."""
    costs = costs_of(0.014, 0.0008)
    assert step_costs.probe_can_pay(8, StepCosts())  # nothing measured yet
    costs.draft_depth_s = 0.007  # one stream, a draft forward at ~0.45 of a step: pays
    assert step_costs.probe_can_pay(1, costs)
    costs.draft_depth_s = 0.012  # eight streams: the draft forward outweighs a token
    assert not step_costs.probe_can_pay(8, costs)


def test_the_draft_cost_is_learned_from_steps_without_a_catch_up(engines, monkeypatch):
    """A proposal that first feeds the draft model many missed tokens (a prefill) is not timed as a depth."""
    engine = engines["right"]
    recorded = []
    monkeypatch.setattr(engine.planner.costs, "record_draft", lambda depth, s, rows: recorded.append(depth))
    run(engine, PROMPTS[:1], max_tokens=12, num_draft_tokens=2, drafter="draft_model")
    steps = len(recorded)
    assert steps > 0
    drafter = engine.drafters["draft_model"]
    monkeypatch.setattr(drafter, "behind", lambda req: 5)  # as after idle steps
    run(engine, PROMPTS[:1], max_tokens=12, num_draft_tokens=2, drafter="draft_model")
    assert len(recorded) == steps


def test_every_draft_source_has_a_prior():
    from specgram.wire import draft_sources

    assert tuple(registry.priors()) == draft_sources()


def test_the_draft_model_checks_a_lookups_drafts_in_its_first_forward(engines, monkeypatch):
    """A lookup's drafts ride in the draft model's first forward (draft_model.py: _checkable): the model keeps them
    as far as its own picks agree, so it makes exactly the drafts it makes one forward at a time, in fewer
    forwards; a wrong hint changes nothing but the first forward's rows."""
    engine = engines["wrong"]
    drafter = engine.drafters["draft_model"]
    req = engine.make_request(SamplingParams(max_tokens=30, num_draft_tokens=2, drafter="draft_model"), text=PROMPTS[0])
    engine.add(req)
    while len(req.output_ids) < 4:
        engine.step()
    calls, forward = [], drafter._forward
    monkeypatch.setattr(drafter, "_forward", lambda *a: calls.append(a[3]) or forward(*a))
    pick = engine.logits.draft_pick

    def propose(hint):
        calls.clear()
        return drafter.propose([req], [6], pick, [[]], hints=[hint]).pop().tokens, len(calls)

    plain, n = propose([])
    assert len(plain) == 6 and n == 6  # one forward a draft
    assert propose(plain) == (plain, 1)  # a right hint: all six from one forward (five checked, the sixth picked)
    assert propose(plain[:3]) == (plain, 3)  # three right: the first forward makes four
    wrong = [(t + 1) % engine.target.vocab_size for t in plain]
    assert propose(wrong) == (plain, 6)  # the first pick leaves the hint: drafting goes on as without it
    engine.abort(req.request_id)
