"""The generator's health sampler: loop lag, lateness and CPU of one generator process,
and the per-request facts the judgement needs, as the load runs (a gevent greenlet; the
judgement itself, pure, is :mod:`lbtune.loadgen.health`)."""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter, time
from typing import Any

from lbtune.loadgen.health import HealthSample, WorkerHealth, percentile, summarize

__all__ = ["HealthMonitor"]

_TICK_S = 0.010
"""The lag probe: a greenlet sleeps this long and measures its overshoot."""


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
        self.ttfts: list[tuple[float, float | None]] = []
        self.read_bounds: list[float | None] = []
        self.idle: list[tuple[float, float]] = []
        self.timings: list[str] = []
        self.samples: list[HealthSample] = []
        self._greenlet: Any = None
        self._lag_mark = 0
        self._late_mark = 0

    def note_lateness(self, seconds: float) -> None:
        self.lateness.append(seconds)

    def note_ttft(
        self, ttft: float, bound: float | None, timing: str, read_bound: float | None = None
    ) -> None:
        """A streamed, successful request's TTFT, its bound (None: loop-timed client), its
        record's timing and the bound's first-token-stamp part (default: all of it)."""
        self.ttfts.append((ttft, bound))
        self.read_bounds.append(bound if read_bound is None else read_bound)
        self.timings.append(timing)

    def note_idle(self, idle_s: float, e2e_s: float) -> None:
        """A closed-loop user's gap before a request, and that request's E2E."""
        self.idle.append((max(0.0, idle_s), e2e_s))

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
        return summarize(
            self.worker,
            self.lateness,
            self.lag,
            self.samples,
            cap_hits,
            ttfts=self.ttfts,
            read_bounds=self.read_bounds,
            timings=self.timings,
            idle=self.idle,
        )
