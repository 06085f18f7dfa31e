"""What a step costs, for num_draft_tokens auto (adaptive.py): the verify step's seconds by its verify rows, a
draft-model depth's seconds and a draft model's prompt read per token, all from the engine's own timings; and the
questions the planner asks of them before it drafts (can one depth, or one probe, pay at this many streams? does
reading a prompt with the draft model pay over the request's remaining tokens?)."""
from __future__ import annotations


class StepCosts:
    """Seconds per decode step as a function of its verify rows N: a + b N, fitted online by least squares with
    forgetting; b is shrunk toward a prior share of a, so few distinct N still give a usable slope."""

    FORGET = 0.97
    SLOPE_PRIOR = 0.05      # one more row ~ 5% of a 1-row step (CPU forward: weight reads dominate)
    SLOPE_WEIGHT = 4.0      # the prior counts like this many observations one row apart

    def __init__(self) -> None:
        self.s0 = self.s1 = self.s2 = self.sy = self.sny = 0.0
        self.draft_depth_s = 0.0        # one draft-model forward (one depth level), EMA
        self.read_token_s = 0.0         # the draft model's prompt read at admission, per prompt token, EMA

    def record(self, rows: int, seconds: float) -> None:
        f = self.FORGET
        self.s0, self.s1, self.s2 = f * self.s0 + 1, f * self.s1 + rows, f * self.s2 + rows * rows
        self.sy, self.sny = f * self.sy + seconds, f * self.sny + rows * seconds

    def record_draft(self, depth: int, seconds: float) -> None:
        if depth > 0:
            self.draft_depth_s = _ema(self.draft_depth_s, seconds / depth)

    def record_read(self, tokens: int, seconds: float) -> None:
        if tokens > 0:
            self.read_token_s = _ema(self.read_token_s, seconds / tokens)

    @property
    def known(self) -> bool:
        return self.s0 > 0

    def line(self) -> tuple[float, float]:
        """-> (a, b) of cost(N) = a + b N in seconds."""
        mean_n, mean_y = self.s1 / self.s0, self.sy / self.s0
        b0 = self.SLOPE_PRIOR * mean_y / (1 + self.SLOPE_PRIOR * mean_n)    # prior: a + b0 N with b0 = 5% of a
        lam = self.SLOPE_WEIGHT
        var = self.s2 - self.s1 * mean_n          # sum of w (N - mean)^2
        cov = self.sny - self.s1 * mean_y         # sum of w (N - mean)(y - mean)
        b = max((cov + lam * b0) / (var + lam), 1e-9)
        a = max(mean_y - b * mean_n, 1e-9)
        return a, b


def _ema(mean: float, x: float) -> float:
    """A per-unit cost's running mean: the first observation as it is (0: none yet), then 0.8 old + 0.2 new."""
    return x if mean == 0 else 0.8 * mean + 0.2 * x


def probe_can_pay(rows: int, costs: StepCosts) -> bool:
    """Whether one draft-model draft could raise tokens per second in a step of `rows` verify rows even if it
    were surely accepted and no other request drafted with the model (a probe alone pays the whole draft
    forward, after feeding the draft model every token it missed while idle)."""
    if not costs.known or costs.draft_depth_s == 0:
        return True
    a, b = costs.line()
    return (rows + 1) / (a + b * (rows + 1) + costs.draft_depth_s) > rows / (a + b * rows)


def depth_can_pay(rows: int, costs: StepCosts, p: float) -> bool:
    """Whether one draft-model depth could raise tokens per second in a step of `rows` verify rows if every row
    drafted a token in it, accepted with probability p (the engine-wide rate): the depth's forward is shared by
    all the rows that draft at it, so this is where the model can pay at that many streams (its prompt reads at
    admission are worth it). rows (1 + p) / (a + 2 b rows + d) > rows / (a + b rows), i.e.
    p a - (1 - p) b rows > d: fewer streams pay as the verify rows' cost grows."""
    if not costs.known or costs.draft_depth_s == 0:
        return True
    a, b = costs.line()
    return rows * (1 + p) / (a + 2 * b * rows + costs.draft_depth_s) > rows / (a + b * rows)


JOIN_ROW_SHARE = 0.1   # one more row in a draft forward, as a share of a depth's cost (int8 copy of SmolLM2-135M:
#                        3.6 ms for 1 row, 5.8 ms for 8: ~0.31 ms a row)


def read_pays(rows: int, costs: StepCosts, p: float, tokens_left: int, prompt_len: int, joined: int = 0) -> bool:
    """Whether reading a request's prompt with the draft model at admission (a prefill of prompt_len tokens, at
    the measured seconds per token) costs less than the model's drafts can save over the tokens_left tokens it
    may still produce, at `rows` streams, `joined` of the others already drafting with the model. Two ways the
    drafts can save, the better counting:
    - a depth shared by every row, accepted with probability p: a step yields R = (1 + p)(a + b rows) /
      (a + 2 b rows + d) times the tokens per second (depth_can_pay's comparison), so each of its tokens takes
      1 - 1 / R less of its share of a step, (a + b rows) / rows;
    - joining depths the others pay for anyway (joined > 0): two drafts a step, p + p^2 tokens expected, each
      worth a token's share of a step, for two verify rows and two rows more in the depth forwards (b +
      JOIN_ROW_SHARE d each), over tokens_left / (1 + p + p^2) steps.
    Unknown costs (nothing measured yet): it pays, and the read is measured."""
    if not costs.known or costs.draft_depth_s == 0 or costs.read_token_s == 0:
        return True
    a, b = costs.line()
    rows = max(rows, 1)
    d, per_token = costs.draft_depth_s, (a + b * rows) / rows
    gain = (1 + p) * (a + b * rows) / (a + 2 * b * rows + d)
    saved = tokens_left * per_token * (1 - 1 / gain) if gain > 1 else 0.0
    if joined > 0:
        expected = p + p * p
        per_step = expected * per_token - 2 * (b + JOIN_ROW_SHARE * d)
        saved = max(saved, tokens_left / (1 + expected) * per_step)
    return saved > costs.read_token_s * prompt_len
