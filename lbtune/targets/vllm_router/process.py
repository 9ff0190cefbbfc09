"""vllm-router as a balancer: its command line, start/stop/restart, health and read-back.

`vllm-router` (PyPI, Rust) takes its policy and the cache-aware thresholds as flags
only, so a change means a restart. Its listener does not share its port (no
``SO_REUSEPORT``), so a restart is stop → start → ``/health``, and the gap is
measured and reported as downtime (~0.5 s on loopback).

The router is started as ``python -m lbtune.targets.vllm_router.process <vllm-router flags>``:
the same launcher as the ``vllm-router`` script, except that it does not let
``setproctitle`` rename the process to ``vllm::router``. That rename overwrites the
process's argv, which would defeat both the supervisor's PID identity check and the
read-back of the live flags from ``/proc/<pid>/cmdline``.

State in the cluster's state dir: ``router.pid`` (the supervisor's record),
``router.json`` (the parameters and command line last started), ``logs/router.log``.
"""

from __future__ import annotations

import fcntl
import json
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from lbtune.errors import ClusterError, TargetError
from lbtune.process import affinity, probes, supervisor
from lbtune.process.supervisor import ProcessRecord
from lbtune.records.statedir import StatePaths, read_endpoints, write_json_atomic

COMPONENT = "router"
MODULE = "lbtune.targets.vllm_router.process"
ROUTER_TIMEOUT = 15.0
POLICIES = ("round_robin", "random", "power_of_two", "cache_aware", "consistent_hash")
CACHE_AWARE_KNOBS: dict[str, type[int] | type[float]] = {
    "cache_threshold": float,
    "balance_abs_threshold": int,
    "balance_rel_threshold": float,
    "eviction_interval_secs": int,
    "max_tree_size": int,
}
"""Knobs that only mean something when the policy is cache_aware."""
DEFAULTS: dict[str, int | float | str] = {
    "policy": "cache_aware",
    "cache_threshold": 0.3,
    "balance_abs_threshold": 64,
    "balance_rel_threshold": 1.5,
    "eviction_interval_secs": 120,
    "max_tree_size": 33554432,
}
"""vllm-router 0.1.17's own defaults: the untuned baseline."""

RouterParams = dict[str, int | float | str]


def active(params: dict[str, Any]) -> RouterParams:
    """``params`` over the defaults, typed: every knob, as passed on the command line.

    The thresholds are passed whatever the policy (vllm-router ignores them unless the
    policy is cache_aware), so an inactive knob keeps its value across restarts and the
    read-back always has every knob.
    """
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise ClusterError(
            f"Unknown vllm-router knob(s): {', '.join(unknown)}. Known: {', '.join(DEFAULTS)}"
        )
    merged = {**DEFAULTS, **params}
    policy = str(merged["policy"])
    if policy not in POLICIES:
        raise ClusterError(
            f"Unknown vllm-router policy {policy!r}. Available: {', '.join(POLICIES)}"
        )
    out: RouterParams = {"policy": policy}
    for knob, kind in CACHE_AWARE_KNOBS.items():
        out[knob] = kind(merged[knob])
    return out


@dataclass(frozen=True, slots=True)
class RouterCommand:
    """What a router command line says: parameters, workers and addresses."""

    params: RouterParams
    worker_urls: tuple[str, ...]
    host: str
    port: int
    metrics_port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self, python: str = sys.executable) -> list[str]:
        """``python -m lbtune.targets.vllm_router.process`` + vllm-router flags."""
        cmd = [python, "-m", MODULE, "--host", self.host, "--port", str(self.port)]
        cmd += ["--worker-urls", *self.worker_urls, "--policy", str(self.params["policy"])]
        for knob in CACHE_AWARE_KNOBS:
            cmd += ["--" + knob.replace("_", "-"), str(self.params[knob])]
        cmd += ["--prometheus-host", self.host, "--prometheus-port", str(self.metrics_port)]
        # Workers are healthy before the router starts; re-check every second, not 30.
        cmd += ["--worker-startup-timeout-secs", "30", "--worker-startup-check-interval", "1"]
        return cmd


def parse_argv(argv: Sequence[str]) -> RouterCommand:
    """Read a router command line back (the inverse of :meth:`RouterCommand.argv`)."""
    flags: dict[str, list[str]] = {}
    current: list[str] | None = None
    for arg in argv:
        if arg.startswith("--"):
            current = flags.setdefault(arg[2:].replace("-", "_"), [])
        elif current is not None:
            current.append(arg)
    try:
        params: RouterParams = {"policy": flags.get("policy", [str(DEFAULTS["policy"])])[0]}
        for knob, kind in CACHE_AWARE_KNOBS.items():
            if knob in flags:
                params[knob] = kind(flags[knob][0])
        return RouterCommand(
            params=active(params),
            worker_urls=tuple(flags["worker_urls"]),
            host=flags["host"][0],
            port=int(flags["port"][0]),
            metrics_port=int(flags["prometheus_port"][0]),
        )
    except (KeyError, IndexError, ValueError) as exc:
        raise TargetError(
            f"Cannot read the router's flags from {' '.join(argv)!r}: {exc}"
        ) from None


