"""A run's generator processes, when the user did not choose them (lbtune.run.spread)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lbtune.run.plan import plan_run
from lbtune.run.spread import STREAMS_PER_PROCESS, peak_streams, spread, usable_cores
from lbtune.run.stress import StressOptions, run_stress
from tests.robustness.conftest import start_echo

SCENARIO = (
    "name: s\nduration_s: {d}\nwarmup_s: 0\nload: {load}\n"
    "models: {{echo: 1}}\nprompt_tokens: {{type: fixed, value: 8}}\n"
    "output_tokens: {{type: fixed, value: 4}}\n"
)


def _scenario(tmp_path: Path, load: str, d: float = 3) -> str:
    p = tmp_path / "s.yaml"
    p.write_text(SCENARIO.format(d=d, load=load))
    return str(p)


def test_one_process_up_to_its_streams_then_one_per_streams() -> None:
    assert spread(None, 8).workers == 0  # open loop: the in-flight cap decides
    assert spread(STREAMS_PER_PROCESS, 8).workers == 0
    two = spread(STREAMS_PER_PROCESS + 1, 8)
    assert two.workers == 2 and two.note is not None and "--workers 0" in two.note
    assert spread(4 * STREAMS_PER_PROCESS, 8).workers == 4


def test_too_few_cores_is_said_not_hidden() -> None:
    one = spread(2 * STREAMS_PER_PROCESS, 1)
    assert one.workers == 0 and one.note is not None and "one core" in one.note
    few = spread(8 * STREAMS_PER_PROCESS, 2)
    assert few.workers == 2 and few.note is not None and "8 would" in few.note
    assert "health" in few.note


def test_peak_streams_is_the_most_users_of_any_stage(tmp_path: Path) -> None:
    ramp = "{type: ramp, from: 600, to: 10, over: 2}"
    assert peak_streams(plan_run(StressOptions(scenario=_scenario(tmp_path, ramp)))) == 600
    const = plan_run(StressOptions(scenario=_scenario(tmp_path, "{type: constant, users: 3}")))
    assert peak_streams(const) == 3
    assert peak_streams(plan_run(StressOptions(scenario="chat", rate=5.0))) is None


@pytest.mark.timeout(120)
def test_a_run_beyond_one_process_is_spread_and_says_so(tmp_path: Path) -> None:
    users = STREAMS_PER_PROCESS + 44
    echo, url = start_echo("--ttft", "0.02", "--itl", "0.005")
    said: list[str] = []
    try:
        opts = StressOptions(
            scenario=_scenario(tmp_path, f"{{type: constant, users: {users}}}", d=3),
            target_url=url,
            out_dir=tmp_path / "run",
            write_report=False,
        )
        result = run_stress(opts, say=said.append)
    finally:
        echo.terminate()
        echo.wait(timeout=10)
    expected = spread(users, usable_cores())
    assert result.summary.generator.processes == max(1, expected.workers)
    assert expected.note is not None and expected.note in said
    assert result.load.sent > users  # every process sent
    assert len({r.worker for r in _records(result.records_path)}) == max(1, expected.workers)


def _records(path: Path) -> list:  # type: ignore[type-arg]
    from lbtune.loadgen.recordio import read_records

    return read_records(path)


def test_the_cores_counted_are_the_generators_when_it_is_pinned() -> None:
    assert usable_cores({0, 3}) == 2  # off a cluster's pinned servers (lbtune.run.target)
    assert usable_cores() == usable_cores(None) == len(os.sched_getaffinity(0))
