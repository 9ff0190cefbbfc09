"""Process supervision: PID files, identity checks, stop by PID only."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from lbtune.errors import ClusterError
from lbtune.process import supervisor
from lbtune.records.statedir import StatePaths

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def paths(tmp_path: Path) -> StatePaths:
    p = StatePaths(tmp_path)
    p.create()
    return p


def test_start_writes_a_pid_file_and_stop_removes_it(paths: StatePaths) -> None:
    rec = supervisor.start("sleeper", SLEEPER, paths)
    try:
        assert supervisor.read_record(paths, "sleeper") == rec
        assert supervisor.alive(rec)
        assert psutil.Process(rec.pid).ppid() == os.getpid()
        assert os.getsid(rec.pid) == rec.pid  # its own session: outlives the CLI
    finally:
        pids = supervisor.stop(rec, paths, timeout=5)
    assert pids == [rec.pid]
    assert not supervisor.alive(rec)
    assert not paths.pid_file("sleeper").exists()
    assert supervisor.stop(rec, paths) == []  # idempotent


def test_a_recycled_pid_is_never_signalled(paths: StatePaths) -> None:
    rec = supervisor.start("sleeper", SLEEPER, paths)
    try:
        impostor = dataclasses.replace(rec, create_time=rec.create_time - 100)
        assert not supervisor.alive(impostor)
        assert supervisor.stop(impostor, paths) == []
        assert supervisor.alive(rec)  # the real process was left alone
    finally:
        supervisor.stop(rec, paths, timeout=5)


def test_what_a_dead_unreaped_leader_left_in_its_session_is_stopped(paths: StatePaths) -> None:
    """nginx's workers outlive a SIGKILL of their master; the master stays a zombie while
    its parent (the process that ran `up`) has not reaped it, and whoever stops it (the
    keeper) is not that parent: its session is still ours to clear."""
    parent_code = (
        "import subprocess, time; p = subprocess.Popen(['sh', '-c', 'sleep 60 & exit 0'],"
        " start_new_session=True); print(p.pid, flush=True); time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        leader = psutil.Process(int(parent.stdout.readline()))
        deadline = time.monotonic() + 10
        while leader.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert leader.status() == psutil.STATUS_ZOMBIE  # dead, not reaped by its parent
        (worker,) = [
            p for p in psutil.process_iter() if p.pid != leader.pid and _sid(p.pid) == leader.pid
        ]
        rec = supervisor.ProcessRecord(
            "nginx", leader.pid, leader.create_time(), ["sh"], str(paths.log("nginx"))
        )
        assert not supervisor.alive(rec)
        assert supervisor.stop(rec, paths, timeout=5) == [worker.pid]
        assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
    finally:
        parent.kill()
        parent.wait()


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def test_sigterm_resistant_process_gets_sigkill(paths: StatePaths) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    rec = supervisor.start("stubborn", [sys.executable, "-c", code], paths)
    supervisor.wait_until(lambda: None, 1, "nothing")
    assert supervisor.stop(rec, paths, timeout=0.5) == [rec.pid]
    assert not supervisor.alive(rec)


def test_wait_until_names_the_log_when_a_process_dies(paths: StatePaths) -> None:
    code = "print('port 1234 is busy'); raise SystemExit(3)"
    rec = supervisor.start("crasher", [sys.executable, "-c", code], paths)
    with pytest.raises(ClusterError, match=r"crasher exited with status 3 .*busy.*crasher.log"):
        supervisor.wait_until(lambda: "never ready", 10, "readiness", [rec])
    supervisor.stop(rec, paths)


def test_wait_until_times_out_with_what_is_missing() -> None:
    with pytest.raises(ClusterError, match="Timed out after 0 s waiting for x: still missing"):
        supervisor.wait_until(lambda: "still missing", 0.1, "x")
