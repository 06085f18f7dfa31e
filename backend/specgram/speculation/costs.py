"""What a step costs, for num_draft_tokens auto (adaptive.py): the verify step's seconds by its verify rows, a
draft-model depth's seconds and a draft model's prompt read per token, all from the engine's own timings; and the
questions the planner asks of them before it drafts (can one depth, or one probe, pay at this many streams? does
reading a prompt with the draft model pay over the request's remaining tokens?). Those weigh a draft model against
no model drafts at all, alone or as the winner of a pair; which of a pair drafts is forward_depths.choose's."""

from __future__ import annotations


class StepCosts:
    """Seconds per decode step as a function of its verify rows N: a + b N + c N^2, fitted online by least squares
    with forgetting. The square term is there because a CPU target streams its weights at a few rows (a nearly flat
    cost) and turns compute-bound past a few tens of rows: a line fitted across that knee prices a shallow depth's
    rows too dear and a deep one's too cheap, and the planner then drafts too deep. b is shrunk toward a prior
    share of a and c toward 0, so few distinct N still give a usable fit (a single N: the prior slope, no
    curvature); a fit that bends down or falls (noise) is replaced by the flat-start parabola or the line."""

    FORGET = 0.97
    SLOPE_PRIOR = 0.05  # one more row ~ 5% of a 1-row step (CPU forward: weight reads dominate)
    SLOPE_WEIGHT = 4.0  # the priors count like this many observations one row apart

    def __init__(self, verify: StepCosts | None = None) -> None:
        # discounted sums of 1, N, N^2, N^3, N^4, y, N y, N^2 y over the observations (y: seconds)
        self.s0 = self.s1 = self.s2 = self.s3 = self.s4 = self.sy = self.sny = self.sn2y = 0.0
        self.draft_depth_s = 0.0  # one draft-model forward (one depth level), EMA over every row count
        self.depth_fit: StepCosts | None = None  # one depth level's seconds by the requests drafting in it
        self.read_token_s = 0.0  # the draft model's prompt read at admission, per prompt token, EMA
        self.draft_calls = 0  # timed draft-model calls (record_draft)
        self.verify = verify  # another forward drafter's costs whose verify fit this one reads (of())
        self.others: dict[str, StepCosts] = {}  # of(): a second forward drafter's depth and read costs

    def of(self, drafter: str) -> StepCosts:
        """A second forward drafter's costs: its own depth and read costs over this verify fit (its forwards
        cost what its own weights cost)."""
        if drafter not in self.others:
            self.others[drafter] = StepCosts(verify=self)
        return self.others[drafter]

    def record(self, rows: int, seconds: float) -> None:
        if self.verify is not None:
            return self.verify.record(rows, seconds)
        f, n = self.FORGET, float(rows)
        self.s0, self.s1, self.s2 = f * self.s0 + 1, f * self.s1 + n, f * self.s2 + n * n
        self.s3, self.s4 = f * self.s3 + n**3, f * self.s4 + n**4
        self.sy, self.sny = f * self.sy + seconds, f * self.sny + n * seconds
        self.sn2y = f * self.sn2y + n * n * seconds

    def record_draft(self, depth: int, seconds: float, rows: float = 1.0) -> None:
        """A draft-model call of `depth` levels (forwards) took `seconds`; rows: requests per level, on average."""
        if depth > 0:
            self.draft_calls += 1
            self.draft_depth_s = _ema(self.draft_depth_s, seconds / depth)
            if self.depth_fit is None:
                self.depth_fit = StepCosts()
            self.depth_fit.record(rows, seconds / depth)

    def depth_curve(self):
        """-> d(R), the seconds of one draft-model forward with R requests drafting in it (0 for none): the same
        fit as the verify step's over the timed depth forwards, else draft_depth_s for any R. A depth's cost
        grows with its rows as a verify's does, and on some CPUs steeply (an int8 copy on AVX2, whose products
        convert every weight, against one with VNNI): one mean over every row count
        prices a depth all eight streams draft at like the one-stream depths, and the copy drafts where it
        loses."""
        flat, fit = self.draft_depth_s, self.depth_fit.curve() if self.depth_fit is not None else None
        return lambda rows: 0.0 if rows <= 0 else fit(rows) if fit is not None else flat

    def record_read(self, tokens: int, seconds: float) -> None:
        if tokens > 0:
            self.read_token_s = _ema(self.read_token_s, seconds / tokens)

    @property
    def known(self) -> bool:
        return self.verify.known if self.verify is not None else self.s0 > 0

    def fit(self) -> tuple[float, float, float]:
        """-> (a, b, c) of cost(N) = a + b N + c N^2 in seconds, b > 0 and c >= 0. Centred normal equations in
        u = N - mean N and v = N^2 - mean N^2, with ridge priors: b toward b0 (5% of a) with weight lam, c toward
        0 with weight lam (2 mean N + 1)^2 (N^2 moves about 2 N + 1 a row)."""
        if self.verify is not None:
            return self.verify.fit()
        s0, lam = self.s0, self.SLOPE_WEIGHT
        m1, m2, my = self.s1 / s0, self.s2 / s0, self.sy / s0
        b0 = self.SLOPE_PRIOR * my / (1 + self.SLOPE_PRIOR * m1)  # prior: a + b0 N with b0 = 5% of a
        lam_c = lam * (2 * m1 + 1) ** 2
        suu, suv, svv = self.s2 - self.s1 * m1, self.s3 - self.s1 * m2, self.s4 - self.s2 * m2
        suy, svy = self.sny - self.s1 * my + lam * b0, self.sn2y - self.s2 * my
        det = (suu + lam) * (svv + lam_c) - suv * suv
        b = (suy * (svv + lam_c) - suv * svy) / det
        c = ((suu + lam) * svy - suv * suy) / det
        if b < 0 < c:  # falling at first: a parabola from a flat start instead
            b, c = 0.0, svy / (svv + lam_c)
        if c <= 0:  # bending down: the line
            b, c = suy / (suu + lam), 0.0
        b = max(b, 1e-9)
        return max(my - b * m1 - c * m2, 1e-9), b, c

    def curve(self):
        """-> cost(N), the fitted seconds of a step of N verify rows (fit() once, then pure arithmetic)."""
        a, b, c = self.fit()
        return lambda n: a + b * n + c * n * n


