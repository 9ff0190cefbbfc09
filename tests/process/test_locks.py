"""The one exclusive-lock primitive (:func:`lbtune.process.locks.pid_lock`): the apply
lock, the load claim and the heal lock are all made of it. Two holders in one process use
two open files, which ``flock`` treats as two holders, as it does two processes."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from lbtune.process.locks import pid_lock


class Refused(Exception):
    pass


def test_a_second_holder_is_refused_at_once_naming_the_first(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    with pid_lock(lock, Refused):
        assert lock.read_text() == f"{os.getpid()}\n"
        t0 = time.monotonic()
        with pytest.raises(Refused, match=str(os.getpid())), pid_lock(lock, Refused):
            pass
        assert time.monotonic() - t0 < 0.5
    with pid_lock(lock, Refused):  # released: taken again
        pass
    assert lock.read_text() == ""


def test_a_waiting_holder_gets_the_lock_once_it_is_released(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    held, release = threading.Event(), threading.Event()

    def first() -> None:
        with pid_lock(lock, Refused):
            held.set()
            release.wait(10)

    th = threading.Thread(target=first)
    th.start()
    try:
        assert held.wait(10)
        threading.Timer(0.3, release.set).start()
        t0 = time.monotonic()
        with pid_lock(lock, Refused, wait_s=10):
            waited = time.monotonic() - t0
        assert 0.2 < waited < 5
    finally:
        release.set()
        th.join(10)


def test_a_waiting_holder_is_refused_when_the_wait_runs_out(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    with pid_lock(lock, Refused):
        t0 = time.monotonic()
        with pytest.raises(Refused), pid_lock(lock, Refused, wait_s=0.4):
            pass
        assert time.monotonic() - t0 >= 0.4
