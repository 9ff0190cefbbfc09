"""One load test end to end: scenario → load → metrics → report.

This is the library behind ``lbtune stress`` and the measurement step of every
optimisation trial::

    from lbtune.run.stress import StressOptions, run_stress
    result = run_stress(StressOptions(scenario="chat", duration_s=30))
    print(result.summary.latency.ttft.p99, result.report.directory)

The target is the embedded cluster unless ``target_url`` is given; the cluster
is brought up when it is not running (and the caller is told so through
``say``). A non-loopback target needs ``allow_remote``. The client side comes
from the per-request records (exact), the server side from Prometheus over the
measurement window; when Prometheus disappears the client-side report is still
written and marked incomplete. ``run_stress`` writes only the run directory; the
caller indexes the run in the history (:func:`record_stress`, through ``on_result``).

The pieces: target resolution (:mod:`lbtune.run.target`), the sample estimate
(:mod:`lbtune.run.samples`), ``--until-samples`` (:mod:`lbtune.run.until`) and the
summary (:mod:`lbtune.run.summary`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from lbtune.apply.claim import load_claim, refuse_if_busy
from lbtune.errors import ConfigError, NothingMeasured, Outage, TargetError
from lbtune.history import add_entry, db_path
from lbtune.history.index import stress_entry
from lbtune.loadgen.preflight import check_models
from lbtune.loadgen.recordio import read_records
from lbtune.loadgen.runner import LoadConfig, LoadResult, Progress, run_load
from lbtune.metrics.summary import RunSummary
from lbtune.process import affinity
from lbtune.records.requests import RequestRecord
from lbtune.report import ReportPaths, write_report
from lbtune.run.plan import plan_run
from lbtune.run.replica_watch import ReplicaWatch
from lbtune.run.samples import describe_estimate, estimate_window_requests
from lbtune.run.spread import peak_streams, spread, usable_cores
from lbtune.run.summary import (
    RunFacts,
    nothing_measured,
    outage_note,
    prometheus,
    summarize_run,
)
from lbtune.run.target import ResolvedTarget, check_remote_options, resolve_target, target_facts
from lbtune.run.until import StopEither, WindowCounter, chain
from lbtune.safety.files import inside, name_part
from lbtune.scenario.limits import MAX_ARRIVALS, MAX_DURATION_S, MAX_RATE, MAX_SLO_S, MAX_USERS
from lbtune.scenario.runplan import MAX_UNTIL_SAMPLES, RunPlan, write_run_plan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StressOptions:
    scenario: str = "chat"
    """Built-in scenario name or a YAML path."""
    target_url: str | None = None
    """OpenAI-compatible base URL of the balancer; None = the embedded cluster."""
    prometheus_url: str | None = None
    """None = the embedded cluster's Prometheus (or none for an external target)."""
    duration_s: float | None = None
    users: int | None = None
    rate: float | None = None
    seed: int | None = None
    slo: str | None = None
    """Overrides, e.g. ``"ttft=350ms,e2e=800ms,errors=1%"``."""
    out_dir: Path | None = None
    """Report directory; default ``reports/<timestamp>-<scenario>/``."""
    reports_root: Path = Path("reports")
    allow_remote: bool = False
    workers: int | None = None
    """Locust distributed mode on this machine: a master and N local worker processes
    (0: one local process; None: chosen from the streams, :mod:`lbtune.run.spread`)."""
    role: str = "auto"
    """auto, master (waits for ``expect_workers`` workers from other machines) or worker."""
    master_host: str = "127.0.0.1"
    master_bind: str = "127.0.0.1"
    master_port: int = 0
    expect_workers: int | None = None
    ui: bool = False
    strict: bool = False
    tokenizer: str | None = None
    state_dir: Path | None = None
    cluster_config: str | None = None
    """Cluster preset/file used when the embedded cluster must be brought up."""
    write_report: bool = True
    request_timeout_s: float = 120.0
    until_samples: int | None = None
    """Run on (the last stage held) until the window holds this many completed requests."""
    max_duration_s: float | None = None
    """With ``until_samples``: the longest the run may last (default 600 s)."""
    plan: RunPlan | None = None
    """When given, exactly this plan is run (see :func:`lbtune.scenario.runplan.plan_run`); the
    scenario file is not read again and the scenario/duration/load/seed options are unused."""


@dataclass(frozen=True)
class StressResult:
    summary: RunSummary
    report: ReportPaths | None
    records_path: Path
    load: LoadResult
    target: ResolvedTarget
    plan: RunPlan
    """The plan as run (``run.json``): with the run's start and absolute window."""

    @property
    def degraded(self) -> bool:
        return self.summary.generator.degraded


