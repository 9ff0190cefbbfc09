"""The library API of the load generator: :func:`run_load`.

The caller's process never imports Locust or gevent. The test runs in child
processes (``python -m lbtune.loadgen.worker``): one local process, or a Locust
master and ``workers`` local worker processes. This process:

* reads each generator's JSON status lines (health, once a second) from its pipe;
* tails the generators' record files to compute live :class:`Progress` and to
  feed the client-side Prometheus exporter (``exporter_port``);
* on ``stop`` (or Ctrl-C) asks the children to stop sending and drain, and after
  a hard deadline kills them; then merges the records into ``requests.parquet``.

Example::

    from lbtune.loadgen.runner import LoadConfig, run_load
    res = run_load(LoadConfig(target_url="http://127.0.0.1:8080", scenario="chat",
                              duration_s=30, users=32, records_dir="out/run1"))
    print(res.outcomes, res.health.degraded)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from time import time
from typing import IO, Any
from urllib.parse import urlsplit

from lbtune.errors import ConfigError
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
from lbtune.loadgen.source import resolve
from lbtune.records.requests import OpenRequest

__all__ = ["LoadConfig", "LoadResult", "Progress", "run_load"]

log = logging.getLogger(__name__)
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
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
    u = urlsplit(cfg.target_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ConfigError(f"target must be http(s)://host[:port], found {cfg.target_url!r}")
    if u.hostname not in _LOOPBACK and not cfg.allow_remote:
        raise ConfigError(
            f"target {u.hostname} is not on loopback; pass allow_remote (--allow-remote) "
            "to load-test a remote cluster"
        )
    served_models(cfg.target_url, timeout_s=5)  # a real request: a bare connect is an ereq


class _Child:
    def __init__(self, name: str, argv: list[str], log_path: Path, lines: queue.Queue[Any]):
        self.name = name
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,  # the runner decides when its children stop
        )  # ... and they die with it (the worker's --parent-pid)
        self.log_path = log_path
        self.final: dict[str, Any] | None = None
        self.errors: list[str] = []
        self._t = threading.Thread(target=self._read, args=(lines,), daemon=True)
        self._t.start()

    def _read(self, lines: queue.Queue[Any]) -> None:
        out: IO[bytes] | None = self.proc.stdout
        assert out is not None
        for raw in out:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if msg.get("type") == "final":
                self.final = msg
            elif msg.get("type") == "error":
                self.errors.append(str(msg.get("error")))
            lines.put((self.name, msg))

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def kill_group(self) -> None:
        """SIGKILL the child's whole process group (it leads its own session)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def finish(self) -> int | None:
        self._t.join(timeout=2)
        self._log.close()
        return self.proc.poll()

    def failures(self) -> list[str]:
        """Its error messages, and its log's last line when it exited abnormally."""
        out = [f"{self.name}: {e}" for e in self.errors]
        if self.proc.returncode not in (0, None) or (self.final is None and self.name != "master"):
            try:
                tail = self.log_path.read_bytes()[-4096:].decode(errors="replace")
            except OSError:
                tail = ""
            last = next((ln.strip() for ln in reversed(tail.splitlines()) if ln.strip()), "")
            rc = self.proc.returncode
            out.append(f"{self.name} exited {rc}" + (f": {last[:300]}" if last else ""))
        return out


def _children(cfg: LoadConfig, rdir: Path, lines: queue.Queue[Any]) -> list[_Child]:
    """The generator processes of ``cfg``'s role (a local one, or a master and its local
    workers, or this machine's workers), started, their status lines going to ``lines``;
    the config they were given is kept as ``load-config.json``."""
    role = cfg.role if cfg.role != "auto" else ("master" if cfg.workers > 0 else "local")
    n_local = cfg.workers if role != "local" else 0
    expect = cfg.expect_workers or max(1, n_local)
    port = cfg.master_port or (_free_port() if role == "master" else 5557)
    child_cfg = dataclasses.asdict(cfg)
    child_cfg.update(
        records_dir=str(rdir.resolve()), master_port=port, expect_workers=expect, role=role
    )
    cfg_json = json.dumps(child_cfg)
    (rdir / "load-config.json").write_text(json.dumps(child_cfg, indent=2))
    run_id = uuid.uuid4().hex[:8]
    base = [sys.executable, "-m", "lbtune.loadgen.worker", "--config", cfg_json]
    base += ["--run-id", run_id, "--parent-pid", str(os.getpid())]
    children: list[_Child] = []
    if role in ("local", "master"):
        name = "local" if role == "local" else "master"
        children.append(
            _Child(name, [*base, "--role", role, "--name", name], rdir / f"{name}.log", lines)
        )
    for k in range(
        n_local if role == "master" else (max(1, cfg.workers) if role == "worker" else 0)
    ):
        wname = f"w{k}"
        idx = ["--worker-index", str(k)] if role == "master" else []
        children.append(
            _Child(
                wname,
                [*base, "--role", "worker", "--name", wname, *idx, "--worker-count", str(expect)],
                rdir / f"{wname}.log",
                lines,
            )
        )
    return children


