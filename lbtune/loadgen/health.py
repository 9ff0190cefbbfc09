"""Generator self-health: is the load generator itself keeping up?

Three signals per generator process, sampled every second:

* scheduling lateness (open loop): ``sent_at - scheduled_at`` of every request;
* event-loop lag: a greenlet sleeps 10 ms and measures how late it wakes up —
  the same delay a response byte waits before it is time-stamped;
* CPU % of the process (psutil; 100 = one core).

``degraded`` when lateness P99 > 10 ms, loop-lag P99 > 5 ms or CPU P90 > 90 %
(the first second, which holds start-up work, is left out of the CPU figure).
The dataclasses here are pure; only :class:`HealthMonitor` needs gevent, and
imports it when started.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from time import perf_counter, time
from typing import Any

__all__ = [
    "CPU_LIMIT_PERCENT",
    "LAG_P99_LIMIT_S",
    "LATENESS_P99_LIMIT_S",
    "GeneratorHealth",
    "HealthMonitor",
    "HealthSample",
    "WorkerHealth",
    "assess",
    "percentile",
]

LATENESS_P99_LIMIT_S = 0.010
LAG_P99_LIMIT_S = 0.005
"""A timestamp taken by a late greenlet is late by the same amount: 5 ms of loop lag is
the TTFT accuracy lbtune promises at P99 (benchmarks/ttft_accuracy.py)."""
CPU_LIMIT_PERCENT = 90.0
_TICK_S = 0.010


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100); ``None`` when empty."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class HealthSample:
    """One second of one generator process."""

    t: float
    worker: str
    cpu_percent: float
    loop_lag_p99_s: float
    loop_lag_max_s: float
    lateness_p99_s: float | None
    in_flight: int
    sent: int
    completed: int
    in_flight_cap_hits: int


def assess(
    lateness: Sequence[float], lag: Sequence[float], cpu: Sequence[float]
) -> tuple[bool, list[str]]:
    """(degraded, reasons) from raw lateness/lag samples and per-second CPU %."""
    reasons: list[str] = []
    lp = percentile(lateness, 99)
    if lp is not None and lp > LATENESS_P99_LIMIT_S:
        reasons.append(f"scheduling lateness P99 {lp * 1e3:.1f} ms > 10 ms")
    gp = percentile(lag, 99)
    if gp is not None and gp > LAG_P99_LIMIT_S:
        reasons.append(f"event-loop lag P99 {gp * 1e3:.1f} ms > {LAG_P99_LIMIT_S * 1e3:g} ms")
    cp = percentile(list(cpu[1:]) if len(cpu) > 1 else list(cpu), 90)
    if cp is not None and cp > CPU_LIMIT_PERCENT:
        reasons.append(f"CPU P90 {cp:.0f} % > 90 %")
    return bool(reasons), reasons


@dataclass(frozen=True, slots=True)
class WorkerHealth:
    """Summary of one generator process over the whole run."""

    worker: str
    pid: int
    lateness_p50_s: float | None
    lateness_p99_s: float | None
    lateness_max_s: float | None
    loop_lag_p50_s: float | None
    loop_lag_p99_s: float | None
    cpu_mean_percent: float | None
    cpu_p90_percent: float | None
    in_flight_cap_hits: int
    degraded: bool
    reasons: tuple[str, ...]
    samples: tuple[HealthSample, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> WorkerHealth:
        d = dict(d)
        d["reasons"] = tuple(d.get("reasons") or ())
        d["samples"] = tuple(HealthSample(**s) for s in d.get("samples") or ())
        return WorkerHealth(**d)


@dataclass(frozen=True, slots=True)
class GeneratorHealth:
    """All generator processes of one run; degraded if any one was."""

    workers: tuple[WorkerHealth, ...]

    @property
    def degraded(self) -> bool:
        return any(w.degraded for w in self.workers)

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(f"{w.worker}: {r}" for w in self.workers for r in w.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {
            "degraded": self.degraded,
            "reasons": list(self.reasons),
            "workers": [w.to_dict() for w in self.workers],
        }


def summarize(
    worker: str,
    lateness: Sequence[float],
    lag: Sequence[float],
    samples: Sequence[HealthSample],
    cap_hits: int,
) -> WorkerHealth:
    cpu = [s.cpu_percent for s in samples]
    degraded, reasons = assess(lateness, lag, cpu)
    if cap_hits:
        reasons.append(f"max in-flight cap hit {cap_hits} times (open-loop sends delayed)")
        degraded = True
    return WorkerHealth(
        worker=worker,
        pid=os.getpid(),
        lateness_p50_s=percentile(lateness, 50),
        lateness_p99_s=percentile(lateness, 99),
        lateness_max_s=max(lateness) if lateness else None,
        loop_lag_p50_s=percentile(lag, 50),
        loop_lag_p99_s=percentile(lag, 99),
        cpu_mean_percent=sum(cpu) / len(cpu) if cpu else None,
        cpu_p90_percent=percentile(cpu[1:] if len(cpu) > 1 else cpu, 90),
        in_flight_cap_hits=cap_hits,
        degraded=degraded,
        reasons=tuple(reasons),
        samples=tuple(samples),
    )


class HealthMonitor:
    """Samples loop lag, lateness and CPU of this process (runs as a greenlet)."""

    def __init__(
        self,
        worker: str,
        counters: Callable[[], tuple[int, int, int, int]],
        on_sample: Callable[[HealthSample], None] | None = None,
    ) -> None:
        """``counters()`` returns (in_flight, sent, completed, in_flight_cap_hits)."""
        self.worker = worker
        self._counters = counters
        self._on_sample = on_sample
        self.lateness: list[float] = []
        self.lag: list[float] = []
        self.samples: list[HealthSample] = []
        self._greenlet: Any = None
        self._lag_mark = 0
        self._late_mark = 0

    def note_lateness(self, seconds: float) -> None:
        self.lateness.append(seconds)

    def start(self) -> None:
        import gevent

        self._greenlet = gevent.spawn(self._run)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
            self._greenlet = None

    def _run(self) -> None:
        import gevent
        import psutil

        proc = psutil.Process()
        proc.cpu_percent(None)
        next_tick = perf_counter() + 1.0
        lag = self.lag
        while True:
            t0 = perf_counter()
            gevent.sleep(_TICK_S)
            t1 = perf_counter()
            lag.append(max(0.0, t1 - t0 - _TICK_S))
            if t1 >= next_tick:
                next_tick += 1.0
                self._sample(proc.cpu_percent(None))

    def _sample(self, cpu: float) -> None:
        lag = self.lag[self._lag_mark :]
        late = self.lateness[self._late_mark :]
        self._lag_mark = len(self.lag)
        self._late_mark = len(self.lateness)
        in_flight, sent, completed, cap = self._counters()
        s = HealthSample(
            t=time(),
            worker=self.worker,
            cpu_percent=cpu,
            loop_lag_p99_s=percentile(lag, 99) or 0.0,
            loop_lag_max_s=max(lag) if lag else 0.0,
            lateness_p99_s=percentile(late, 99),
            in_flight=in_flight,
            sent=sent,
            completed=completed,
            in_flight_cap_hits=cap,
        )
        self.samples.append(s)
        if self._on_sample is not None:
            self._on_sample(s)

    def summary(self, cap_hits: int) -> WorkerHealth:
        return summarize(self.worker, self.lateness, self.lag, self.samples, cap_hits)
