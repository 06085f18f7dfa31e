"""Falling back to plain decoding where speculation does not pay, by what the steps realise (num_draft_tokens auto).

The planner drafts by a model: acceptance estimates and the cost fit of the forwards it times. The step's work
that no forward timing covers (lookups, grammar masks, commits, the responses) and the fit's error can tip its
choices into a small loss against no speculation where rows are dear (many streams; an int8 copy whose products
turn compute-bound early). This check measures instead: for each number of decoding requests it keeps the output
rate of the steps where the planner drafts freely ("free") and of the steps where the auto requests draft
nothing ("held"), each rate as committed tokens over the whole interval from a step's start to the next step's
start (everything the engine thread does per step), and runs the side that realised more. The other side is run
again now and then, a few steps at a time, so that the choice follows the workload; the first step of a run is
not measured (a draft model catching up on the tokens it missed pays it).

Only decode steps count (no prompt chunk: a prefill's cost is not the decode's), and only steps with an auto
request; fixed-k requests draft as asked whatever this chooses. Output is exact either way: this only decides
whether the auto requests draft in a step.
"""

from __future__ import annotations

from dataclasses import dataclass

FORGET = 0.85  # per measured step: each rate follows about its last seven steps of that side
SAMPLES = 4  # measured steps of a side before its rate is trusted
RUN = 4  # steps of the other side per probe (the first one not measured)
PROBE_EVERY = 24  # steps of the leading side between probes of the other
WIDE = 0.25  # a side this far ahead is probed against only every WIDE_EVERY steps: the probes cost more, tell less
WIDE_EVERY = 96


@dataclass
class Rate:
    """One side's discounted committed tokens and seconds at one number of streams: tokens per second."""

    tokens: float = 0.0
    seconds: float = 0.0
    samples: int = 0

    def observe(self, tokens: int, seconds: float) -> None:
        self.tokens = FORGET * self.tokens + tokens
        self.seconds = FORGET * self.seconds + seconds
        self.samples += 1

    @property
    def known(self) -> bool:
        return self.samples >= SAMPLES

    @property
    def value(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Streams:
    """The check's state at one number of decoding requests."""

    free: Rate
    held: Rate
    since: int = 0  # steps of the leading side since the last probe
    probing: int = 0  # steps of the probe still to run

    def leader(self) -> bool:
        """-> True where the held side leads: it realised more (free leads until both are known)."""
        return self.free.known and self.held.known and self.held.value > self.free.value

    def period(self) -> int:
        if not (self.free.known and self.held.known):
            return RUN  # learn both sides first
        lo, hi = sorted((self.free.value, self.held.value))
        return WIDE_EVERY if hi > (1 + WIDE) * lo else PROBE_EVERY


class Fallback:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.at: dict[int, Streams] = {}  # decoding requests -> the check's state there
        self.last: tuple[int, bool] | None = None  # the previous step's (streams, held) where it was a decode step
        self.open: tuple | None = None  # this step's (streams, held, measured, requests, tokens before, start)
        self.steps = 0  # decode steps with an auto request, where this chose (statistics)
        self.held_steps = 0  # of them, those the auto requests drafted nothing in

    def begin(self, decoding: list, decode_only: bool, now: float) -> bool:
        """A step starts at `now` with these decoding requests (decode_only: no prompt chunk in it) -> whether its
        auto requests draft nothing. Ends the previous step's interval first (end() said whether it counts)."""
        self._close(now)
        if not self.enabled or not decode_only or not any(r.params.auto_draft for r in decoding):
            self.last = None
            return False
        n, self.steps = len(decoding), self.steps + 1
        st = self.at.setdefault(n, Streams(Rate(), Rate()))
        lead = st.leader()
        if st.probing:
            st.probing -= 1
            held = not lead
        else:
            st.since += 1
            held = lead
            if st.since >= st.period():
                st.since, st.probing, held = 0, RUN - 1, not lead
        measured = self.last == (n, held)  # a run's first step carries the switch's costs
        self.last = (n, held)
        self.open = (n, held, measured, decoding, sum(len(r.output_ids) for r in decoding), now)
        self.held_steps += held
        return held

    def end(self, more: bool) -> None:
        """The step's work is done; more: whether the engine has work left (else the next step's start may be far
        off, after an idle wait, and its interval does not count)."""
        if self.open is not None and not more:
            self.open = None

    def _close(self, now: float) -> None:
        if self.open is None:
            return
        n, held, measured, reqs, before, start = self.open
        self.open = None
        if measured and now > start:
            st = self.at[n]
            (st.held if held else st.free).observe(sum(len(r.output_ids) for r in reqs) - before, now - start)

    def rates(self, streams: int) -> tuple[float, float] | None:
        """-> (free, held) output rates measured at this many decoding requests, tokens per second (0: none)."""
        st = self.at.get(streams)
        return None if st is None else (st.free.value, st.held.value)
