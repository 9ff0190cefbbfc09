"""Agent-session figures from the request records (pure).

An agent session (:mod:`lbtune.scenario.sessionplan`) is a graph of LLM calls; every
record of one carries its ``session_id``. Which sessions count, and what each figure is
(the fields: ``docs/summary-schema.md``, ``SessionStats``):

* A session counts when its first call (its earliest ``sent_at``) was sent in the
  measurement window ``[start, end)`` — the rule :func:`lbtune.metrics.stats.sent_in`
  applies to requests — and its id is in ``planned`` (session id -> calls its plan
  holds). Its later calls count wherever they fall: a session is followed to its end.
* *Completed*: every planned call ended ``ok``. *Failed*: some call ended in an error
  outcome. *Unfinished*: neither — a call was cut off by the run's end (``cancelled``)
  or never sent.
* Completion time: from the first call's send to the last call's end. *In the cluster*:
  the length of the union of the calls' ``[sent_at, ended_at]`` intervals (subagents'
  calls run in parallel and are counted once); *waiting*: completion minus in-cluster
  (tool delays, and the client's own turnaround). Over completed sessions only.
* Same-replica share: of the counted sessions' calls after their first, those answered
  by the replica that answered the first call (calls without a replica header left
  out). It is a client-side *proxy* for prefix-aware routing — a session's later calls
  share its prefix, so a balancer that keeps them together lets the replica's prefix
  cache hit. The prefix cache's own hit rate is the server's (``server.
  prefix_cache_hit_rate`` and per replica, from Prometheus: :mod:`lbtune.metrics.
  serverside`).

Per-call latencies (TTFT, E2E) are the run's latency figures already; not repeated here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from lbtune.metrics.summary import SessionStats, Window
from lbtune.records.quantiles import latency_stats
from lbtune.records.requests import ERROR_OUTCOMES, RequestRecord

__all__ = ["busy_time", "completion_times", "session_stats"]


@dataclass(frozen=True)
class _Session:
    """One counted session's calls, earliest sent first."""

    calls: tuple[RequestRecord, ...]
    planned: int

    @property
    def failed(self) -> bool:
        return any(r.outcome in ERROR_OUTCOMES for r in self.calls)

    @property
    def completed(self) -> bool:
        ok = {r.index for r in self.calls if r.outcome == "ok"}
        return not self.failed and len(ok) >= self.planned

    @property
    def completion_s(self) -> float:
        return max(r.ended_at for r in self.calls) - self.calls[0].sent_at


def busy_time(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of ``[start, end]`` intervals (overlaps counted once)."""
    total = 0.0
    cur_start: float | None = None
    cur_end = 0.0
    for start, end in sorted(intervals):
        if cur_start is None or start > cur_end:
            if cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_start is not None:
        total += cur_end - cur_start
    return total


def _sessions(
    records: Iterable[RequestRecord], window: Window, planned: Mapping[int, int]
) -> list[_Session]:
    """The sessions whose first call was sent in the window, by session id."""
    by_id: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.session_id is not None and r.session_id in planned:
            by_id.setdefault(r.session_id, []).append(r)
    out = []
    for sid in sorted(by_id):
        calls = sorted(by_id[sid], key=lambda r: (r.sent_at, r.index))
        if window.contains(calls[0].sent_at):
            out.append(_Session(tuple(calls), planned[sid]))
    return out


def _same_replica_share(sessions: Sequence[_Session]) -> float | None:
    """Of the calls after each session's first (with a replica known for both), the share
    answered by the first call's replica; ``None`` when there is no such call."""
    same = judged = 0
    for s in sessions:
        first = s.calls[0].replica
        if first is None:
            continue
        for r in s.calls[1:]:
            if r.replica is not None:
                judged += 1
                same += r.replica == first
    return same / judged if judged else None


def completion_times(
    records: Iterable[RequestRecord], window: Window, planned: Mapping[int, int]
) -> list[float]:
    """The completion time of every completed session counted in the window (by session
    id): the samples of :attr:`SessionStats.completion`, e.g. to pool runs."""
    return [s.completion_s for s in _sessions(records, window, planned) if s.completed]


def session_stats(
    records: Iterable[RequestRecord], window: Window, planned: Mapping[int, int]
) -> SessionStats:
    """The agent-session figures of a run (see the module's docstring for each rule).

    ``planned`` maps each session id to the number of calls its plan holds; records of
    a session id not in it are not sessions of this kind and are left out.
    """
    sessions = _sessions(records, window, planned)
    done = [s for s in sessions if s.completed]
    failed = sum(1 for s in sessions if s.failed)
    completion = [s.completion_s for s in done]
    in_cluster = [busy_time((r.sent_at, r.ended_at) for r in s.calls) for s in done]
    total = sum(completion)
    return SessionStats(
        started=len(sessions),
        completed=len(done),
        failed=failed,
        unfinished=len(sessions) - len(done) - failed,
        completion=latency_stats(completion),
        in_cluster=latency_stats(in_cluster),
        waiting=latency_stats(max(0.0, c - b) for c, b in zip(completion, in_cluster, strict=True)),
        in_cluster_share=sum(in_cluster) / total if total > 0 else None,
        calls_mean=sum(len(s.calls) for s in done) / len(done) if done else None,
        same_replica_share=_same_replica_share(sessions),
    )