class GeneratorDegraded(TargetError):
    """``--strict``: the generator fell behind, so the measurement is not trusted."""

    exit_code = 1


MAX_LOCAL_WORKERS = 256
"""Most generator processes ``--workers`` may start on this machine."""


def check_bounds(opts: StressOptions) -> None:
    """The command-line load values lbtune can run (the bounds of the scenario model:
    :mod:`lbtune.scenario.models`); one line each, before anything starts."""
    for flag, v in (("--duration", opts.duration_s), ("--max-duration", opts.max_duration_s)):
        if v is not None and not (math.isfinite(v) and 0 < v <= MAX_DURATION_S):
            raise ConfigError(f"{flag}: must be > 0 and at most {MAX_DURATION_S:g} s, got {v:g}")
    if opts.users is not None and not 1 <= opts.users <= MAX_USERS:
        raise ConfigError(f"--users: must be 1..{MAX_USERS}, got {opts.users}")
    if opts.rate is not None and not (math.isfinite(opts.rate) and 0 < opts.rate <= MAX_RATE):
        raise ConfigError(f"--rate: must be > 0 and at most {MAX_RATE:g} req/s, got {opts.rate:g}")
    span = opts.max_duration_s if opts.until_samples is not None else opts.duration_s
    if opts.rate is not None and span is not None and opts.rate * span > MAX_ARRIVALS:
        raise ConfigError(
            f"--rate {opts.rate:g} for {span:g} s: about {opts.rate * span:.3g} requests, more "
            f"than the {MAX_ARRIVALS} an open-loop plan may hold"
        )
    if opts.seed is not None and not 0 <= opts.seed < 2**63:
        raise ConfigError(f"--seed: must be 0..{2**63 - 1}, got {opts.seed}")
    if opts.until_samples is not None and not 1 <= opts.until_samples <= MAX_UNTIL_SAMPLES:
        raise ConfigError(
            f"--until-samples: must be 1..{MAX_UNTIL_SAMPLES}, got {opts.until_samples}"
        )
    if not 0 < opts.request_timeout_s <= MAX_SLO_S:
        raise ConfigError(f"request timeout: must be > 0 and at most {MAX_SLO_S:g} s")
    if opts.workers is not None and not 0 <= opts.workers <= MAX_LOCAL_WORKERS:
        raise ConfigError(
            f"--workers: must be 0..{MAX_LOCAL_WORKERS} (0: one local process), got {opts.workers}"
        )
    if opts.expect_workers is not None and not 1 <= opts.expect_workers <= 10_000:
        raise ConfigError(f"--expect-workers: must be 1..10000, got {opts.expect_workers}")
    if not 0 <= opts.master_port <= 65535:
        raise ConfigError(f"--master-port: must be 1..65535, got {opts.master_port}")


