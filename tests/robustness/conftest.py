"""Fixtures for the robustness probe: an echo target, the CLI as a user runs it, and
the processes a run leaves behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lbtune.cluster import api
from lbtune.errors import DependencyError
from lbtune.records.endpoints import Endpoints
from lbtune.targets import balancer, names

LBTUNE = [sys.executable, "-m", "lbtune"]


@dataclass(frozen=True)
class Ran:
    rc: int
    stdout: str
    stderr: str

    def lines(self) -> list[str]:
        """stderr's non-empty lines."""
        return [ln for ln in self.stderr.splitlines() if ln.strip()]


def cli_env() -> dict[str, str]:
    """The environment the CLI runs in here: wide, uncoloured output, and not the CI's
    mode (which changes what a run prints)."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("LBTUNE_CI", None)
    return env


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> Ran:
    """``lbtune ARGS`` in a subprocess, bounded in time."""
    p = subprocess.run(
        [*LBTUNE, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=cli_env()
    )
    return Ran(p.returncode, p.stdout, p.stderr)


def start_echo(*args: str) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "lbtune.loadgen.echo", "--port", "0", *args],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    port = int(json.loads(proc.stdout.readline())["port"])
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    """An echo target in its own process: TTFT 20 ms, 5 ms between tokens."""
    proc, url = start_echo("--ttft", "0.02", "--itl", "0.005")
    yield url
    proc.terminate()
    proc.wait(timeout=5)


STOP_S = 45.0
"""After Ctrl-C a run stops its generators and waits at most grace (5 s) + 10 s for them
(``lbtune.loadgen.runner``); 45 s leaves a busy machine (four test workers sharing what
a CPU hog leaves of two cores) time to schedule the signal and the kills."""
REPORT_S = 120.0
"""Then the partial summary and report: a few seconds on a quiet machine, much longer when
the CPU is shared; only a bound against a hang."""


def wait_for_stop(proc: subprocess.Popen[str], marker: str) -> str:
    """After a Ctrl-C to ``proc`` (an ``lbtune stress``): its generator processes (those
    whose command line holds ``marker``, its output directory) are gone within
    :data:`STOP_S`, then ``proc`` exits within :data:`REPORT_S`; returns its stderr.
    Fails the test (killing what is left) otherwise, naming which of the two did not end."""
    deadline = time.monotonic() + STOP_S
    while time.monotonic() < deadline and set(processes_mentioning(marker)) - {proc.pid}:
        time.sleep(0.2)
    left = set(processes_mentioning(marker)) - {proc.pid}
    if left:
        what = {pid: (_cmdline(pid) or "(gone)")[:160] for pid in sorted(left)}
        proc.kill()
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        pytest.fail(f"still running {STOP_S:g} s after Ctrl-C: {what}")
    try:
        _, err = proc.communicate(timeout=REPORT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=10)
        pytest.fail(f"the generators stopped, but lbtune did not exit {REPORT_S:g} s later")
    return err


def _cmdline(pid: int) -> str | None:
    """A process's command line, its arguments joined by spaces; None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace")


def processes_mentioning(marker: str) -> list[int]:
    """Pids of live processes whose command line contains ``marker`` (zombies excluded)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        cmd = _cmdline(int(d.name))
        if cmd is None or marker not in cmd:
            continue
        try:
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            pids.append(int(d.name))
    return pids


@pytest.fixture(scope="session")
def mini2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One embedded mini2 cluster (HAProxy, two simulated replicas) for the whole package."""
    from tests.conftest import running_cluster

    with running_cluster(tmp_path_factory.mktemp("mini2")) as ep:
        yield ep


def haproxy_frontends(ep: Any) -> dict[str, dict[str, str]]:
    """The balancer's HAProxy FRONTEND rows (the stats page's own excluded), by proxy."""
    import csv
    import io
    import urllib.request

    with urllib.request.urlopen(ep.stats_url + ";csv", timeout=5) as resp:
        text = resp.read().decode().lstrip("# ")
    rows = csv.DictReader(io.StringIO(text))
    return {r["pxname"]: r for r in rows if r["svname"] == "FRONTEND" and r["pxname"] != "stats"}


def frontend_total(ep: Any, column: str) -> int:
    return sum(int(r[column] or 0) for r in haproxy_frontends(ep).values())


@pytest.fixture(scope="module", params=names())
def deployed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Endpoints]:
    """Each registered balancer's own test preset, up for the module (skipped where the
    balancer's program is missing)."""
    entry = balancer(request.param)
    state = tmp_path_factory.mktemp(f"safety-{request.param}")
    try:
        try:
            ep = api.up(entry.test_preset, state)
        except DependencyError as exc:
            pytest.skip(f"{request.param}: {exc}")
        yield ep
    finally:
        api.down(state)
