"""The CPUs a started process runs on beside a cluster's pinned servers
(:mod:`lbtune.process.affinity`), and the one spawn path of the cluster's processes
(:func:`lbtune.process.supervisor.start`) applying them."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lbtune.process import affinity, supervisor
from lbtune.records.statedir import StatePaths

PRINT_CPUS = "import os; print(sorted(os.sched_getaffinity(0)), flush=True)"

needs_two_cpus = pytest.mark.skipif(
    len(affinity.usable()) < 2,
    reason="pinning to a subset needs at least 2 CPUs this process may use",
)


def _as_if_usable(monkeypatch: pytest.MonkeyPatch, cpus: set[int]) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cpus))


def test_the_complement_is_the_usable_cpus_outside_the_reserved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _as_if_usable(monkeypatch, {0, 1, 2, 3})
    assert affinity.complement([1]) == frozenset({0, 2, 3})
    assert affinity.complement([1, 3, 7]) == frozenset({0, 2})  # a CPU not ours takes nothing away


def test_nothing_reserved_or_nothing_left_pins_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    _as_if_usable(monkeypatch, {0, 1})
    assert affinity.complement([]) is None
    assert affinity.complement([0, 1]) is None  # every CPU taken: leave things as they are
    _as_if_usable(monkeypatch, {0})
    assert affinity.complement([0]) is None  # a 1-CPU machine


def test_no_cpus_means_only_the_other_preexec() -> None:
    def other() -> None: ...

    assert affinity.pin(None) is None
    assert affinity.pin(None, other) is other
    assert affinity.pin({0}, other) not in (None, other)


def _wait_for_line(path: Path, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("---")]
        if lines:
            return lines[0]
        time.sleep(0.02)
    raise AssertionError(f"{path} stayed empty")


@needs_two_cpus
@pytest.mark.parametrize("pinned", [True, False])
def test_a_supervised_process_starts_on_the_cpus_it_is_given(tmp_path: Path, pinned: bool) -> None:
    paths = StatePaths(tmp_path)
    paths.create()
    one = min(affinity.usable())
    cpus = {one} if pinned else None
    rec = supervisor.start("cpus", [sys.executable, "-c", PRINT_CPUS], paths, cpus=cpus)
    try:
        seen = ast.literal_eval(_wait_for_line(Path(rec.log)))
    finally:
        supervisor.stop(rec, paths, timeout=5)
    assert seen == ([one] if pinned else sorted(affinity.usable()))


@needs_two_cpus
def test_what_a_pinned_process_starts_stays_on_its_cpus(tmp_path: Path) -> None:
    """A balancer forks its workers and a Go program makes its threads after it started:
    they inherit the pin, which is set before the program runs."""
    paths = StatePaths(tmp_path)
    paths.create()
    one = min(affinity.usable())
    code = (
        "import subprocess, sys; subprocess.run([sys.executable, '-c', "
        f"{PRINT_CPUS!r}], check=True)"
    )
    rec = supervisor.start("parent", [sys.executable, "-c", code], paths, cpus={one})
    try:
        seen = ast.literal_eval(_wait_for_line(Path(rec.log)))
    finally:
        supervisor.stop(rec, paths, timeout=5)
    assert seen == [one]


KEPT_OFF = """
import os, sys, threading
from lbtune.process import affinity
ready, done = threading.Event(), threading.Event()
def work():
    ready.set()
    done.wait(10)
t = threading.Thread(target=work)
t.start()
ready.wait(10)
with affinity.kept_off({int(sys.argv[1])}) as moved:
    later = threading.Thread(target=lambda: print(sorted(os.sched_getaffinity(0)), flush=True))
    later.start(); later.join()
    before = os.sched_getaffinity(t.native_id)
    print(sorted(moved or ()), sorted(os.sched_getaffinity(0)), sorted(before))
print(sorted(os.sched_getaffinity(0)), sorted(os.sched_getaffinity(t.native_id)))
done.set(); t.join()
"""


@needs_two_cpus
def test_lbtune_keeps_itself_off_the_reserved_cpus_every_thread_of_it() -> None:
    """In a child (this test process stays where it is): a thread started before, the
    main thread and a thread started meanwhile all leave the reserved CPU, and the threads
    go back afterwards."""
    reserved = max(affinity.usable())
    out = subprocess.run(
        [sys.executable, "-c", KEPT_OFF, str(reserved)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.splitlines()
    rest, every = sorted(affinity.usable() - {reserved}), sorted(affinity.usable())
    assert out[0] == str(rest)  # started meanwhile
    assert out[1] == f"{rest} {rest} {rest}"  # yielded, main thread, started before
    assert out[2] == f"{every} {every}"  # put back


def test_nothing_reserved_leaves_the_process_as_it_is() -> None:
    before = affinity.usable()
    with affinity.kept_off(()) as moved:
        assert moved is None and affinity.usable() == before
