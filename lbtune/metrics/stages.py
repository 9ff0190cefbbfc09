"""Figures over load stages: per-stage throughput and SLO, decay, knee, spike recovery.

A stage is any object with ``start_s``, ``end_s`` (seconds from the run start),
``users``, ``rate`` and ``label`` (:class:`Stage`). Its offered load is ``rate``
(open loop, requests/s) or else ``users`` (closed loop).

* Stage throughput: successful requests that *ended* in the stage, per second.
* Stage P99 TTFT / E2E: over successful requests *sent* in the stage (TTFT over the
  streamed ones, as in the summary's latency table); below 100 samples the SLO is
  judged on the maximum (a stricter bound) and a note says so. A stage without a
  streamed request has no TTFT to judge.
* Stage meets the SLO: P99 TTFT ≤ SLO TTFT, P99 E2E ≤ SLO E2E and error rate
  (over requests sent in the stage) ≤ the SLO's error limit (1 % by default).
* Throughput decay: ``max(0, 1 - tput(peak offered load) / best tput)``.
* Knee: the stage with the highest offered load that meets the SLO.
* Recovery after a ``spike`` stage: windows of ``window_s`` slide from the spike's
  end in steps of ``step_s``; the recovery time is the start of the first window
  (relative to the spike's end) whose P99 TTFT is within the SLO. Failed requests
  count as never getting a first token. ``None`` if no window recovers.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol

from lbtune.metrics.summary import StageStats
from lbtune.records.quantiles import p99_or_max
from lbtune.records.requests import RequestRecord
from lbtune.records.slo import Slo

SPIKE_LABEL = "spike"
_NEVER = 1e9
"""TTFT given to failed requests in recovery windows: larger than any SLO."""


class Stage(Protocol):
    @property
    def start_s(self) -> float: ...
    @property
    def end_s(self) -> float: ...
    @property
    def users(self) -> int | None: ...
    @property
    def rate(self) -> float | None: ...
    @property
    def label(self) -> str: ...


def offered_load(stage: Stage) -> float | None:
    if stage.rate is not None:
        return float(stage.rate)
    if stage.users is not None:
        return float(stage.users)
    return None


def stage_stats(
    records: Sequence[RequestRecord],
    stages: Sequence[Stage],
    *,
    run_start: float,
    slo: Slo | None,
    settle_s: float = 0.0,
    recovery_window_s: float = 2.0,
    recovery_step_s: float = 0.25,
) -> tuple[StageStats, ...]:
    """One :class:`StageStats` per stage; ``settle_s`` skips each stage's first seconds."""
    out: list[StageStats] = []
    for index, stage in enumerate(stages):
        start = run_start + stage.start_s + settle_s
        end = run_start + stage.end_s
        span = max(end - start, 0.0)
        sent = [r for r in records if start <= r.sent_at < end]
        ok = [r for r in sent if r.outcome == "ok"]
        completed = sum(1 for r in records if r.outcome == "ok" and start <= r.ended_at < end)
        ttfts = [t for r in ok if (t := r.ttft) is not None]
        e2es = [r.e2e for r in ok]
        ttft_p99, ttft_exact = p99_or_max(ttfts)
        e2e_p99, e2e_exact = p99_or_max(e2es)
        error_rate = (len(sent) - len(ok)) / len(sent) if sent else None
        notes: list[str] = []
        if (ttfts and not ttft_exact) or (e2es and not e2e_exact):
            notes.append(f"fewer than 100 samples: SLO judged on the maximum ({len(ok)} ok)")
        if ok and not ttfts and slo is not None and slo.ttft_s is not None:
            notes.append("no streamed request: TTFT not judged")
        meets = _meets(slo, ttft_p99, e2e_p99, error_rate, ttft_judged=bool(ttfts) or not ok)
        recovery = None
        if stage.label == SPIKE_LABEL and slo is not None and slo.ttft_s is not None:
            recovery = recovery_time(
                records,
                spike_end=end,
                slo_ttft_s=slo.ttft_s,
                window_s=recovery_window_s,
                step_s=recovery_step_s,
            )
        out.append(
            StageStats(
                index=index,
                label=stage.label,
                start_s=stage.start_s,
                end_s=stage.end_s,
                users=stage.users,
                rate=stage.rate,
                offered_load=offered_load(stage),
                sent=len(sent),
                completed=completed,
                throughput_rps=completed / span if span > 0 else 0.0,
                ttft_p99=ttft_p99 if ttft_exact else None,
                e2e_p99=e2e_p99 if e2e_exact else None,
                error_rate=error_rate,
                meets_slo=meets,
                recovery_s=recovery,
                notes=tuple(notes),
            )
        )
    return tuple(out)


def _meets(
    slo: Slo | None,
    ttft: float | None,
    e2e: float | None,
    error_rate: float | None,
    *,
    ttft_judged: bool = True,
) -> bool | None:
    if slo is None or error_rate is None:
        return None
    if error_rate > slo.max_error_rate:
        return False
    if slo.ttft_s is not None and ttft_judged and (ttft is None or ttft > slo.ttft_s):
        return False
    return not (slo.e2e_s is not None and (e2e is None or e2e > slo.e2e_s))


def throughput_decay(stages: Sequence[StageStats]) -> float | None:
    """``max(0, 1 - tput_at_peak_load / best_tput)``; the last stage wins a tie at peak."""
    loaded = [s for s in stages if s.offered_load is not None]
    if not loaded:
        return None
    peak_load = max(s.offered_load for s in loaded if s.offered_load is not None)
    peak = [s for s in loaded if s.offered_load == peak_load][-1]
    best = max(s.throughput_rps for s in loaded)
    if best <= 0:
        return None
    return max(0.0, 1.0 - peak.throughput_rps / best)


def knee(stages: Sequence[StageStats]) -> StageStats | None:
    """The stage with the highest offered load that meets the SLO (later wins a tie)."""
    passing = [s for s in stages if s.meets_slo and s.offered_load is not None]
    if not passing:
        return None
    return max(reversed(passing), key=lambda s: s.offered_load or 0.0)


def recovery_time(
    records: Sequence[RequestRecord],
    *,
    spike_end: float,
    slo_ttft_s: float,
    window_s: float = 2.0,
    step_s: float = 0.25,
) -> float | None:
    """Seconds from ``spike_end`` (absolute) until a window's P99 TTFT is within the SLO."""
    if window_s <= 0 or step_s <= 0:
        raise ValueError("recovery window and step must be positive")
    points = sorted((r.sent_at, _ttft_or_never(r)) for r in records if r.sent_at >= spike_end)
    if not points:
        return None
    times = [t for t, _ in points]
    horizon = times[-1]
    k = 0
    while k == 0 or spike_end + k * step_s + window_s <= horizon + 1e-9:
        t = spike_end + k * step_s
        lo = bisect.bisect_left(times, t)
        hi = bisect.bisect_left(times, t + window_s)
        if hi > lo:
            value, _exact = p99_or_max([v for _, v in points[lo:hi]])
            if value is not None and value <= slo_ttft_s:
                return t - spike_end
        k += 1
    return None


def slo_ttft(r: RequestRecord) -> float:
    """TTFT for SLO judgements: a response without chunks got its first token at its end."""
    ttft = r.ttft
    return r.e2e if ttft is None else ttft


def _ttft_or_never(r: RequestRecord) -> float:
    return slo_ttft(r) if r.outcome == "ok" else _NEVER
