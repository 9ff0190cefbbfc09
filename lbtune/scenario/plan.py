"""From a scenario's load shape to a concrete plan: phases, users over time, send times.

Closed loop: :meth:`LoadPlan.users_at` gives the target user count at an offset
(what a Locust ``LoadTestShape.tick`` returns). Open loop: ``arrivals`` lists
every send offset, drawn once from the seed, so that every trial offers exactly
the same traffic at exactly the same times.

Open-loop arrivals are a renewal process in *operational time*: unit-rate gaps
(exponential for ``poisson``, 1 for ``constant``, gamma with mean 1 and the given
CV for ``gamma``) are mapped through the inverse of the cumulative offered load
``Λ(t) = ∫ rate``, which handles steps and linear ramps alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from lbtune.errors import ConfigError
from lbtune.scenario.limits import MAX_ARRIVALS, MAX_DURATION_S, MAX_RATE, MAX_USERS
from lbtune.scenario.models import Scenario
from lbtune.scenario.shapes import Arrival, RampShape, RateShape, Segment, SpikeShape, StepsShape
from lbtune.scenario.traces.replay import Replay, replay_of
from lbtune.scenario.traces.sessions import SessionReplay, session_replay_of

_ARRIVAL_TAG = 0xA1


@dataclass(frozen=True)
class Stage:
    """Offered load of one phase, ``[start_s, end_s)``.

    ``users`` (closed loop) or ``rate`` (open loop, requests/s) is the level at
    ``end_s``; when ``ramp_from`` is set the level rises (or falls) linearly from
    it at ``start_s``.
    """

    start_s: float
    end_s: float
    users: int | None
    rate: float | None
    label: str
    ramp_from: float | None = None

    def level_at(self, t: float) -> float:
        """Users or rate at offset ``t`` within this stage."""
        level = float(self.users if self.users is not None else self.rate or 0.0)
        if self.ramp_from is None or self.end_s <= self.start_s:
            return level
        f = (t - self.start_s) / (self.end_s - self.start_s)
        return self.ramp_from + (level - self.ramp_from) * min(max(f, 0.0), 1.0)


@dataclass(frozen=True)
class LoadPlan:
    """The load of one test run."""

    mode: Literal["closed", "open"]
    duration_s: float
    stages: tuple[Stage, ...]
    warmup_s: float
    cooldown_s: float
    arrivals: tuple[float, ...] = ()
    """Open loop: every send offset in seconds from the start; empty for closed loop."""
    arrival: Literal["poisson", "constant", "gamma"] | None = None
    cv: float | None = None

    def stage_at(self, t: float) -> Stage | None:
        """The phase running at offset ``t`` (``None`` before 0 or from ``duration_s`` on)."""
        if t < 0 or t >= self.duration_s:
            return None
        for s in self.stages:
            if t < s.end_s:
                return s
        return self.stages[-1]

    def users_at(self, t: float) -> int:
        """Closed loop: target users at offset ``t`` (0 outside the test; 0 in open loop)."""
        s = self.stage_at(t)
        if s is None or self.mode == "open":
            return 0
        return math.floor(s.level_at(t) + 0.5)

    def rate_at(self, t: float) -> float:
        """Open loop: offered requests/s at offset ``t`` (0 outside the test; 0 in closed loop)."""
        s = self.stage_at(t)
        if s is None or self.mode == "closed":
            return 0.0
        return s.level_at(t)

    @property
    def max_users(self) -> int:
        """Closed loop: the most users at any time."""
        if self.mode == "open":
            return 0
        return max(
            math.floor(max(s.level_at(s.start_s), s.level_at(s.end_s)) + 0.5) for s in self.stages
        )

    @property
    def measure_window(self) -> tuple[float, float]:
        """``(start, end)`` offsets of the measurement window (warm-up, cool-down excluded)."""
        return self.warmup_s, self.duration_s - self.cooldown_s


def plan_load(
    scenario: Scenario,
    duration_s: float | None = None,
    users: int | None = None,
    rate: float | None = None,
    seed: int | None = None,
    hold_until_s: float | None = None,
) -> LoadPlan:
    """The load plan of ``scenario``.

    ``duration_s`` stretches or shrinks the shape's timeline to a new test length
    (warm-up and cool-down shrink with a shorter test and keep their seconds in a
    longer one). ``users`` or ``rate`` scales the
    shape so that its reference level (see :mod:`.shapes`) becomes that value;
    ``rate`` on a closed-loop shape (or ``users`` on an open one) switches the
    loop, keeping the form (Poisson arrivals when switching to open).

    ``hold_until_s`` (longer than the test) appends a ``hold`` stage that keeps the last
    stage's final level until that offset (``--until-samples``: the run may go on until
    the window holds enough requests); the cool-down then comes at the end of the hold.
    """
    if users is not None and rate is not None:
        raise ConfigError("give --users or --rate, not both")
    if users is not None and users < 1:
        raise ConfigError(f"--users: must be >= 1, got {users}")
    if rate is not None and not rate > 0:
        raise ConfigError(f"--rate: must be > 0, got {rate}")
    if duration_s is not None and not duration_s > 0:
        raise ConfigError(f"--duration: must be > 0, got {duration_s}")
    if hold_until_s is not None and not hold_until_s > 0:
        raise ConfigError(f"--max-duration: must be > 0, got {hold_until_s}")
    if scenario.source is not None and scenario.source.timed:
        return _trace_plan(scenario, duration_s, users, rate, seed, hold_until_s)
    shape = scenario.load
    duration = scenario.duration_s if duration_s is None else float(duration_s)
    stretch = duration / scenario.duration_s
    # A shorter test keeps the same proportions: warm-up and cool-down shrink with it
    # (a longer one keeps their seconds: a warm cache does not take longer to fill).
    shrink = min(1.0, stretch)
    warmup, cooldown = scenario.warmup_s * shrink, scenario.cooldown_s * shrink
    if warmup + cooldown >= duration:
        raise ConfigError(
            f"--duration {duration:g}: no measurement window left after warmup_s "
            f"({warmup:g}) and cooldown_s ({cooldown:g})"
        )
    segs = shape.segments(scenario.duration_s)
    mode = shape.mode()
    scale = 1.0
    if users is not None:
        mode, scale = "closed", users / shape.reference()
    elif rate is not None:
        mode, scale = "open", rate / shape.reference()
    stages = tuple(_stage(seg, stretch, scale, mode) for seg in segs)
    if hold_until_s is not None and hold_until_s > duration:
        last = stages[-1]
        level = last.level_at(last.end_s)
        users_ = math.floor(level + 0.5) if mode == "closed" else None
        rate_ = level if mode == "open" else None
        stages = (*stages, Stage(duration, float(hold_until_s), users_, rate_, "hold"))
        duration = float(hold_until_s)
    _check_levels(stages, mode)
    if mode == "closed":
        return LoadPlan("closed", duration, stages, warmup, cooldown)
    arrival: Arrival = "poisson"
    cv: float | None = None
    if (
        isinstance(shape, RateShape | RampShape | StepsShape | SpikeShape)
        and shape.mode() == "open"
    ):
        arrival = shape.arrival or "poisson"
        cv = shape.cv if arrival == "gamma" else None
    times = _arrivals(stages, duration, arrival, cv, scenario.seed if seed is None else seed)
    return LoadPlan("open", duration, stages, warmup, cooldown, times, arrival, cv)


def default_duration(scenario: Scenario) -> float:
    """The test length when none is given: a timed trace's replay span (an agentic trace:
    of its session starts) unless the scenario sets ``duration_s`` itself, else
    ``duration_s``."""
    src = scenario.source
    if src is not None and src.timed and "duration_s" not in scenario.model_fields_set:
        return _replay(scenario, None).span_s
    return scenario.duration_s


def _replay(scenario: Scenario, seed: int | None) -> Replay | SessionReplay:
    """A timed trace's selection: its requests, or its sessions (agentic formats)."""
    src = scenario.source
    if src is not None and src.sessions:
        return session_replay_of(scenario, seed)
    return replay_of(scenario, seed)