def _ema(mean: float, x: float) -> float:
    """A per-unit cost's running mean: the first observation as it is (0: none yet), then 0.8 old + 0.2 new."""
    return x if mean == 0 else 0.8 * mean + 0.2 * x


def probe_can_pay(rows: int, costs: StepCosts) -> bool:
    """Whether one draft-model draft could raise tokens per second in a step of `rows` verify rows even if it
    were surely accepted and no other request drafted with the model (a probe alone pays the whole draft
    forward, after feeding the draft model every token it missed while idle)."""
    if not costs.known or costs.draft_depth_s == 0:
        return True
    cost = costs.curve()
    return (rows + 1) / (cost(rows + 1) + costs.depth_curve()(1)) > rows / cost(rows)


def depth_can_pay(rows: int, costs: StepCosts, p: float) -> bool:
    """Whether one draft-model depth could raise tokens per second in a step of `rows` verify rows if every row
    drafted a token in it, accepted with probability p (the engine-wide rate): the depth's forward is shared by
    all the rows that draft at it, so this is where the model can pay at that many streams (its prompt reads at
    admission are worth it): rows (1 + p) / (cost(2 rows) + d) > rows / cost(rows). Fewer streams pay as the
    verify rows' cost grows."""
    if not costs.known or costs.draft_depth_s == 0:
        return True
    cost = costs.curve()
    return rows * (1 + p) / (cost(2 * rows) + costs.depth_curve()(rows)) > rows / cost(rows)


JOIN_ROW_SHARE = 0.1  # one more row in a draft forward, as a share of a depth's cost (a streamed weight serves
#                        every row: a row adds its arithmetic only)


def read_pays(rows: int, costs: StepCosts, p: float, tokens_left: int, prompt_len: int, joined: int = 0) -> bool:
    """Whether reading a request's prompt with the draft model at admission (a prefill of prompt_len tokens, at
    the measured seconds per token) costs less than the model's drafts can save over the tokens_left tokens it
    may still produce, at `rows` streams, `joined` of the others already drafting with the model. Two ways the
    drafts can save, the better counting:
    - a depth shared by every row, accepted with probability p: a step yields R = (1 + p) cost(rows) /
      (cost(2 rows) + d) times the tokens per second (depth_can_pay's comparison), so each of its tokens takes
      1 - 1 / R less of its share of a step, cost(rows) / rows;
    - joining depths the others pay for anyway (joined > 0): two drafts a step, p + p^2 tokens expected, each
      worth a token's share of a step, for two verify rows (cost(rows + 2) - cost(rows)) and two rows more in
      the depth forwards (JOIN_ROW_SHARE d each), over tokens_left / (1 + p + p^2) steps.
    Unknown costs (nothing measured yet): it pays, and the read is measured."""
    if not costs.known or costs.draft_depth_s == 0 or costs.read_token_s == 0:
        return True
    cost = costs.curve()
    rows = max(rows, 1)
    d, per_token = costs.depth_curve()(rows), cost(rows) / rows
    gain = (1 + p) * cost(rows) / (cost(2 * rows) + d)
    saved = tokens_left * per_token * (1 - 1 / gain) if gain > 1 else 0.0
    if joined > 0:
        expected = p + p * p
        per_step = expected * per_token - (cost(rows + 2) - cost(rows)) - 2 * JOIN_ROW_SHARE * d
        saved = max(saved, tokens_left / (1 + expected) * per_step)
    return saved > costs.read_token_s * prompt_len
