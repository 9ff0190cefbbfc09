"""The generator processes of a run (:mod:`lbtune.loadgen.children`) start on the CPUs
their settings give (off a cluster's pinned servers), and still die with the runner."""

from __future__ import annotations

import queue
import sys
from pathlib import Path
from typing import Any

import pytest

from lbtune.loadgen import children
from lbtune.loadgen.children import Child, start_children
from lbtune.loadgen.settings import GeneratorSettings, SourceSettings
from lbtune.process import affinity

REPORT = (
    "import json, os; "
    "print(json.dumps({'type': 'cpus', 'cpus': sorted(os.sched_getaffinity(0)), "
    "'ppid': os.getppid()}), flush=True)"
)


def _report(tmp_path: Path, cpus: set[int] | None) -> dict[str, Any]:
    lines: queue.Queue[Any] = queue.Queue()
    child = Child("probe", [sys.executable, "-c", REPORT], tmp_path / "probe.log", lines, cpus)
    try:
        name, msg = lines.get(timeout=10)
    finally:
        child.proc.wait(timeout=10)
        child.finish()
    assert name == "probe" and child.proc.returncode == 0
    return dict(msg)


@pytest.mark.skipif(
    len(affinity.usable()) < 2,
    reason="pinning to a subset needs at least 2 CPUs this process may use",
)
def test_a_generator_process_starts_on_its_cpus(tmp_path: Path) -> None:
    one = min(affinity.usable())
    assert _report(tmp_path, {one})["cpus"] == [one]
    assert _report(tmp_path, None)["cpus"] == sorted(affinity.usable())


def test_every_generator_process_of_a_run_gets_the_settings_cpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[tuple[str, Any]] = []

    def fake_child(name: str, argv: list[str], log: Path, lines: Any, cpus: Any = None) -> str:
        made.append((name, cpus))
        return name

    monkeypatch.setattr(children, "Child", fake_child)
    settings = GeneratorSettings(
        target_url="http://127.0.0.1:9",
        records_dir=str(tmp_path),
        source=SourceSettings(scenario="chat", duration_s=1),
        grace_s=1,
        request_timeout_s=10,
        replica_header="X-Lbtune-Replica",
        max_in_flight=10,
        master_port=5557,
        expect_workers=2,
        cpus=(0,),
    )
    start_children("master", 2, settings, tmp_path / "load-config.json", queue.Queue())
    assert made == [("master", (0,)), ("w0", (0,)), ("w1", (0,))]
