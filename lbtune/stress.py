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
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from lbtune.errors import ConfigError, TargetError

if TYPE_CHECKING:
    from lbtune.cluster.state import Endpoints
    from lbtune.loadgen.runner import LoadResult, Progress
    from lbtune.metrics.summary import RunSummary, Slo
    from lbtune.report import ReportPaths
    from lbtune.scenario.models import Scenario

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


@dataclass(frozen=True)
class ResolvedTarget:
    url: str
    prometheus_url: str | None
    exporter_port: int | None
    endpoints: Endpoints | None
    cluster_started: bool


@dataclass(frozen=True)
class StressResult:
    summary: RunSummary
    report: ReportPaths | None
    records_path: Path
    load: LoadResult
    target: ResolvedTarget

    @property
    def degraded(self) -> bool:
        return self.summary.generator.degraded


class GeneratorDegraded(TargetError):
    """``--strict``: the generator fell behind, so the measurement is not trusted."""

    exit_code = 1


_SLO_KEYS = {"ttft": "ttft_s", "e2e": "e2e_s", "errors": "max_error_rate"}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*$")


def parse_slo(text: str | None, base: Slo) -> Slo:
    """Apply ``ttft=350ms,e2e=800ms,errors=1%`` overrides to ``base``."""
    if not text:
        return base
    changes: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in _SLO_KEYS:
            raise ConfigError(
                f"--slo: cannot read {part.strip()!r}; expected KEY=VALUE with KEY in "
                f"{', '.join(_SLO_KEYS)} (e.g. --slo ttft=350ms,e2e=800ms,errors=1%)"
            )
        value = value.strip()
        if key == "errors":
            pct = value.endswith("%")
            try:
                number = float(value.rstrip("%"))
            except ValueError:
                raise ConfigError(
                    f"--slo errors: expected a fraction or a percentage, got {value!r}"
                ) from None
            changes[_SLO_KEYS[key]] = number / 100 if pct else number
            continue
        m = _DURATION.match(value)
        if not m:
            raise ConfigError(f"--slo {key}: expected a duration like 350ms or 2s, got {value!r}")
        number = float(m.group(1))
        changes[_SLO_KEYS[key]] = number / 1000 if m.group(2) == "ms" else number
    return replace(base, **changes)


def check_target_allowed(url: str, allow_remote: bool) -> None:
    """Refuse load against a non-loopback host unless explicitly allowed."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"--target: expected an http(s) URL like http://127.0.0.1:8000, got {url!r}"
        )
    if parts.hostname not in LOOPBACK_HOSTS and not allow_remote:
        raise ConfigError(
            f"--target {url}: {parts.hostname} is not a loopback address; sending load to "
            "another machine needs --allow-remote"
        )


def check_reachable(url: str, timeout_s: float = 5.0) -> None:
    """A TCP connect to the target within ``timeout_s``, or a TargetError saying so."""
    import socket

    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        raise TargetError(
            f"target {url} is unreachable ({exc.strerror or exc}); start the balancer, or omit "
            "--target to use the embedded cluster"
        ) from None


def resolve_target(opts: StressOptions, say: Callable[[str], None]) -> ResolvedTarget:
    """The URL to load, its Prometheus, and the exporter port the cluster scrapes."""
    if opts.target_url is not None:
        check_target_allowed(opts.target_url, opts.allow_remote)
        check_reachable(opts.target_url)
        return ResolvedTarget(opts.target_url.rstrip("/"), opts.prometheus_url, None, None, False)
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
    """Run one load test and write its report; see the module docstring."""
    from lbtune.loadgen.runner import LoadConfig, run_load
    from lbtune.metrics.summary import Slo, Window
    from lbtune.scenario import load_scenario, plan_load

    scenario = load_scenario(opts.scenario)
    plan = plan_load(scenario, opts.duration_s, opts.users, opts.rate, opts.seed)
    base_slo = Slo(
        ttft_s=scenario.slo.ttft if scenario.slo else None,
        e2e_s=scenario.slo.e2e if scenario.slo else None,
    )
    slo = parse_slo(opts.slo, base_slo)
    target = resolve_target(opts, say)
    prom = _prometheus(target.prometheus_url)

    out_dir = opts.out_dir or default_out_dir(opts.reports_root, scenario.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = LoadConfig(
        target_url=target.url,
        scenario=opts.scenario,
        records_dir=out_dir,
        seed=scenario.seed if opts.seed is None else opts.seed,
        duration_s=plan.duration_s,
        users=opts.users,
        rate=opts.rate,
        exporter_port=target.exporter_port,
        workers=opts.workers,
        role=opts.role,
        master_host=opts.master_host,
        master_bind_host=opts.master_bind,
        master_port=opts.master_port,
        expect_workers=opts.expect_workers,
        tokenizer_path=opts.tokenizer,
        ui=opts.ui,
        request_timeout_s=opts.request_timeout_s,
        allow_remote=opts.allow_remote,
    )
    say(f"load: {scenario.name} against {target.url} for {plan.duration_s:g} s ({plan.mode} loop)")
    load = run_load(cfg, on_progress=on_progress, stop=stop)
    summary = _summarize(scenario, plan, load, target, slo, prom, Window)
    report = None
    if opts.write_report:
        from lbtune.loadgen.recordio import read_records
        from lbtune.report import write_report

        report = write_report(out_dir, summary, read_records(load.records_path))
    result = StressResult(summary, report, load.records_path, load, target)
    if report is not None:
        from lbtune.history import index_stress

        index_stress(opts, result)
    if opts.strict and result.degraded:
        raise GeneratorDegraded(
            "the load generator fell behind ("
            + "; ".join(summary.generator.reasons)
            + f"); figures are not trusted (--strict). Report: {out_dir}"
        )
    return result


def _prometheus(url: str | None) -> object | None:
    """A checked Prometheus client, or None when there is no Prometheus to ask."""
    if url is None:
        return None
    from lbtune.metrics.prom import PromClient

    client = PromClient(url, timeout_s=5.0)
    client.check()
    return client


def _summarize(
    scenario: Scenario,
    plan: object,
    load: LoadResult,
    target: ResolvedTarget,
    slo: Slo,
    prom: object | None,
    window_cls: type,
) -> RunSummary:
    from lbtune.loadgen.recordio import read_records
    from lbtune.metrics.prom import PromClient
    from lbtune.metrics.serverside import collect
    from lbtune.metrics.stats import summarize
    from lbtune.metrics.summary import GeneratorHealth
    from lbtune.scenario.plan import LoadPlan

    assert isinstance(plan, LoadPlan)
    records = read_records(load.records_path)
    start_off, end_off = plan.measure_window
    run_start = load.started_at
    end = min(run_start + end_off, load.ended_at)
    window = window_cls(run_start + start_off, max(run_start + start_off, end))
    notes: list[str] = []
    if window.duration < 1.0:  # stopped before the measurement window opened
        window = window_cls(run_start, max(run_start + 1.0, load.ended_at))
        notes.append(
            "stopped before the measurement window: figures cover the whole run, warm-up included"
        )
    if load.stopped_early:
        notes.append("the run was stopped early: figures cover only what was measured")
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
    )
    return summarize(
        records,
        run_start=run_start,
        window=window,
        scenario=scenario.name,
        target=target.url,
        slo=slo,
        stages=plan.stages,
        server=server,
        generator=gen,
        incomplete=load.stopped_early,
        notes=notes,
    )


def _max(values: object) -> float | None:
    vals = [v for v in values if v is not None]  # type: ignore[attr-defined]
    return max(vals) if vals else None
