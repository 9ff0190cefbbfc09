"""A trial's tail figures, intermediate and final, from its per-request records.

The real measurement (one ``run_stress`` per trial, :class:`lbtune.tune.harness.
StressMeasure`) tails the records while the load runs and, every ``window_s`` seconds of
the measured part (after warm-up), hands :func:`partial_figures` to the study's window
hook (intermediate values for the pruner).

Intermediate and final figures come from the same samples and the same estimator:
:func:`lbtune.metrics.censor.censored_samples` over the requests that occupy the
measurement window (sent in it, or sent in the warm-up and still running when it opened)
— a request still running at a checkpoint (or cut off at the test's end) counts at the
time it has been running, so a configuration cannot look good by leaving its slowest
requests unfinished, nor by parking users on them from the warm-up — and the P99 of those samples
(:func:`lbtune.records.quantiles.percentile`) with its bootstrap interval
(:func:`lbtune.metrics.bootstrap.percentile_interval`).
"""

from __future__ import annotations

import math
from dataclasses import replace

from lbtune.metrics.bootstrap import percentile_interval
from lbtune.metrics.censor import CensoredSamples, censored_samples
from lbtune.objective import Figures, ObjectiveSpec, stretch_at, stretches
from lbtune.records.requests import RequestRecord

__all__ = ["N_BOOT", "TAIL_Q", "partial_figures", "scored_figures", "tail_figures"]

TAIL_Q = 99.0
"""The objective's tail percentile."""
N_BOOT = 400
"""Bootstrap resamples per interval (a trial computes a few per window)."""


def tail_figures(cs: CensoredSamples) -> Figures | None:
    """P99 E2E and P99 TTFT of censored samples with their 95 % bootstrap intervals, each
    error counted as slow as the window's slowest request (:meth:`CensoredSamples.scored`).

    TTFT over the streamed requests; when nothing was streamed, E2E stands in (the
    whole response is the first token). ``None`` when there is no sample.
    """
    if not cs.e2e:
        return None
    ttfts, e2es = cs.scored()  # an error counts as slow as the window's slowest
    e2e, e_lo, e_hi = percentile_interval(e2es, TAIL_Q, n_boot=N_BOOT)
    streamed = tuple(t for t in ttfts if not math.isnan(t)) or e2es
    ttft, t_lo, t_hi = percentile_interval(streamed, TAIL_Q, n_boot=N_BOOT, seed=1)
    return Figures(
        p99_e2e_s=e2e,
        p99_ttft_s=ttft,
        p99_e2e_ci=(e_lo, e_hi),
        p99_ttft_ci=(t_lo, t_hi),
        samples=len(cs.e2e),
        censored=cs.censored,
    )


def scored_figures(
    figures: Figures, cs: CensoredSamples, spec: ObjectiveSpec | None = None
) -> Figures:
    """A run's summary ``figures`` as a trial scores them: the P99s (with their intervals)
    and the error rate of the window's censored samples ``cs`` (every request that
    occupied the window; the summary's are over finished requests sent in it), and under
    the capacity objective the SLO stretch of those samples. The one place this is
    decided, for a live trial and a twin run alike; unchanged when the window holds no
    sample."""
    tail = tail_figures(cs)
    if tail is None:
        return figures
    if spec is not None and spec.kind == "capacity" and spec.slo is not None:
        each = stretches(cs.ttft, cs.tpot, cs.e2e, cs.errors, spec.slo)
        figures = replace(figures, slo_stretch=stretch_at(each, spec.share))
    return replace(
        figures,
        p99_e2e_s=tail.p99_e2e_s,
        p99_ttft_s=tail.p99_ttft_s,
        p99_e2e_ci=tail.p99_e2e_ci,
        p99_ttft_ci=tail.p99_ttft_ci,
        samples=tail.samples,
        censored=tail.censored,
        error_rate=cs.error_rate,
    )


def partial_figures(
    records: list[RequestRecord],
    start: float,
    end: float,
    *,
    now: float,
    open_requests: tuple[tuple[float, float | None, bool], ...] = (),
) -> Figures | None:
    """Figures at ``now`` of the requests that occupy ``[start, end)``: the finished ones,
    and the ones still open at ``now`` at their elapsed time (censored, like the final
    figures)."""
    cs = censored_samples(records, start=start, end=end, now=now, open_requests=open_requests)
    tail = tail_figures(cs)
    if tail is None:
        return None
    return replace(tail, error_rate=cs.error_rate, completed=cs.finished)