def _trace_plan(
    scenario: Scenario,
    duration_s: float | None,
    users: int | None,
    rate: float | None,
    seed: int | None,
    hold_until_s: float | None,
) -> LoadPlan:
    """Open loop at the trace's own send times (see :mod:`.traces.replay`); an agentic
    trace's are its sessions' starts (:mod:`.traces.sessions`), or, with ``users``, a closed
    loop of that many users running the window's sessions back to back."""
    src = scenario.source
    assert src is not None
    unit = "sessions" if src.sessions else "requests"
    if src.sessions and rate is not None:
        raise ConfigError(
            f"a {src.format} trace sets its own session starts: --rate does not apply (use "
            "speedup, rate_scale or limit in the source, or --users N to run its sessions "
            "back to back on N users)"
        )
    if not src.sessions and (users is not None or rate is not None):
        raise ConfigError(
            f"a {src.format} trace sets its own arrivals: --users/--rate do not apply "
            "(use speedup, rate_scale or limit in the source)"
        )
    if hold_until_s is not None:
        raise ConfigError("--until-samples does not apply to a trace replay (use a longer window)")
    replay = _replay(scenario, seed)
    duration = default_duration(scenario) if duration_s is None else float(duration_s)
    if not duration <= MAX_DURATION_S:
        raise ConfigError(
            f"{src.trace}: the replay would last {duration:.3g} s (its {unit} span "
            f"{replay.span_s * src.speedup:.3g} s of trace time at speedup {src.speedup:g}), "
            f"more than the {MAX_DURATION_S:g} s a run may last; set duration_s (--duration), "
            "start and limit, or a higher speedup"
        )
    warmup, cooldown = scenario.warmup_s, scenario.cooldown_s
    if warmup + cooldown >= duration:
        raise ConfigError(
            f"trace replay of {duration:g} s: no measurement window left after warmup_s "
            f"({warmup:g}) and cooldown_s ({cooldown:g})"
        )
    if users is not None:  # agentic: closed loop, the window's sessions back to back
        stage = Stage(0.0, duration, users, None, f"trace {src.format} sessions, {users} users")
        _check_levels((stage,), "closed")
        return LoadPlan("closed", duration, (stage,), warmup, cooldown)
    times = tuple(t for t in replay.offsets or () if t < duration)
    if len(times) > MAX_ARRIVALS:
        raise ConfigError(
            f"{src.trace}: {len(times)} {unit} to replay, more than the {MAX_ARRIVALS} a "
            "plan may hold; set limit or rate_scale"
        )
    label = f"trace {src.format} x{src.speedup:g}"
    stage = Stage(0.0, duration, None, len(times) / duration, label)
    return LoadPlan("open", duration, (stage,), warmup, cooldown, times, None, None)


