"""The library API of the load generator: :func:`run_load`.

The caller's process never imports Locust or gevent. The test runs in child
processes (``python -m lbtune.loadgen.worker``): one local process, or a Locust
master and ``workers`` local worker processes. This process:

* writes the generators' settings (``load-config.json``, :mod:`.settings`: the run
  plan's path, or a scenario/``fixed:`` workload, and the connection), which they read;
* reads each generator's JSON status lines (health, once a second) from its pipe;
* tails the generators' record files, the run's one tail of them, to compute live
  :class:`Progress` (which hands each record read on to the live consumers: the
  ``--until-samples`` counter, a study's pruning windows) and to feed the client-side
  Prometheus exporter (``exporter_port``);
* on ``stop`` (or Ctrl-C) asks the children to stop sending and drain, and after
  a hard deadline kills them; then merges the records into ``requests.parquet``.

Example::

    from lbtune.loadgen.runner import LoadConfig, run_load
    res = run_load(LoadConfig(target_url="http://127.0.0.1:8080", scenario="chat",
                              duration_s=30, users=32, records_dir="out/run1"))
    print(res.outcomes, res.health.degraded)
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from time import time
from typing import Any

from lbtune.loadgen.children import Child, start_children
from lbtune.loadgen.collect import Progress, RecordTail
from lbtune.loadgen.exporter import ExporterServer, MetricsRegistry
from lbtune.loadgen.health import (
    WORKER_HEALTH,
    GeneratorHealth,
    HealthSample,
    WorkerHealth,
    health_json,
    summarize,
)
from lbtune.loadgen.preflight import served_models
from lbtune.loadgen.recordio import finalize
from lbtune.loadgen.settings import (
    SETTINGS_FILE,
    GeneratorSettings,
    SourceSettings,
    write_settings,
)
from lbtune.loadgen.source import open_source
from lbtune.records.addresses import check_host, check_url
from lbtune.records.requests import OpenRequest, RequestRecord

__all__ = ["LoadConfig", "LoadResult", "Progress", "run_load"]

log = logging.getLogger(__name__)
_STOP_SLACK_S = 10.0
"""After a stop: the generators have ``grace_s`` to drain and this long to write their
records and exit before they are killed."""


@dataclass(frozen=True)
class LoadConfig:
    target_url: str
    scenario: str
    """Scenario name, YAML path, or a ``fixed:...`` workload (see lbtune.loadgen.source)."""
    records_dir: str | Path
    seed: int = 0
    duration_s: float = 60.0
    users: int | None = None
    """Closed-loop user count override."""
    rate: float | None = None
    """Open-loop arrival rate override (req/s)."""
    exporter_port: int | None = None
    workers: int = 0
    """0 = one local process; N = Locust master + N local worker processes."""
    role: str = "auto"
    """auto (per ``workers``), master (wait for ``expect_workers``) or worker (join master)."""
    master_host: str = "127.0.0.1"
    master_port: int = 0
    """0 = a free port (local distributed mode)."""
    expect_workers: int | None = None
    """Workers the master waits for (multi-machine); default ``workers``."""
    ui: bool = False
    ui_port: int = 8089
    request_timeout_s: float = 120.0
    replica_header: str = "X-Lbtune-Replica"
    max_in_flight: int = 4096
    grace_s: float = 5.0
    """After the duration (or stop): how long in-flight requests may still finish."""
    allow_remote: bool = False
    master_bind_host: str = "127.0.0.1"
    """Where a master listens for workers; loopback unless spread over machines on purpose."""
    tokenizer_path: str | None = None
    """A Hugging Face ``tokenizer.json`` that prompt lengths are fitted to."""
    run_plan: str | None = None
    """Path of the run's ``run.json`` (:mod:`lbtune.scenario.runplan`): when set, the
    generators take the scenario document and load plan from it and never read the scenario
    file."""
    cpus: frozenset[int] | None = None
    """The CPUs the generator processes run on (the embedded cluster's CPUs outside its
    pinned servers': :attr:`lbtune.run.target.ResolvedTarget.generator_cpus`); None: where
    this process runs."""


@dataclass(frozen=True)
class LoadResult:
    records_dir: Path
    records_path: Path
    """``requests.parquet``: every request sent, exactly one outcome each."""
    sent: int
    outcomes: dict[str, int]
    health: GeneratorHealth
    started_at: float
    ended_at: float
    stopped_early: bool
    """``stop`` was set or Ctrl-C was pressed before the duration ended."""
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    failures: tuple[str, ...] = ()
    """What went wrong in the generators: their error messages, and the last line of the
    log of each one that exited abnormally (e.g. ``MemoryError``)."""

    @property
    def completed(self) -> int:
        return sum(self.outcomes.values())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _check_target(cfg: LoadConfig) -> None:
    check_url(cfg.target_url, "target", allow_remote=cfg.allow_remote, opt_in="allow_remote")
    role = _role(cfg)
    if role == "master":
        check_host(cfg.master_bind_host, "master_bind_host", allow_remote=cfg.allow_remote)
    if role == "worker":
        check_host(cfg.master_host, "master_host", allow_remote=cfg.allow_remote)
    served_models(cfg.target_url, timeout_s=5)  # a real request: a bare connect is an ereq


def _role(cfg: LoadConfig) -> str:
    """This machine's part: ``local``, ``master`` (with local or remote workers) or ``worker``."""
    return cfg.role if cfg.role != "auto" else ("master" if cfg.workers > 0 else "local")


def _settings(cfg: LoadConfig, rdir: Path) -> GeneratorSettings:
    """The generator processes' settings (:mod:`.settings`): the run plan's path, else
    the scenario or ``fixed:`` workload and its overrides; the connection and limits."""
    role = _role(cfg)
    n_local = cfg.workers if role != "local" else 0
    source = None
    if cfg.run_plan is None:
        source = SourceSettings(
            scenario=cfg.scenario,
            seed=cfg.seed,
            duration_s=cfg.duration_s,
            users=cfg.users,
            rate=cfg.rate,
        )
    return GeneratorSettings(
        target_url=cfg.target_url,
        records_dir=str(rdir.resolve()),
        run_plan=cfg.run_plan,
        source=source,
        tokenizer_path=cfg.tokenizer_path,
        grace_s=cfg.grace_s,
        request_timeout_s=cfg.request_timeout_s,
        replica_header=cfg.replica_header,
        max_in_flight=cfg.max_in_flight,
        ui=cfg.ui,
        ui_port=cfg.ui_port,
        master_host=cfg.master_host,
        master_port=cfg.master_port or (_free_port() if role == "master" else 5557),
        master_bind_host=cfg.master_bind_host,
        expect_workers=cfg.expect_workers or max(1, n_local),
        cpus=None if cfg.cpus is None else tuple(sorted(cfg.cpus)),
    )


def _health(
    children: list[Child], samples: dict[str, list[HealthSample]], tail: RecordTail
) -> tuple[GeneratorHealth, int]:
    """The generators' health and the requests they sent: each one's final report, or for
    one that crashed or was killed what its status lines said (degraded), and then at
    least the records it wrote."""
    workers: list[WorkerHealth] = []
    sent = 0
    for c in children:
        if c.name == "master":
            continue
        if c.final is not None and c.final.get("health"):
            workers.append(WORKER_HEALTH.validate_python(c.final["health"]))
            sent += int(c.final.get("sent", 0))
        else:  # crashed or killed: what its status lines said, and its records
            wh = summarize(c.name, [], [], samples.get(c.name, []), 0)
            why = (*wh.reasons, "generator did not finish cleanly")
            workers.append(dataclasses.replace(wh, degraded=True, reasons=why))
    if any(c.final is None for c in children if c.name != "master"):
        sent = max(sent, tail.count)
    return GeneratorHealth(tuple(workers)), sent


def run_load(
    cfg: LoadConfig,
    on_progress: Callable[[Progress], None] | None = None,
    stop: threading.Event | None = None,
) -> LoadResult:
    """Run one load test; bounded by its length + ``grace_s`` and a hard deadline.

    The length is the run plan's (``cfg.run_plan``), else ``cfg.duration_s``."""
    rdir = Path(cfg.records_dir)
    settings = _settings(cfg, rdir)
    source = open_source(settings)  # a bad scenario, plan or tokenizer: before anything starts
    _check_target(cfg)
    rdir.mkdir(parents=True, exist_ok=True)
    for old in rdir.glob("records-*.jsonl"):
        old.unlink()
    path = write_settings(rdir.resolve() / SETTINGS_FILE, settings)
    run = _Supervised(cfg, rdir, source.duration_s, on_progress)
    run.begin(start_children(_role(cfg), cfg.workers, settings, path, run.lines))
    try:
        run.watch(stop)
    finally:
        run.end()
    records_path = finalize(rdir)
    health, sent = _health(run.children, run.samples, run.tail)
    (rdir / "health.json").write_text(health_json(health))
    return LoadResult(
        records_dir=rdir,
        records_path=records_path,
        sent=sent,
        outcomes=dict(run.tail.outcomes),
        health=health,
        started_at=run.start,
        ended_at=time(),
        stopped_early=run.stopped_early,
        exit_codes=run.exit_codes,
        failures=tuple(f for c in run.children for f in c.failures()),
    )


class _Supervised:
    """The generator processes of one run while it runs: their status lines, the run's one
    tail of their record files (feeding the exporter and each :class:`Progress`), the
    stop (``stop`` or Ctrl-C: drain, then a hard deadline)."""

    def __init__(
        self,
        cfg: LoadConfig,
        rdir: Path,
        duration_s: float,
        on_progress: Callable[[Progress], None] | None,
    ) -> None:
        self.cfg, self.duration_s, self._on_progress = cfg, duration_s, on_progress
        self.lines: queue.Queue[Any] = queue.Queue()
        self.children: list[Child] = []
        self.exit_codes: dict[str, int | None] = {}
        self.registry = MetricsRegistry()
        self.exporter: ExporterServer | None = None
        self.tail = RecordTail(rdir, on_record=self._record)
        self._fresh: list[RequestRecord] = []
        self.latest: dict[str, HealthSample] = {}
        self.opens: dict[str, tuple[OpenRequest, ...]] = {}
        self.samples: dict[str, list[HealthSample]] = {}
        self.started_at = self.deadline = time()
        self.t_go: float | None = None
        self.stopped_early = self._signalled = False

    def begin(self, children: list[Child]) -> None:
        """Supervise ``children`` (just started) from now on."""
        self.children = children
        if self.cfg.exporter_port:
            self.exporter = ExporterServer(self.registry, self.cfg.exporter_port)
        self.started_at = time()
        self.deadline = self.started_at + self.duration_s + self.cfg.grace_s + 90.0

    @property
    def start(self) -> float:
        """The run's start: the generators' (their first ``started`` line), else the
        runner's own (before they reported it, or when none ever did)."""
        return self.t_go or self.started_at

    def watch(self, stop: threading.Event | None) -> None:
        """Until every generator exited (or the hard deadline): status lines, a snapshot
        a second, and the stop."""
        next_progress = time() + 1.0
        while any(c.proc.poll() is None for c in self.children) and time() < self.deadline:
            try:
                self._read_lines()
                if not self._signalled and stop is not None and stop.is_set():
                    self._terminate()
                now = time()
                if now >= next_progress:
                    next_progress = now + 1.0
                    self._snapshot(now)
            except KeyboardInterrupt:
                if self._signalled:  # second Ctrl-C: stop waiting for the drain
                    self.deadline = min(self.deadline, time() + 2.0)
                self._terminate()

    def end(self) -> None:
        """Kill what still runs, then read the last status lines and records."""
        for c in self.children:
            if c.proc.poll() is None:
                c.kill_group()
                c.proc.wait(timeout=5)
        self.exit_codes = {c.name: c.finish() for c in self.children}
        while not self.lines.empty():
            self._handle(*self.lines.get_nowait())
        self.tail.poll()
        if self.exporter is not None:
            self.exporter.close()

    def _terminate(self) -> None:
        """Ask every generator to stop sending and drain (SIGTERM); shorten the deadline."""
        self.stopped_early = self._signalled = True
        self.deadline = min(self.deadline, time() + self.cfg.grace_s + _STOP_SLACK_S)
        for c in self.children:
            c.signal(signal.SIGTERM)

    def _read_lines(self) -> None:
        try:
            self._handle(*self.lines.get(timeout=0.2))
            while True:
                self._handle(*self.lines.get_nowait())
        except queue.Empty:
            pass

    def _handle(self, name: str, msg: dict[str, Any]) -> None:
        kind = msg.pop("type", None)
        if kind == "started" and self.t_go is None:
            self.t_go = float(msg["t"])
        elif kind == "sample":
            raw_open = msg.pop("open", None) or ()
            s = HealthSample(**msg)
            self.latest[name] = s
            self.opens[name] = tuple(OpenRequest(float(a), b, bool(c)) for a, b, c in raw_open)
            self.samples.setdefault(name, []).append(s)
            self.registry.set_generator(s.worker, s.lateness_p99_s, s.cpu_percent)
        elif kind == "error":
            log.error("generator %s: %s", name, msg.get("error"))

    def _record(self, r: RequestRecord) -> None:
        self.registry.observe(r)
        if self._on_progress is not None:
            self._fresh.append(r)

    def _snapshot(self, now: float) -> None:
        self.tail.poll()
        self.registry.set_in_flight(sum(s.in_flight for s in self.latest.values()))
        if self._on_progress is not None:
            fresh, self._fresh = tuple(self._fresh), []
            self._on_progress(self._progress(now, fresh))

    def _progress(self, now: float, fresh: tuple[RequestRecord, ...]) -> Progress:
        tail, latest = self.tail, self.latest
        rps, tps, p50, p99 = tail.window(now)
        seen = min((s.t for s in latest.values()), default=now)
        open_now = tuple(
            o for name in latest for o in self.opens.get(name, ()) if o.sent_at <= seen
        )
        elapsed = now - self.start
        lags = [s.loop_lag_p99_s for s in latest.values()]
        cpus = [s.cpu_percent for s in latest.values()]
        return Progress(
            elapsed_s=elapsed,
            remaining_s=max(0.0, self.duration_s - elapsed),
            sent=sum(s.sent for s in latest.values()),
            completed=tail.count,
            requests_per_s=rps,
            output_tokens_per_s=tps,
            ttft_p50_s=p50,
            ttft_p99_s=p99,
            errors=tail.errors,
            in_flight=sum(s.in_flight for s in latest.values()),
            generator_lag_p99_s=max(lags) if lags else None,
            generator_cpu_percent=max(cpus) if cpus else None,
            window_s=tail.window_s,
            now=seen,
            open_requests=open_now,
            started_at=self.start,
            records=fresh,
        )