def _health(
    children: list[_Child], samples: dict[str, list[HealthSample]], tail: RecordTail
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
    """Run one load test; bounded by ``duration_s + grace_s`` and a hard deadline."""
    resolve(
        cfg.scenario,
        cfg.seed,
        cfg.duration_s,
        cfg.users,
        cfg.rate,
        cfg.tokenizer_path,
        run_plan=cfg.run_plan,
    )
    _check_target(cfg)
    rdir = Path(cfg.records_dir)
    rdir.mkdir(parents=True, exist_ok=True)
    for old in rdir.glob("records-*.jsonl"):
        old.unlink()
    lines: queue.Queue[Any] = queue.Queue()
    children = _children(cfg, rdir, lines)

    registry = MetricsRegistry()
    exporter = ExporterServer(registry, cfg.exporter_port) if cfg.exporter_port else None
    tail = RecordTail(rdir, on_record=registry.observe)
    latest: dict[str, HealthSample] = {}
    opens: dict[str, tuple[OpenRequest, ...]] = {}
    samples: dict[str, list[HealthSample]] = {}
    started_at = time()
    t_go: float | None = None
    hard_deadline = started_at + cfg.duration_s + cfg.grace_s + 90.0
    stopped_early = False
    signalled = False
    next_progress = time() + 1.0
    try:
        while any(c.proc.poll() is None for c in children) and time() < hard_deadline:
            try:
                try:
                    name, msg = lines.get(timeout=0.2)
                    if msg.get("type") == "started" and t_go is None:  # before _handle pops it
                        t_go = float(msg["t"])
                    _handle(name, msg, latest, opens, samples, registry)
                    while True:
                        name, msg = lines.get_nowait()
                        _handle(name, msg, latest, opens, samples, registry)
                except queue.Empty:
                    pass
                if not signalled and stop is not None and stop.is_set():
                    stopped_early = signalled = True
                    hard_deadline = min(hard_deadline, time() + cfg.grace_s + _STOP_SLACK_S)
                    for c in children:
                        c.signal(signal.SIGTERM)
                now = time()
                if now >= next_progress:
                    next_progress = now + 1.0
                    tail.poll()
                    registry.set_in_flight(sum(s.in_flight for s in latest.values()))
                    if on_progress is not None:
                        on_progress(_progress(cfg, tail, latest, opens, t_go or started_at, now))
            except KeyboardInterrupt:
                stopped_early = True
                if signalled:  # second Ctrl-C: stop waiting for the drain
                    hard_deadline = min(hard_deadline, time() + 2.0)
                hard_deadline = min(hard_deadline, time() + cfg.grace_s + _STOP_SLACK_S)
                signalled = True
                for c in children:
                    c.signal(signal.SIGTERM)
    finally:
        for c in children:
            if c.proc.poll() is None:
                c.kill_group()
                c.proc.wait(timeout=5)
        exit_codes = {c.name: c.finish() for c in children}
        while not lines.empty():
            name, msg = lines.get_nowait()
            _handle(name, msg, latest, opens, samples, registry)
        tail.poll()
        if exporter is not None:
            exporter.close()
    records_path = finalize(rdir)
    health, sent = _health(children, samples, tail)
    (rdir / "health.json").write_text(health_json(health))
    return LoadResult(
        records_dir=rdir,
        records_path=records_path,
        sent=sent,
        outcomes=dict(tail.outcomes),
        health=health,
        started_at=t_go or started_at,
        ended_at=time(),
        stopped_early=stopped_early,
        exit_codes=exit_codes,
        failures=tuple(f for c in children for f in c.failures()),
    )


def _handle(
    name: str,
    msg: dict[str, Any],
    latest: dict[str, HealthSample],
    opens: dict[str, tuple[OpenRequest, ...]],
    samples: dict[str, list[HealthSample]],
    registry: MetricsRegistry,
) -> None:
    kind = msg.pop("type", None)
    if kind == "sample":
        raw_open = msg.pop("open", None) or ()
        s = HealthSample(**msg)
        latest[name] = s
        opens[name] = tuple(OpenRequest(float(a), b, bool(c)) for a, b, c in raw_open)
        samples.setdefault(name, []).append(s)
        registry.set_generator(s.worker, s.lateness_p99_s, s.cpu_percent)
    elif kind == "error":
        log.error("generator %s: %s", name, msg.get("error"))


def _progress(
    cfg: LoadConfig,
    tail: RecordTail,
    latest: dict[str, HealthSample],
    opens: dict[str, tuple[OpenRequest, ...]],
    t0: float,
    now: float,
) -> Progress:
    rps, tps, p50, p99 = tail.window(now)
    seen = min((s.t for s in latest.values()), default=now)
    open_now = tuple(o for name in latest for o in opens.get(name, ()) if o.sent_at <= seen)
    elapsed = now - t0
    lags = [s.loop_lag_p99_s for s in latest.values()]
    cpus = [s.cpu_percent for s in latest.values()]
    return Progress(
        elapsed_s=elapsed,
        remaining_s=max(0.0, cfg.duration_s - elapsed),
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
    )
