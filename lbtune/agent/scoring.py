"""Pure scoring of replicas and the weights derived from the scores, with guard rails.

No I/O, no clock, no globals: :func:`step` takes the previous :class:`AgentState`, the
raw per-replica inputs and the live weights, and returns the next state and one
:class:`Decision` per replica. Every number below can be checked by hand.

1. **Normalise** each input to [0, 1]: ``kv = clamp(kv_usage)``,
   ``latency_norm = min(1, ttft / ttft_ceiling_s)``,
   ``queue_norm = min(1, waiting / queue_ceiling)``. With no TTFT in the window
   (no first token there), an idle replica (nothing running or waiting) has
   latency 0, a busy one keeps its previous latency.
2. **Spike filter** (sliding-window z-score, per replica and input): the window
   holds the last ``z_window`` *accepted* samples. Once it has 3 or more,
   ``z = (x - mean) / max(std, z_min_sigma)`` (population std-dev); a sample with
   ``|z| > z_threshold`` is a spike: it is dropped (neither smoothed nor added to
   the window) and the previous smoothed value is kept. After ``z_max_drops``
   consecutive drops the next outlier is taken as a level shift: it is accepted
   and the window restarts from it. The floor on sigma keeps a flat window from
   treating tiny noise as a spike.
3. **EWMA** of the accepted samples: ``s = alpha * x + (1 - alpha) * s_prev``
   (the first sample starts it).
4. **Score** = ``a*(1 - kv) + b*(1 - latency_norm) + c*(1 - queue_norm)`` on the
   smoothed values.
5. **Target weight** of each live replica: ``floor(max_weight * score / best + 0.5)``
   (best = highest score among live replicas; all zero → ``max_weight`` each), then
   clamped to ``[min_weight, max_weight]``.
6. **Guard rails**, in order: the change from the live weight is at most
   ``max_step`` (but never below ``min_weight``); a change smaller than ``deadband``
   is not made (the live weight stays, so noise causes no churn); a replica whose *raw* KV usage
   reaches ``drain_kv_threshold`` is drained (weight 0, at once) and stays drained
   until its raw KV usage is at or below ``recover_kv_threshold`` (hysteresis),
   then climbs back by ``max_step`` per step; a replica without inputs keeps its
   live weight; if every replica would be at 0, the best scored one (ties: name)
   is kept at ``min_weight``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from lbtune.agent.config import AgentConfig

__all__ = [
    "AgentState",
    "Decision",
    "Normalised",
    "ReplicaInputs",
    "SeriesState",
    "ewma",
    "normalise",
    "score",
    "smooth",
    "step",
    "target_weights",
]

INPUTS = ("kv", "latency", "queue")


@dataclass(frozen=True, slots=True)
class ReplicaInputs:
    """Raw inputs of one replica, as read from Prometheus (``None``: not available)."""

    kv_usage: float | None
    waiting: float | None
    running: float | None = None
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None

    def ttft(self, quantile: str) -> float | None:
        return self.ttft_p90_s if quantile == "p90" else self.ttft_p50_s


@dataclass(frozen=True, slots=True)
class Normalised:
    """Inputs in [0, 1]: KV usage, latency and queue, 1 = at or above its ceiling."""

    kv: float
    latency: float | None
    queue: float

    def get(self, name: str) -> float | None:
        value: float | None = getattr(self, name)
        return value


@dataclass(frozen=True, slots=True)
class SeriesState:
    """Smoothing state of one input of one replica."""

    ewma: float | None = None
    window: tuple[float, ...] = ()
    drops: int = 0


@dataclass(frozen=True, slots=True)
class AgentState:
    """Everything the scoring remembers between steps."""

    series: Mapping[tuple[str, str], SeriesState] = field(default_factory=dict)
    """(replica, input) → smoothing state; input is ``kv``, ``latency`` or ``queue``."""
    drained: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Decision:
    """What the agent decided for one replica, and why."""

    replica: str
    previous: int
    """The live weight before this step."""
    weight: int
    """The weight to set (equal to ``previous`` when nothing changes)."""
    score: float | None
    target: int | None
    """The weight from the score alone, before the step limit and drain."""
    raw: ReplicaInputs | None
    smoothed: Normalised | None
    reasons: tuple[str, ...]
    """Among ``score``, ``min_weight``, ``max_step``, ``deadband``, ``drain``, ``draining``,
    ``recover``, ``spike``, ``no_data``, ``never_all_zero``."""

    @property
    def changed(self) -> bool:
        return self.weight != self.previous


def _clamp(x: float, lo: float = 0.0, hi: float = 1.0) -> float:
    return min(hi, max(lo, x))


def _round(x: float) -> int:
    """Round half up (Python's round() rounds half to even)."""
    return math.floor(x + 0.5)


def normalise(raw: ReplicaInputs, cfg: AgentConfig) -> Normalised | None:
    """Inputs in [0, 1], or ``None`` when KV usage or the queue is missing.

    ``latency`` is ``None`` when there is no TTFT and the replica is busy (the caller
    keeps the previous value); 0 when there is no TTFT and the replica is idle.
    """
    if raw.kv_usage is None or raw.waiting is None:
        return None
    ttft = raw.ttft(cfg.ttft_quantile)
    latency: float | None
    if ttft is not None:
        latency = _clamp(ttft / cfg.ttft_ceiling_s)
    elif not raw.waiting and not raw.running:
        latency = 0.0
    else:
        latency = None
    return Normalised(
        kv=_clamp(raw.kv_usage),
        latency=latency,
        queue=_clamp(raw.waiting / cfg.queue_ceiling),
    )


def ewma(previous: float | None, x: float, alpha: float) -> float:
    """``alpha * x + (1 - alpha) * previous``; the first sample starts the average."""
    return x if previous is None else alpha * x + (1.0 - alpha) * previous


def zscore(window: tuple[float, ...], x: float, min_sigma: float) -> float | None:
    """z of ``x`` against ``window`` (population std-dev floored at ``min_sigma``);
    ``None`` while the window has fewer than 3 samples."""
    if len(window) < 3:
        return None
    mean = sum(window) / len(window)
    sd = math.sqrt(sum((v - mean) ** 2 for v in window) / len(window))
    sigma = max(sd, min_sigma)
    if sigma < 1e-12:  # a flat window (up to rounding of the mean)
        return 0.0 if abs(x - mean) < 1e-12 else math.copysign(math.inf, x - mean)
    return (x - mean) / sigma


def smooth(series: SeriesState, x: float, cfg: AgentConfig) -> tuple[SeriesState, float, bool]:
    """Spike filter then EWMA: ``(new state, smoothed value, dropped as a spike)``."""
    window = series.window
    z = zscore(window, x, cfg.z_min_sigma)
    if z is not None and abs(z) > cfg.z_threshold:
        if series.drops < cfg.z_max_drops:
            kept = series.ewma if series.ewma is not None else x
            return SeriesState(series.ewma, window, series.drops + 1), kept, True
        window = ()  # a level shift, not a spike: restart the window from here
    value = ewma(series.ewma, x, cfg.ewma_alpha)
    return SeriesState(value, (*window, x)[-cfg.z_window :], 0), value, False


def score(n: Normalised, cfg: AgentConfig) -> float:
    """``a*(1 - kv) + b*(1 - latency_norm) + c*(1 - queue_norm)`` (latency None → 0)."""
    latency = n.latency or 0.0
    return cfg.a * (1.0 - n.kv) + cfg.b * (1.0 - latency) + cfg.c * (1.0 - n.queue)


def target_weights(scores: Mapping[str, float], cfg: AgentConfig) -> dict[str, int]:
    """Scores → weights in ``[min_weight, max_weight]``, the best at ``max_weight``."""
    if not scores:
        return {}
    best = max(scores.values())
    return {
        r: max(cfg.min_weight, min(cfg.max_weight, _unclamped(s, best, cfg)))
        for r, s in scores.items()
    }


def _unclamped(s: float, best: float, cfg: AgentConfig) -> int:
    return cfg.max_weight if best <= 0 else _round(cfg.max_weight * max(s, 0.0) / best)


def _smooth_replica(
    replica: str, n: Normalised, state: AgentState, cfg: AgentConfig
) -> tuple[dict[tuple[str, str], SeriesState], Normalised, bool]:
    updates: dict[tuple[str, str], SeriesState] = {}
    values: dict[str, float | None] = {}
    spiked = False
    for name in INPUTS:
        key = (replica, name)
        prev = state.series.get(key, SeriesState())
        x = n.get(name)
        if x is None:  # busy without a TTFT sample: keep the previous latency
            values[name] = prev.ewma
            continue
        updates[key], values[name], dropped = smooth(prev, x, cfg)
        spiked = spiked or dropped
    smoothed = Normalised(
        kv=values["kv"] or 0.0, latency=values["latency"], queue=values["queue"] or 0.0
    )
    return updates, smoothed, spiked


def step(
    cfg: AgentConfig,
    state: AgentState,
    inputs: Mapping[str, ReplicaInputs | None],
    current: Mapping[str, int],
) -> tuple[AgentState, list[Decision]]:
    """One scoring step for the replicas in ``current`` (replica → live weight)."""
    series = dict(state.series)
    drained = set(state.drained)
    scores: dict[str, float] = {}
    smoothed: dict[str, Normalised] = {}
    reasons: dict[str, list[str]] = {r: [] for r in current}
    for r in sorted(current):
        raw = inputs.get(r)
        n = normalise(raw, cfg) if raw is not None else None
        if raw is None or n is None or raw.kv_usage is None:
            reasons[r].append("no_data")
            continue
        updates, smoothed[r], spiked = _smooth_replica(r, n, state, cfg)
        series.update(updates)
        scores[r] = score(smoothed[r], cfg)
        if spiked:
            reasons[r].append("spike")
        if r in drained and raw.kv_usage <= cfg.recover_kv_threshold:
            drained.discard(r)
            reasons[r].append("recover")
        elif r not in drained and raw.kv_usage >= cfg.drain_kv_threshold:
            drained.add(r)
            reasons[r].append("drain")
        elif r in drained:
            reasons[r].append("draining")

    live = {r: s for r, s in scores.items() if r not in drained}
    targets = target_weights(live, cfg)
    weights: dict[str, int] = {}
    for r in sorted(current):
        prev = current[r]
        if r not in scores:
            weights[r] = prev
        elif r in drained:
            weights[r] = 0
        else:
            t = targets[r]
            reasons[r].append("score")
            if _unclamped(scores[r], max(live.values()), cfg) < cfg.min_weight:
                reasons[r].append("min_weight")
            w = min(max(t, prev - cfg.max_step), prev + cfg.max_step)
            if w != t:
                reasons[r].append("max_step")
            w = max(cfg.min_weight, w)
            if prev >= cfg.min_weight and 0 < abs(w - prev) < cfg.deadband:
                w = prev
                reasons[r].append("deadband")
            weights[r] = w

    if current and all(w == 0 for w in weights.values()):
        ranked = sorted(current, key=lambda r: (-scores.get(r, -math.inf), r))
        best = ranked[0]
        weights[best] = cfg.min_weight
        reasons[best].append("never_all_zero")

    decisions = [
        Decision(
            replica=r,
            previous=current[r],
            weight=weights[r],
            score=scores.get(r),
            target=0 if r in drained and r in scores else targets.get(r),
            raw=inputs.get(r),
            smoothed=smoothed.get(r),
            reasons=tuple(reasons[r]),
        )
        for r in sorted(current)
    ]
    return AgentState(series=series, drained=frozenset(drained)), decisions