def default_out_dir(root: Path, scenario: str, now: float | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return inside(root, f"{stamp}-{name_part(scenario, 'scenario')}", "scenario name")


def run_stress(
    opts: StressOptions,
    *,
    on_progress: Callable[[Progress], None] | None = None,
    stop: threading.Event | None = None,
    say: Callable[[str], None] = log.info,
    on_result: Callable[[StressOptions, StressResult], None] | None = None,
) -> StressResult:
    """Run one load test and write its report; see the module docstring.

    ``on_result`` gets the result as soon as the run directory is complete, also when the
    run then fails for measuring nothing or (``strict``) for a generator that fell behind:
    the CLI indexes the run there (:func:`record_stress`).

    The run's plan (``opts.plan``, else :func:`~lbtune.scenario.runplan.plan_run` of ``opts``) is
    written to ``run.json`` in the run directory before the load starts; the generator
    processes read it from there, and it is rewritten with the run's start and absolute
    measurement window when the run ends (``StressResult.plan``), before the summary,
    which reads the window from it.
    """
    check_bounds(opts)
    check_remote_options(opts)
    plan = plan_run(opts)
    target = resolve_target(opts, say)
    refuse_if_busy(target.endpoints, "stress")  # a study holds it, or another load test
    check_models(plan.scenario.model_names(), target.models, f"target {target.url}")
    prom = prometheus(target.prometheus_url)
    plan = plan.with_target(*target_facts(target))
    out_dir = opts.out_dir or default_out_dir(opts.reports_root, plan.scenario_name)
    out_dir.mkdir(parents=True, exist_ok=True)
    workers = _workers(opts, plan, target, say)
    cfg = _load_config(opts, plan, target, write_run_plan(out_dir, plan), workers)
    say(describe_estimate(plan, estimate_window_requests(plan, opts.reports_root)))
    until = plan.load.until_samples
    bound = (
        f"up to {plan.load.duration_s:g} s, until {until} requests"
        if until
        else (f"for {plan.load.duration_s:g} s")
    )
    say(f"load: {plan.scenario_name} against {target.url} {bound} ({plan.load.mode} loop)")
    inner = StopEither(stop)
    counter = None if until is None else WindowCounter(plan, until, inner)
    reserved = target.endpoints.reserved_cpus if target.endpoints else ()
    with (
        load_claim(target.endpoints),
        ReplicaWatch(target.endpoints) as watch,
        affinity.kept_off(reserved),  # this process's record tail too, not only the workers
    ):
        load = run_load(cfg, on_progress=chain(counter, on_progress), stop=inner)
    reached_at = None if counter is None else counter.reached_at
    if reached_at is not None and not (stop is not None and stop.is_set()):
        load = replace(load, stopped_early=False)
    # The window it measured, computed once and recorded: the summary, the study and
    # every later reader (reports, compare, the history) read it from the plan as run.
    measured = plan.measured_window(load.started_at, load.ended_at, reached_at)
    plan = plan.as_run(load.started_at, measured[:2])
    write_run_plan(out_dir, plan)
    records = read_records(load.records_path)
    facts = RunFacts(plan, load, records, reached_at, measured.whole_run, watch.timeline())
    summary = summarize_run(facts, target, prom)
    report = None
    if opts.write_report:
        report = write_report(out_dir, summary, records)
    result = StressResult(summary, report, load.records_path, load, target, plan)
    if on_result is not None:
        on_result(opts, result)
    _check_measured(opts, result, records, out_dir)
    return result


def _workers(
    opts: StressOptions, plan: RunPlan, target: ResolvedTarget, say: Callable[[str], None]
) -> int:
    """``--workers`` as given, else as many as the run's streams need on the CPUs the
    generator may use (said when > 0); where it is pinned, that is said too."""
    if target.generator_cpus is not None:
        reserved = target.endpoints.reserved_cpus if target.endpoints is not None else []
        say(f"generator: on CPUs {sorted(target.generator_cpus)}, off the servers' {reserved}")
    if opts.workers is not None or opts.role != "auto":
        return opts.workers or 0
    choice = spread(peak_streams(plan), usable_cores(target.generator_cpus))
    if choice.note is not None:
        say(choice.note)
    return choice.workers


def _load_config(
    opts: StressOptions, plan: RunPlan, target: ResolvedTarget, plan_path: Path, workers: int
) -> LoadConfig:
    """What the load generator runs: the recorded plan (``plan_path``) against ``target``."""
    return LoadConfig(
        target_url=target.url,
        scenario=plan.scenario_ref,
        records_dir=plan_path.parent,
        seed=plan.seed,
        duration_s=plan.load.duration_s,
        users=plan.load.users,
        rate=plan.load.rate,
        exporter_port=target.exporter_port,
        workers=workers,
        role=opts.role,
        master_host=opts.master_host,
        master_bind_host=opts.master_bind,
        master_port=opts.master_port,
        expect_workers=opts.expect_workers,
        tokenizer_path=plan.tokenizer,
        ui=opts.ui,
        request_timeout_s=opts.request_timeout_s,
        allow_remote=opts.allow_remote,
        run_plan=str(plan_path.resolve()),
        cpus=target.generator_cpus,
    )


def _check_measured(
    opts: StressOptions, result: StressResult, records: Sequence[RequestRecord], out_dir: Path
) -> None:
    """A run that measured nothing, or (``--strict``) whose generator fell behind, is an
    error naming its run directory (which keeps what it wrote)."""
    load, summary = result.load, result.summary
    why = None if load.stopped_early else nothing_measured(result.plan, load, records)
    if why is not None:
        raise NothingMeasured(f"{why}; nothing was measured. Run directory: {out_dir}")
    down = outage_note(summary)
    if down is not None:
        raise Outage(f"{down}. Report: {out_dir}")
    if opts.strict and result.degraded:
        raise GeneratorDegraded(
            "the load generator fell behind ("
            + "; ".join(summary.generator.reasons)
            + f"); figures are not trusted (--strict). Report: {out_dir}"
        )


def record_stress(opts: StressOptions, result: StressResult) -> None:
    """Index a run whose report was written in the history (a failure is a warning): the
    callers of :func:`run_stress` that keep a history (the CLI) pass it as ``on_result``."""
    if result.report is None:
        return
    run_dir = result.report.directory
    ran_s = result.load.ended_at - result.load.started_at
    add_entry(
        db_path(reports_root=opts.reports_root),
        lambda: stress_entry(result.summary, result.plan, run_dir, ran_s),
        "this run",
    )
