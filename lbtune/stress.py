"""One load test end to end: scenario → load → metrics → report.

This is the library behind ``lbtune stress`` and the measurement step of every
optimisation trial::

    from lbtune.stress import StressOptions, run_stress
    result = run_stress(StressOptions(scenario="chat", duration_s=30))
    print(result.summary.latency.ttft.p99, result.report.directory)

The target is the embedded cluster unless ``target_url`` is given; the cluster
is brought up when it is not running (and the caller is told so through
``say``). A non-loopback target needs ``allow_remote``. The client side comes
from the per-request records (exact), the server side from Prometheus over the
measurement window; when Prometheus disappears the client-side report is still
written and marked incomplete.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from lbtune.errors import ConfigError, NothingMeasured, TargetError
from lbtune.runplan import RunPlan, plan_run, write_run_plan
from lbtune.runplan import parse_slo as parse_slo  # re-exported: callers import it from here

if TYPE_CHECKING:
    from lbtune.cluster.state import Endpoints
    from lbtune.loadgen.runner import LoadResult, Progress
    from lbtune.metrics.summary import RunSummary
    from lbtune.report import ReportPaths
    from lbtune.scenario.plan import Stage

log = logging.getLogger(__name__)

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
API_KEY_ENV = ("LBTUNE_API_KEY", "OPENAI_API_KEY")


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
    workers: int = 0
    """Locust distributed mode on this machine: a master and N local worker processes."""
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
    """When given, exactly this plan is run (see :func:`lbtune.runplan.plan_run`); the
    scenario file is not read again and the scenario/duration/load/seed options are unused."""


@dataclass(frozen=True)
class ResolvedTarget:
    url: str
    prometheus_url: str | None
    exporter_port: int | None
    endpoints: Endpoints | None
    cluster_started: bool
    models: set[str] | None = None
    """The models the target serves (its replicas', or its ``/v1/models``); None: unknown."""


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


def check_target_allowed(url: str, allow_remote: bool) -> None:
    """Refuse load against a non-loopback host unless explicitly allowed."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"--target: expected an http(s) URL like http://127.0.0.1:8000, got {url!r}"
        )
    try:
        parts.port  # noqa: B018 (urlsplit checks the port only when asked)
    except ValueError:
        raise ConfigError(
            f"--target {url}: the port must be a number in 1..65535, e.g. http://127.0.0.1:8000"
        ) from None
    if parts.hostname not in LOOPBACK_HOSTS and not allow_remote:
        raise ConfigError(
            f"--target {url}: {parts.hostname} is not a loopback address; sending load to "
            "another machine needs --allow-remote"
        )


def check_remote_options(opts: StressOptions) -> None:
    """Every option that opens lbtune to another machine needs ``allow_remote``: a master
    listening beyond loopback, a worker joining a remote master, a remote Prometheus."""
    if opts.allow_remote:
        return
    asks = []
    if opts.role == "master" and opts.master_bind not in LOOPBACK_HOSTS:
        asks.append(f"--master-bind {opts.master_bind} listens beyond loopback")
    if opts.role == "worker" and opts.master_host not in LOOPBACK_HOSTS:
        asks.append(f"--master-host {opts.master_host} is another machine")
    prom = urlsplit(opts.prometheus_url).hostname if opts.prometheus_url else None
    if opts.prometheus_url is not None and prom not in LOOPBACK_HOSTS:
        asks.append(f"--prometheus {opts.prometheus_url} is not on loopback")
    if asks:
        raise ConfigError("; ".join(asks) + ": that needs --allow-remote")


def check_bounds(opts: StressOptions) -> None:
    """The command-line load values lbtune can run (the bounds of the scenario model:
    :mod:`lbtune.scenario.models`); one line each, before anything starts."""
    import math

    from lbtune.scenario.models import MAX_ARRIVALS, MAX_DURATION_S, MAX_RATE, MAX_USERS

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
    if opts.workers < 0:
        raise ConfigError(f"--workers: must be >= 0 (0: one local process), got {opts.workers}")
    if opts.expect_workers is not None and opts.expect_workers < 1:
        raise ConfigError(f"--expect-workers: must be >= 1, got {opts.expect_workers}")
    if not 0 <= opts.master_port <= 65535:
        raise ConfigError(f"--master-port: must be 1..65535, got {opts.master_port}")


def check_reachable(url: str, timeout_s: float = 5.0) -> set[str] | None:
    """A real request to the target (``GET /v1/models``, never a bare TCP connect that a
    balancer counts as a failed request) within ``timeout_s``, or a TargetError saying so.
    Returns the models it lists (None: no model list)."""
    from lbtune.loadgen.preflight import served_models

    return served_models(url, timeout_s=timeout_s, tries=3)


def resolve_target(opts: StressOptions, say: Callable[[str], None]) -> ResolvedTarget:
    """The URL to load, its Prometheus, and the exporter port the cluster scrapes."""
    if opts.target_url is not None:
        check_target_allowed(opts.target_url, opts.allow_remote)
        served = check_reachable(opts.target_url)
        url = opts.target_url.rstrip("/")
        return ResolvedTarget(url, opts.prometheus_url, None, None, False, served)
    from lbtune.cluster import api

    st = api.status(opts.state_dir)
    started = False
    if st.running and st.endpoints is not None:
        endpoints = st.endpoints
    else:
        say("embedded cluster is not running: starting it (lbtune cluster up)")
        endpoints = api.up(opts.cluster_config, opts.state_dir, progress=say)
        started = True
    return ResolvedTarget(
        url=endpoints.balancer_url.rstrip("/"),
        prometheus_url=opts.prometheus_url or endpoints.prometheus_url,
        exporter_port=endpoints.exporter_port,
        endpoints=endpoints,
        cluster_started=started,
        models={m for r in endpoints.replicas for m in r.models},
    )


def default_out_dir(root: Path, scenario: str, now: float | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", scenario).strip("-") or "scenario"
    return root / f"{stamp}-{safe}"


def run_stress(
    opts: StressOptions,
    *,
    on_progress: Callable[[Progress], None] | None = None,
    stop: threading.Event | None = None,
    say: Callable[[str], None] = log.info,
) -> StressResult:
    """Run one load test and write its report; see the module docstring.

    The run's plan (``opts.plan``, else :func:`~lbtune.runplan.plan_run` of ``opts``) is
    written to ``run.json`` in the run directory before the load starts; the generator
    processes read it from there, and it is rewritten with the run's start and absolute
    measurement window when the run ends (``StressResult.plan``).
    """
    from lbtune.loadgen.preflight import check_models
    from lbtune.loadgen.runner import LoadConfig, run_load

    check_bounds(opts)
    check_remote_options(opts)
    plan = plan_run(opts)
    target = resolve_target(opts, say)
    check_models(plan.scenario.model_names(), target.models, f"target {target.url}")
    prom = _prometheus(target.prometheus_url)
    plan = plan.with_target(*_target_facts(target))

    out_dir = opts.out_dir or default_out_dir(opts.reports_root, plan.scenario_name)
    out_dir.mkdir(parents=True, exist_ok=True)
    plan_path = write_run_plan(out_dir, plan)
    cfg = LoadConfig(
        target_url=target.url,
        scenario=plan.scenario_ref,
        records_dir=out_dir,
        seed=plan.seed,
        duration_s=plan.load.duration_s,
        users=plan.load.users,
        rate=plan.load.rate,
        exporter_port=target.exporter_port,
        workers=opts.workers,
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
    )
    from lbtune.samples import describe_estimate, estimate_window_requests

    say(describe_estimate(plan, estimate_window_requests(plan, opts.reports_root)))
    until = plan.load.until_samples
    bound = (
        f"up to {plan.load.duration_s:g} s, until {until} requests"
        if until
        else (f"for {plan.load.duration_s:g} s")
    )
    say(f"load: {plan.scenario_name} against {target.url} {bound} ({plan.load.mode} loop)")
    inner = _StopEither(stop)
    counter = None if until is None else _WindowCounter(out_dir, plan, until, inner)
    load = run_load(cfg, on_progress=_chain(counter, on_progress), stop=inner)
    reached_at = None if counter is None else counter.reached_at
    if reached_at is not None and not (stop is not None and stop.is_set()):
        load = replace(load, stopped_early=False)
    summary = _summarize(plan, load, target, prom, reached_at)
    plan = plan.as_run(load.started_at, (summary.window.start, summary.window.end))
    write_run_plan(out_dir, plan)
    report = None
    if opts.write_report:
        from lbtune.loadgen.recordio import read_records
        from lbtune.report import write_report

        report = write_report(out_dir, summary, read_records(load.records_path))
    result = StressResult(summary, report, load.records_path, load, target, plan)
    if report is not None:
        from lbtune.history import index_stress

        index_stress(opts, result)
    why = None if load.stopped_early else nothing_measured(plan, load)
    if why is not None:
        raise NothingMeasured(f"{why}; nothing was measured. Run directory: {out_dir}")
    if opts.strict and result.degraded:
        raise GeneratorDegraded(
            "the load generator fell behind ("
            + "; ".join(summary.generator.reasons)
            + f"); figures are not trusted (--strict). Report: {out_dir}"
        )
    return result


def nothing_measured(plan: RunPlan, load: LoadResult) -> str | None:
    """Why a run that ran its course measured nothing (no request sent, or every one failed
    before any response), or None when it measured something."""
    from lbtune.loadgen.recordio import read_records

    records = [r for r in read_records(load.records_path) if r.outcome != "cancelled"]
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
    from collections import Counter

    top = Counter((r.outcome, r.error or "") for r in records).most_common(1)[0][0]
    detail = f"{top[0]}: {top[1]}" if top[1] else top[0]
    where = plan.target.url or "the target"
    return (
        f"all {len(records)} requests failed before any response from {where} "
        f"(most often {detail[:200]})" + (f"; {failures}" if failures else "")
    )


def _target_facts(target: ResolvedTarget) -> tuple[str | None, str, dict[str, Any] | None]:
    """(balancer name, URL, live config) of the target, as far as lbtune knows them."""
    if target.endpoints is None:
        return None, target.url, None
    from lbtune.history.index import live_config

    params, _ = live_config(target.endpoints)
    return getattr(target.endpoints, "balancer", None), target.url, params


class _StopEither(threading.Event):
    """Set by lbtune itself (enough samples) or by the caller's ``stop``."""

    def __init__(self, outer: threading.Event | None) -> None:
        super().__init__()
        self._outer = outer

    def is_set(self) -> bool:
        return super().is_set() or (self._outer is not None and self._outer.is_set())


class _WindowCounter:
    """``--until-samples``: stops the run once the shape has run and the measurement window
    holds ``need`` successful requests (their records, tailed about once a second)."""

    def __init__(self, out_dir: Path, plan: RunPlan, need: int, stop: threading.Event) -> None:
        from lbtune.loadgen.collect import RecordTail

        self._plan, self._need, self._stop = plan, need, stop
        self._ok_sent: list[float] = []
        self.reached_at: float | None = None
        self._tail = RecordTail(out_dir, on_record=self._keep)

    def _keep(self, r: Any) -> None:
        if r.outcome == "ok":
            self._ok_sent.append(r.sent_at)

    def __call__(self, p: Progress) -> None:
        if self.reached_at is not None:
            return
        now = time.time()
        # The run's start as the runner knows it now (it learns the generators' start
        # message a little after they send it): recomputed at every snapshot.
        opens = now - p.elapsed_s + self._plan.window_start_s
        self._tail.poll()
        shape_done = p.elapsed_s >= self._plan.load.shape_duration_s - self._plan.load.cooldown_s
        if shape_done and sum(1 for t in self._ok_sent if t >= opens) >= self._need:
            self.reached_at = now
            self._stop.set()


def _chain(
    first: Callable[[Progress], None] | None, then: Callable[[Progress], None] | None
) -> Callable[[Progress], None] | None:
    if first is None or then is None:
        return first or then

    def both(p: Progress) -> None:
        first(p)
        then(p)

    return both


def _prometheus(url: str | None) -> object | None:
    """A checked Prometheus client, or None when there is no Prometheus to ask."""
    if url is None:
        return None
    from lbtune.metrics.prom import PromClient

    client = PromClient(url, timeout_s=5.0)
    client.check()
    return client


def _summarize(
    plan: RunPlan,
    load: LoadResult,
    target: ResolvedTarget,
    prom: object | None,
    reached_at: float | None,
) -> RunSummary:
    """The run's figures over the recorded plan's window (cut at ``reached_at``, when the
    run stopped on ``--until-samples``, and at the run's end)."""
    from lbtune.loadgen.recordio import read_records
    from lbtune.metrics.prom import PromClient
    from lbtune.metrics.serverside import collect
    from lbtune.metrics.stats import summarize
    from lbtune.metrics.summary import GeneratorHealth, Window
    from lbtune.samples import after_run_hint

    records = read_records(load.records_path)
    run_start = load.started_at
    start, end = plan.window_at(run_start)
    end = min(end, load.ended_at, reached_at or end)
    window = Window(start, max(start, end))
    notes: list[str] = []
    if window.duration < 1.0:  # stopped before the measurement window opened
        window = Window(run_start, max(run_start + 1.0, load.ended_at))
        notes.append(
            "stopped before the measurement window: figures cover the whole run, warm-up included"
        )
    if load.stopped_early:
        notes.append("the run was stopped early: figures cover only what was measured")
    if plan.load.until_samples is not None:
        notes.append(_until_note(plan, reached_at, run_start))
    ok = sum(1 for r in records if r.outcome == "ok" and window.contains(r.sent_at))
    storm = error_storm_note(plan, records, window)
    if storm is not None:
        notes.append(storm)
    hint = after_run_hint(plan, ok, window.duration)
    if hint is not None:
        notes.append(hint)
    server = None
    if isinstance(prom, PromClient):
        # Let the last scrape of the window land before asking for it.
        time.sleep(min(2.0, max(0.0, window.end + 1.5 - time.time())))
        server = collect(prom, window)
    elif target.endpoints is None:
        notes.append("no Prometheus given (--prometheus): server-side figures not collected")
    health = load.health
    gen = GeneratorHealth(
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
    return summarize(
        records,
        run_start=run_start,
        window=window,
        scenario=plan.scenario_name,
        target=target.url,
        slo=plan.slo_value(),
        stages=_ran_stages(plan, load.ended_at - run_start),
        server=server,
        generator=gen,
        incomplete=load.stopped_early,
        notes=notes,
    )


def _ran_stages(plan: RunPlan, ran_s: float) -> tuple[Stage, ...]:
    """The planned stages cut at what ran: a run stopped early (``--until-samples``,
    Ctrl-C) would otherwise divide the last stage's completions by seconds that never
    ran (a held stage planned to 600 s read as a throughput decay of 0.999)."""
    out = []
    for stage in plan.stages():
        if stage.start_s >= ran_s:
            break
        out.append(replace(stage, end_s=min(stage.end_s, ran_s)))
    return tuple(out)


STORM_ERROR_SHARE = 0.5
"""Closed loop: above this share of failed requests the offered load is mostly retries."""


def error_storm_note(plan: RunPlan, records: list[Any], window: Any) -> str | None:
    """Closed loop, most requests in the window failed: what users offered collapsed
    into retries of failing requests (paced by the users' back-off, see
    :mod:`lbtune.loadgen.user`), so the figures describe failures, not the cluster's
    capacity. None otherwise."""
    from lbtune.loadgen.records import ERROR_OUTCOMES

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


def _until_note(plan: RunPlan, reached_at: float | None, run_start: float) -> str:
    need = plan.load.until_samples
    if reached_at is not None:
        return f"--until-samples {need}: reached after {reached_at - run_start:.0f} s"
    return (
        f"--until-samples {need}: not reached within the {plan.load.duration_s:g} s bound "
        "(--max-duration); the P99 may rest on too few requests"
    )


def _max(values: object) -> float | None:
    vals = [v for v in values if v is not None]  # type: ignore[attr-defined]
    return max(vals) if vals else None