def _check_levels(stages: tuple[Stage, ...], mode: str) -> None:
    """The load scaled by ``--users``/``--rate`` stays within what lbtune runs."""
    peak = max((max(s.level_at(s.start_s), s.level_at(s.end_s)) for s in stages), default=0.0)
    if mode == "closed" and peak > MAX_USERS:
        raise ConfigError(
            f"load: the shape scaled to {peak:g} users at its peak, more than the {MAX_USERS} "
            "lbtune runs; lower --users"
        )
    if mode == "open" and peak > MAX_RATE:
        raise ConfigError(
            f"load: the shape scaled to {peak:g} req/s at its peak, more than the {MAX_RATE:g} "
            "lbtune sends; lower --rate"
        )


def _stage(seg: Segment, stretch: float, scale: float, mode: str) -> Stage:
    level = seg.level1 * scale
    ramp_from = seg.level0 * scale if seg.level0 != seg.level1 else None
    if mode == "closed":
        return Stage(
            seg.start * stretch,
            seg.end * stretch,
            max(math.floor(level + 0.5), 0),
            None,
            seg.label,
            ramp_from,
        )
    return Stage(seg.start * stretch, seg.end * stretch, None, level, seg.label, ramp_from)


def _arrivals(
    stages: tuple[Stage, ...], duration: float, arrival: str, cv: float | None, seed: int
) -> tuple[float, ...]:
    # Cumulative offered load at each stage boundary.
    bounds = [0.0]
    for s in stages:
        r0, r1 = s.level_at(s.start_s), s.level_at(s.end_s)
        bounds.append(bounds[-1] + (r0 + r1) / 2 * (s.end_s - s.start_s))
    total = bounds[-1]
    if total <= 0:
        return ()
    if total > MAX_ARRIVALS:
        raise ConfigError(
            f"load: about {total:.3g} requests in {duration:g} s, more than the {MAX_ARRIVALS} "
            "an open-loop plan may hold; lower the rate or the duration"
        )
    import numpy as np  # lazily: importing lbtune.scenario stays light for the load generator

    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, _ARRIVAL_TAG])))
    chunk = max(int(total * 1.1) + 64, 1024)
    ops: list[Any] = []
    last = 0.0
    while last < total:
        if arrival == "constant":
            gaps = np.ones(chunk)
        elif arrival == "gamma":
            k = 1.0 / (cv or 1.0) ** 2
            gaps = rng.gamma(k, 1.0 / k, size=chunk)
        else:
            gaps = rng.exponential(1.0, size=chunk)
        pts = last + np.cumsum(gaps)
        if arrival == "constant" and not ops:
            pts -= 1.0  # first send at t=0
        ops.append(pts)
        last = float(pts[-1])
    op = np.concatenate(ops)
    op = op[op < total]
    out = np.empty_like(op)
    idx = np.searchsorted(np.asarray(bounds), op, side="right") - 1
    for k, s in enumerate(stages):
        sel = idx == k
        if not sel.any():
            continue
        x = op[sel] - bounds[k]
        r0, r1, span = s.level_at(s.start_s), s.level_at(s.end_s), s.end_s - s.start_s
        if abs(r1 - r0) < 1e-12:
            out[sel] = s.start_s + x / r0
        else:  # Λ(τ) = r0 τ + (r1 - r0) τ² / (2 span): solve for τ
            a = (r1 - r0) / (2 * span)
            out[sel] = s.start_s + (-r0 + np.sqrt(r0 * r0 + 4 * a * x)) / (2 * a)
    out = np.clip(out, 0.0, np.nextafter(duration, 0.0))
    return tuple(float(t) for t in np.sort(out))