# ---------------------------------------------------------------------------------------
# Process control.


def state_file(paths: StatePaths) -> Path:
    return paths.root / "router.json"


def health_missing(url: str) -> str | None:
    """``None`` when the router answers ``GET /health`` with 200."""
    status, _ = probes.http_get(url.rstrip("/") + "/health", timeout=1.0)
    return None if status == 200 else f"{url}/health answered {status or 'nothing'}"


def start(
    paths: StatePaths,
    command: RouterCommand,
    *,
    timeout: float = ROUTER_TIMEOUT,
    watch: Sequence[ProcessRecord] = (),
) -> ProcessRecord:
    """Start the router, wait for ``/health``, record its parameters; stop it on failure.
    Like the cluster's launch, it runs off the CPUs the cluster's servers are pinned to."""
    ep = read_endpoints(paths)
    cpus = affinity.complement(ep.reserved_cpus) if ep is not None else None
    record = supervisor.start(COMPONENT, command.argv(), paths, {"NO_COLOR": "1"}, cpus)
    try:
        supervisor.wait_until(
            lambda: health_missing(command.url), timeout, "vllm-router /health", [*watch, record]
        )
    except BaseException:
        supervisor.stop(record, paths)
        raise
    write_state(paths, command, record)
    return record


def write_state(paths: StatePaths, command: RouterCommand, record: ProcessRecord) -> None:
    """Record the parameters and command line started (``router.json``)."""
    write_json_atomic(
        state_file(paths),
        json.dumps(
            {"params": command.params, "cmdline": record.cmdline, "started_at": time.time()},
            indent=2,
        )
        + "\n",
    )


@contextmanager
def _restart_lock(paths: StatePaths) -> Iterator[None]:
    with open(paths.root / ".router.lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TargetError(f"Another change to the router in {paths.root} is running") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def restart(
    paths: StatePaths, command: RouterCommand, *, timeout: float = ROUTER_TIMEOUT
) -> tuple[ProcessRecord, float]:
    """Stop the running router and start ``command``; returns the record and the downtime (s).

    The port cannot be held by two routers, so the old one goes first; the downtime is
    from its SIGTERM until the new one answers ``/health``.
    """
    with _restart_lock(paths):
        t0 = time.monotonic()
        old = supervisor.read_record(paths, COMPONENT)
        if old is not None:
            supervisor.stop(old, paths)
        supervisor.wait_until(
            lambda: (
                f"port {command.port} still busy"
                if probes.port_busy(command.host, command.port)
                else None
            ),
            timeout,
            "the router's port to be released",
        )
        record = start(paths, command, timeout=timeout)
        return record, time.monotonic() - t0


def live_command(paths: StatePaths) -> tuple[ProcessRecord, RouterCommand]:
    """The running router's record and its flags, read from ``/proc/<pid>/cmdline``.

    Raises TargetError when no router runs, when its command line is not the one
    recorded at start, or when it does not answer ``/health``.
    """
    record = supervisor.read_record(paths, COMPONENT)
    if record is None or not supervisor.alive(record):
        raise TargetError(
            f"No vllm-router is running for {paths.root} (start the cluster with "
            "`balancer: vllm-router`)"
        )
    try:
        cmdline = psutil.Process(record.pid).cmdline()
    except psutil.Error as exc:
        raise TargetError(
            f"Cannot read the router's command line (pid {record.pid}): {exc}"
        ) from None
    if cmdline != record.cmdline:
        raise TargetError(
            f"The router (pid {record.pid}) runs {' '.join(cmdline)!r}, "
            f"not the recorded {' '.join(record.cmdline)!r}"
        )
    command = parse_argv(cmdline)
    missing = health_missing(command.url)
    if missing is not None:
        raise TargetError(f"The router (pid {record.pid}) is running but unhealthy: {missing}")
    return record, command


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m lbtune.targets.vllm_router.process FLAGS``: vllm-router, argv kept."""
    import setproctitle

    setattr(setproctitle, "setproctitle", lambda title: None)  # noqa: B010 (patching a module)
    from vllm_router.launch_router import main as launch

    sys.argv = ["vllm-router", *(sys.argv[1:] if argv is None else argv)]
    launch()


if __name__ == "__main__":
    main()
