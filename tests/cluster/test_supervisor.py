"""Process supervision: PID files, identity checks, stop by PID only."""

from __future__ import annotations

import dataclasses
import os
import sys
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
