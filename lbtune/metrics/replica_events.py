"""When the balancer took a replica out, and which of its own errors that explains (pure).

While the load runs, :class:`lbtune.run.replica_watch.ReplicaWatch` samples the
balancer's own view of each replica a few times a second (``Balancer.replica_rows``:
down or not, and the errors it counted against the replica). From those samples:

* **outages**: a replica the balancer reported down, from when (seconds since the run's
  start, and after how many requests) until it was reported up again;
* **attribution**: a request the balancer answered itself with a 5xx and no replica
  header (HAProxy's ``503`` for ``<NOSRV>``, its ``503`` after failed connection
  retries) is put on the replica that was down or failing then, when exactly one replica
  that serves the request's model was. Otherwise it stays unattributed, with the reason.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lbtune.metrics.summary import ReplicaEvents, ReplicaOutage
from lbtune.records.requests import RequestRecord

__all__ = ["ReplicaSample", "ReplicaTimeline", "balancer_made", "events", "owners"]


@dataclass(frozen=True)
class ReplicaSample:
    """One replica as the balancer saw it at ``at`` (Unix seconds)."""

    at: float
    replica: str
    status: str
    down: bool | None
    """The balancer sends it no request because its checks failed; ``None``: cannot say."""
    failures: int | None = None
    """Connection and response errors the balancer has counted against it (cumulative)."""


@dataclass(frozen=True)
class ReplicaTimeline:
    """Everything the watch saw: the samples, in time order, and who gave them."""

    source: str
    """The balancer's registry name; empty when nothing could be asked."""
    samples: tuple[ReplicaSample, ...] = ()
    models: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Replica -> the models it serves (empty: unknown, every replica is a candidate)."""
    reason: str = ""
    """Why nothing is known (set when ``samples`` cannot say when a replica is down)."""

    @property
    def known(self) -> bool:
        return not self.reason and any(s.down is not None for s in self.samples)

    def by_replica(self) -> dict[str, list[ReplicaSample]]:
        out: dict[str, list[ReplicaSample]] = {}
        for s in sorted(self.samples, key=lambda s: s.at):
            out.setdefault(s.replica, []).append(s)
        return out


def balancer_made(r: RequestRecord) -> bool:
    """An error the balancer answered itself: a 5xx without the replica header."""
    return (
        r.replica is None
        and r.outcome == "http_error"
        and r.status_code is not None
        and 500 <= r.status_code < 600
    )


def _trouble(samples: Sequence[ReplicaSample]) -> list[tuple[float, float]]:
    """Intervals (Unix seconds) in which the balancer had this replica down or counted
    errors against it; each sample's evidence covers the time since the sample before it
    (a down sample also until the next one: it could not be back before that)."""
    out: list[tuple[float, float]] = []
    for i, s in enumerate(samples):
        prev = samples[i - 1] if i else None
        rose = (
            prev is not None
            and s.failures is not None
            and prev.failures is not None
            and s.failures > prev.failures
        )
        if not (s.down or rose):
            continue
        start = prev.at if prev is not None else s.at
        end = s.at
        if s.down:
            end = samples[i + 1].at if i + 1 < len(samples) else float("inf")
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def owners(
    records: Sequence[RequestRecord], timeline: ReplicaTimeline | None
) -> tuple[list[str | None], Counter[str]]:
    """The replica each record counts against (its header, else the one replica the
    timeline blames for a balancer-made error, else ``None``), and why the balancer-made
    errors left at ``None`` could not be attributed (reason -> count)."""
    out: list[str | None] = []
    why: Counter[str] = Counter()
    trouble = {}
    if timeline is not None and timeline.known:
        trouble = {name: _trouble(s) for name, s in timeline.by_replica().items()}
    for r in records:
        if r.replica is not None or not balancer_made(r):
            out.append(r.replica)
            continue
        if timeline is None or not timeline.known:
            out.append(None)
            why[(timeline.reason if timeline else "") or "replica states were not watched"] += 1
            continue
        serving = [
            name
            for name in trouble
            if not timeline.models or r.model in timeline.models.get(name, ())
        ]
        blamed = [
            name
            for name in serving
            if any(a <= r.ended_at and r.sent_at <= b for a, b in trouble[name])
        ]
        if len(blamed) == 1:
            out.append(blamed[0])
            continue
        out.append(None)
        if blamed:
            why[f"several replicas of {r.model} were down or failing ({', '.join(blamed)})"] += 1
        else:
            why["no replica was down or failing while it was answered"] += 1
    return out, why


def _outages(samples: Sequence[ReplicaSample], run_start: float) -> list[ReplicaOutage]:
    out: list[ReplicaOutage] = []
    down: ReplicaSample | None = None
    trouble_at: float | None = None
    for i, s in enumerate(samples):
        prev = samples[i - 1] if i else None
        rose = (
            prev is not None
            and s.failures is not None
            and prev.failures is not None
            and s.failures > prev.failures
        )
        if down is None and s.down:
            down, start = s, s.at
            out.append(
                ReplicaOutage(
                    replica=s.replica,
                    status=s.status,
                    down_s=start - run_start,
                    after_requests=0,
                    trouble_s=None if trouble_at is None else trouble_at - run_start,
                )
            )
        elif down is not None and s.down is False:
            last = out[-1]
            out[-1] = ReplicaOutage(
                last.replica, last.status, last.down_s, 0, s.at - run_start, last.trouble_s
            )
            down, trouble_at = None, None
        elif down is None:
            if rose and trouble_at is None and prev is not None:
                trouble_at = prev.at
            elif not rose and trouble_at is not None and s.at - trouble_at > 5.0:
                trouble_at = None  # a passing blip, not the start of an outage
    return out


def events(
    timeline: ReplicaTimeline | None,
    records: Sequence[RequestRecord],
    window_records: Sequence[RequestRecord],
    run_start: float,
) -> ReplicaEvents:
    """The run's replica events for the summary: the outages (their request counts over
    ``records``, the whole run) and the balancer-made errors of ``window_records`` (the
    per-replica table's) that could not be attributed (none counted when no response of
    the run carried a replica header: a header-less 5xx is then no sign of the balancer)."""
    _, why = owners(window_records, timeline)
    if not any(r.replica is not None for r in records):
        # No response named a replica: a 5xx may be the balancer's or a replica's own.
        why = Counter()
    unattributed = sum(why.values())
    reason = "; ".join(f"{n}: {w}" for w, n in why.most_common()) if why else ""
    if timeline is None or not timeline.known:
        return ReplicaEvents(
            known=False,
            source=timeline.source if timeline else "",
            reason=(timeline.reason if timeline else "") or "replica states were not watched",
            samples=0 if timeline is None else len(timeline.samples),
            unattributed=unattributed,
            unattributed_reason=reason,
        )
    sent = sorted(r.sent_at for r in records)
    outages = []
    for samples in timeline.by_replica().values():
        for o in _outages(samples, run_start):
            before = bisect.bisect_left(sent, run_start + o.down_s)
            outages.append(
                ReplicaOutage(o.replica, o.status, o.down_s, before, o.up_s, o.trouble_s)
            )
    return ReplicaEvents(
        known=True,
        source=timeline.source,
        samples=len(timeline.samples),
        outages=tuple(sorted(outages, key=lambda o: (o.down_s, o.replica))),
        unattributed=unattributed,
        unattributed_reason=reason,
    )
