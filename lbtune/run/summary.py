"""A stress run's figures: its records over the recorded plan's window, the server side
from Prometheus, the generator's health, and the notes that say what the figures mean."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from lbtune.loadgen.health import GeneratorHealth as LoadHealth
from lbtune.loadgen.runner import LoadResult
from lbtune.metrics.prom import PromClient
from lbtune.metrics.replica_events import ReplicaTimeline
from lbtune.metrics.serverside import collect
from lbtune.metrics.stats import summarize
from lbtune.metrics.summary import GeneratorHealth, RunSummary, Window
from lbtune.records.requests import ERROR_OUTCOMES, RequestRecord
from lbtune.run.samples import after_run_hint
from lbtune.run.target import ResolvedTarget
from lbtune.scenario.plan import Stage
from lbtune.scenario.runplan import RunPlan
from lbtune.scenario.sessionplan import SessionSource
from lbtune.scenario.workload import build_workload, has_sessions
from lbtune.targets import balancer

__all__ = [
    "OUTAGE_NOTE",
    "STORM_ERROR_SHARE",
    "RunFacts",
    "error_storm_note",
    "nothing_measured",
    "outage",
    "outage_note",
    "prometheus",
    "ran_stages",
    "session_calls",
    "summarize_run",
]

STORM_ERROR_SHARE = 0.5
"""Closed loop: above this share of failed requests the offered load is mostly retries."""


def prometheus(url: str | None) -> PromClient | None:
    """A checked Prometheus client, or None when there is no Prometheus to ask."""
    if url is None:
        return None
    client = PromClient(url, timeout_s=5.0)
    client.check()
    return client


@dataclass(frozen=True)
class RunFacts:
    """A finished run as its summary reads it."""

    plan: RunPlan
    """The plan as it ran (:meth:`RunPlan.as_run`): its start and the window it measured,
    recorded once (``run.json``); the figures are over that window."""
    load: LoadResult
    records: Sequence[RequestRecord]
    """The run's request records (``load.records_path``), read once for every reader."""
    reached_at: float | None = None
    """When ``--until-samples`` was reached (the run stopped there)."""
    whole_run: bool = False
    """Stopped before its window opened: the window is the whole run
    (:meth:`RunPlan.measured_window`)."""
    replicas: ReplicaTimeline | None = None
    """The balancer's view of its replicas during the run
    (:class:`lbtune.run.replica_watch.ReplicaWatch`)."""


def summarize_run(run: RunFacts, target: ResolvedTarget, prom: PromClient | None) -> RunSummary:
    """The run's figures over the window its plan recorded (the planned window cut at
    the run's end and at ``reached_at``: :meth:`RunPlan.measured_window`)."""
    plan, load = run.plan, run.load
    records = list(run.records)
    run_start = load.started_at
    window = Window(*plan.measured())
    notes: list[str] = []
    if run.whole_run:
        notes.append(
            "stopped before the measurement window: figures cover the whole run, warm-up included"
        )
    notes += _notes(plan, load, records, window, run.reached_at)
    server = None
    if prom is not None:
        # Let the last scrape of the window land before asking for it.
        time.sleep(min(2.0, max(0.0, window.end + 1.5 - time.time())))
        ep = target.endpoints  # its balancer names its own series; unknown without it
        server = collect(prom, window, balancer=balancer(ep.balancer).series(ep) if ep else None)
    elif target.endpoints is None:
        notes.append("no Prometheus given (--prometheus): server-side figures not collected")
    return summarize(
        records,
        run_start=run_start,
        window=window,
        scenario=plan.scenario_name,
        target=target.url,
        slo=plan.slo_value(),
        stages=ran_stages(plan, load.ended_at - run_start),
        server=server,
        generator=_generator(load.health),
        incomplete=load.stopped_early,
        notes=notes,
        replicas=run.replicas,
        session_calls=session_calls(plan, records),
    )


def session_calls(plan: RunPlan, records: Sequence[RequestRecord]) -> Mapping[int, int] | None:
    """Session traffic (:func:`~lbtune.scenario.workload.has_sessions`: an ``agent`` block or
    an agentic trace): the number of calls the plan of each session seen in ``records``
    holds; ``None`` for any other workload (which is not built)."""
    if not has_sessions(plan.scenario):
        return None
    workload = build_workload(plan.scenario, plan.seed, plan.tokenizer)
    assert isinstance(workload, SessionSource), "has_sessions: the workload is a SessionSource"
    seen = {r.session_id for r in records if r.session_id is not None}
    return {s: len(workload.session(s).calls) for s in sorted(seen)}


def _notes(
    plan: RunPlan,
    load: LoadResult,
    records: list[RequestRecord],
    window: Window,
    reached_at: float | None,
) -> list[str]:
    """What the reader of the figures must know: an early stop, ``--until-samples``, an
    error storm, too few samples for the P99."""
    notes: list[str] = []
    down = outage(records, load.started_at)
    if down is not None:
        notes.append(down)
    if load.stopped_early:
        notes.append("the run was stopped early: figures cover only what was measured")
    if plan.load.until_samples is not None:
        notes.append(_until_note(plan, reached_at, load.started_at))
    ok = sum(1 for r in records if r.outcome == "ok" and window.contains(r.sent_at))
    storm = error_storm_note(plan, records, window)
    if storm is not None:
        notes.append(storm)
    hint = after_run_hint(plan, ok, window.duration)
    if hint is not None:
        notes.append(hint)
    return notes


