"""A replica kept busy: closed-loop streams at it, and what a step, a request's TTFT and
its ``/metrics`` cost while its engine runs (lone and synchronized-batch probes miss the
time a busy host's front end waits for CPU; ``lbtune twin fit --steady``). Where the
replica exports vLLM's histograms, what they said meanwhile comes with it
(:class:`~lbtune.twin.fitted.EngineView`: the engine's own TTFT, queue time and token
interval beside the client's TTFT)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import gevent

from lbtune.cluster.probing import DEFAULT_PLAN, ProbePlan, Prober, histogram_totals
from lbtune.errors import ClusterError
from lbtune.process import probes
from lbtune.records.endpoints import ReplicaEndpoint
from lbtune.records.quantiles import percentile
from lbtune.twin.fitted import EngineView

__all__ = ["SCRAPE_EVERY_S", "Steady", "steady_state"]


@dataclass(frozen=True)
class Steady:
    """A replica kept at ``streams`` requests in flight (closed loop)."""

    streams: int
    step_s: float
    """Mean time per output token after the first (the steps it ran, prefills of the
    requests arriving beside it included)."""
    ttft_s: float
    """Median TTFT of a request arriving while the others run."""
    prompt_tokens: int
    """The replica's count of each prompt (the median)."""
    output_tokens: int
    """Each request's output."""
    scrape_s: float | None
    """Median time its ``/metrics`` took to answer meanwhile (None: it answered none with
    200): what a scheduler scraping it waits."""
    requests: int
    """Requests measured (sent after the warm-up)."""
    sent: int
    engine: EngineView | None = None
    """The replica's own histograms meanwhile (None: it exports none)."""


def steady_state(
    rep: ReplicaEndpoint,
    streams: int,
    prompt_tokens: int,
    plan: ProbePlan = DEFAULT_PLAN,
    *,
    duration_s: float = 12.0,
    warmup_s: float = 3.0,
    api_key: str | None = None,
) -> Steady:
    """``streams`` closed-loop streams at ``rep`` for ``duration_s`` (fresh text, outputs
    of ``2 × plan.decode_tokens``): what a step and a TTFT are while the replica stays
    busy, as under load. Requests sent in the first ``warmup_s`` are not measured."""
    if not rep.models:
        raise ClusterError(f"replica {rep.name} serves no model: nothing to measure")
    p = Prober(rep, rep.models[0], plan, api_key)
    start = time.time()
    until = time.monotonic() + duration_s
    jobs = [
        gevent.spawn(p.loop, prompt_tokens, 2 * plan.decode_tokens, until, OUTPUT_SPREAD)
        for _ in range(streams)
    ]
    seen = _Scrapes()
    scrapes = gevent.spawn(_scrape_times, rep, start + warmup_s, until, seen)
    try:
        gevent.joinall(jobs, raise_error=True, timeout=duration_s + plan.timeout_s + 5)
    finally:
        gevent.killall([j for j in [*jobs, scrapes] if not j.ready()], block=True, timeout=5)
    took = seen.took
    done = [j.value for j in jobs if j.successful() and isinstance(j.value, list)]  # not killed
    probes_ = [x for got in done for t, x in got if t >= start + warmup_s]
    steps = [x.step_s for x in probes_ if x.step_s is not None]
    if not steps:
        raise ClusterError(
            f"calibrating replica {rep.name} ({rep.url}): no request finished in "
            f"{duration_s:g} s at {streams} streams"
        )
    return Steady(
        streams=streams,
        step_s=statistics.fmean(steps),
        ttft_s=percentile([x.ttft_s for x in probes_], 50),
        prompt_tokens=int(percentile([x.prompt_tokens for x in probes_], 50)),
        output_tokens=2 * plan.decode_tokens,
        scrape_s=percentile(took, 50) if took else None,
        requests=len(probes_),
        sent=p.sent,
        engine=seen.engine(statistics.fmean(x.ttft_s for x in probes_)),
    )


SCRAPE_EVERY_S = 0.25
OUTPUT_SPREAD = 0.5
"""Each stream's outputs are drawn within ±50 % of ``2 × plan.decode_tokens``
(:meth:`Prober.loop`). With equal outputs the streams stayed in lockstep: on the vLLM CPU
preset all 8 prompts of 381 tokens arrived together every 48 steps and were prefilled in
one 3 048-token step (~0.8 s there), so a kept-busy TTFT of 750 ms was mostly the others'
prefill, which the fit then charged to every request as busy overhead (the twin put P50
TTFT at 0.83 s on chat at 16 users, live 0.19 s)."""


@dataclass
class _Scrapes:
    """What the scrapes of a replica kept busy saw: how long each took, and vLLM's
    histograms at the first and the last."""

    took: list[float] = field(default_factory=list)
    first: dict[str, tuple[float, float]] | None = None
    last: dict[str, tuple[float, float]] | None = None

    def engine(self, client_ttft_s: float) -> EngineView | None:
        """The histograms' means between the first scrape and the last (None: no TTFT
        histogram, or no request counted in it meanwhile)."""
        if not self.first or not self.last or "ttft" not in self.first:
            return None

        def mean(name: str) -> float | None:
            if self.first is None or self.last is None or name not in self.first:
                return None
            s0, c0 = self.first[name]
            s1, c1 = self.last.get(name, (s0, c0))
            return (s1 - s0) / (c1 - c0) if c1 > c0 else None

        count = self.last["ttft"][1] - self.first["ttft"][1]
        ttft = mean("ttft")
        if ttft is None or count < 1:
            return None
        return EngineView(
            requests=int(count),
            ttft_s=max(0.0, ttft),
            queue_s=mean("queue"),
            prefill_s=mean("prefill"),
            decode_s=mean("decode"),
            itl_s=mean("itl"),
            iteration_tokens=mean("iteration_tokens"),
            client_ttft_s=client_ttft_s,
        )


def _scrape_times(rep: ReplicaEndpoint, after: float, until: float, out: _Scrapes) -> None:
    """Into ``out``: how long ``rep``'s ``/metrics`` takes to answer 200, every
    :data:`SCRAPE_EVERY_S` from ``after`` (``time.time()``) until ``until`` (monotonic),
    and its histograms at the first and the latest answer; it may be killed at any point
    (what it saw so far stays)."""
    url = rep.url.rstrip("/") + "/metrics"
    gevent.sleep(max(0.0, after - time.time()))
    while time.monotonic() < until:
        t0 = time.monotonic()
        # urllib's sockets are the standard library's (this process is not monkey-patched):
        # in the hub's thread pool, a slow /metrics does not stall the streams' greenlets
        status, body = gevent.get_hub().threadpool.apply(probes.http_get, (url, 5.0))
        if status == 200:
            out.took.append(time.monotonic() - t0)
            text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
            totals = histogram_totals(text)
            out.first = totals if out.first is None else out.first
            out.last = totals
        gevent.sleep(SCRAPE_EVERY_S)