def _generator(health: LoadHealth) -> GeneratorHealth:
    """The load generator's health as the summary reports it (the worst process)."""
    return GeneratorHealth(
        lateness_p99_s=_max(w.lateness_p99_s for w in health.workers),
        loop_lag_p99_s=_max(w.loop_lag_p99_s for w in health.workers),
        cpu_max_percent=_max(w.cpu_p90_percent for w in health.workers),
        processes=len(health.workers) or 1,
        degraded=health.degraded,
        reasons=health.reasons,
        timing=health.timing,
        ttft_bound_p50_s=health.ttft_bound_p50_s,
        ttft_bound_p99_s=health.ttft_bound_p99_s,
        idle_share=health.idle_share,
    )


def ran_stages(plan: RunPlan, ran_s: float) -> tuple[Stage, ...]:
    """The planned stages cut at what ran: a run stopped early (``--until-samples``,
    Ctrl-C) would otherwise divide the last stage's completions by seconds that never
    ran (a held stage planned to 600 s read as a throughput decay of 0.999)."""
    out = []
    for stage in plan.stages():
        if stage.start_s >= ran_s:
            break
        out.append(replace(stage, end_s=min(stage.end_s, ran_s)))
    return tuple(out)


def error_storm_note(plan: RunPlan, records: list[RequestRecord], window: Window) -> str | None:
    """Closed loop, most requests in the window failed: what users offered collapsed
    into retries of failing requests (paced by the users' back-off, see
    :mod:`lbtune.loadgen.user`), so the figures describe failures, not the cluster's
    capacity. None otherwise."""
    if plan.load.mode != "closed":
        return None
    judged = [r for r in records if r.outcome != "cancelled" and window.contains(r.sent_at)]
    failed = sum(1 for r in judged if r.outcome in ERROR_OUTCOMES)
    if len(judged) < 10 or failed < STORM_ERROR_SHARE * len(judged):
        return None
    return (
        f"{failed} of {len(judged)} requests in the window failed: the offered load "
        "collapsed into retries of failing requests (each user backed off after errors, "
        "50 ms doubling to 2 s); the figures describe failures, not capacity"
    )


def nothing_measured(
    plan: RunPlan, load: LoadResult, records: Sequence[RequestRecord]
) -> str | None:
    """Why a run that ran its course measured nothing (no request sent, or every one failed
    before any response), or None when it measured something."""
    records = [r for r in records if r.outcome != "cancelled"]
    failures = "; ".join(load.failures[:3])
    if not records:
        if failures:
            return f"the load generator sent no request ({failures})"
        if plan.load.mode == "open" and plan.load.arrivals == 0:
            return (
                f"the load plan holds no arrival in {plan.load.duration_s:g} s: raise --rate "
                "or --duration"
            )
        return "the load generator sent no request (see the *.log files of the run)"
    answered = [r for r in records if r.status_code is not None or r.headers_at is not None]
    if answered:
        return None
    top = Counter((r.outcome, r.error or "") for r in records).most_common(1)[0][0]
    detail = f"{top[0]}: {top[1]}" if top[1] else top[0]
    where = plan.target.url or "the target"
    return (
        f"all {len(records)} requests failed before any response from {where} "
        f"(most often {detail[:200]})" + (f"; {failures}" if failures else "")
    )


OUTAGE_NOTE = "outage:"
"""How the summary's note on an outage (:func:`outage`) begins."""


def outage_note(summary: RunSummary) -> str | None:
    """The summary's note on an outage during its run, if it has one."""
    return next((n for n in summary.notes if n.startswith(OUTAGE_NOTE)), None)


def outage(records: Sequence[RequestRecord], run_start: float) -> str | None:
    """The target refused connections during the run (nothing listened where it answered:
    a balancer that died or restarted), said with when and how often; None otherwise."""
    refused = [
        r.sent_at
        for r in records
        if r.outcome == "connect_error" and "refused" in (r.error or "").lower()
    ]
    if not refused:
        return None
    return (
        f"{OUTAGE_NOTE} the target refused {len(refused)} connections from "
        f"{min(refused) - run_start:.1f} s to {max(refused) - run_start:.1f} s into the run "
        "(nothing listened there): the figures describe an outage, not the balancer's config"
    )


def _until_note(plan: RunPlan, reached_at: float | None, run_start: float) -> str:
    need = plan.load.until_samples
    if reached_at is not None:
        return f"--until-samples {need}: reached after {reached_at - run_start:.0f} s"
    return (
        f"--until-samples {need}: not reached within the {plan.load.duration_s:g} s bound "
        "(--max-duration); the P99 may rest on too few requests"
    )


def _max(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None
