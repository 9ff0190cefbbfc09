"""A search's level as a load: closed-loop users or an open-loop rate (no cluster: the
stress options the probes would run, and their plan)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtune.capacity.probes import Probes, ProbeShape, load_at, probe_dir
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions


def test_a_users_level_is_a_closed_loop_of_that_many_users() -> None:
    at = load_at(StressOptions(scenario="chat", rate=3.0), 24.0, "users")
    assert at.users == 24 and at.rate is None
    load = plan_run(at).load
    assert load.mode == "closed" and load.users == 24


def test_a_rate_level_is_an_open_loop_at_that_rate() -> None:
    at = load_at(StressOptions(scenario="chat", users=8), 2.5, "req/s")
    assert at.rate == 2.5 and at.users is None
    assert plan_run(at).load.mode == "open"


@pytest.mark.parametrize("level", [2.5, 0.0])
def test_a_fractional_or_empty_user_count_is_refused(level: float) -> None:
    with pytest.raises(ValueError, match="whole count >= 1"):
        load_at(StressOptions(scenario="chat"), level, "users")


def test_closed_loop_probes_run_users_for_the_scenarios_duration() -> None:
    probes = Probes(StressOptions(scenario="chat", seed=5), ProbeShape(max_duration_s=45), "users")
    first, second = probes.next(12.0, Path("p1")), probes.next(13.0)
    assert (first.users, first.rate, second.users) == (12, None, 13)
    assert first.duration_s == 45.0  # chat lasts 60 s, the probe at most 45
    assert (first.seed, second.seed) == (5, 6)
    assert first.out_dir == Path("p1") and not first.strict
    assert plan_run(second).load.mode == "closed"


def test_open_loop_probes_last_long_enough_for_their_samples() -> None:
    probes = Probes(StressOptions(scenario="chat"), ProbeShape(samples=200, max_duration_s=120))
    opts = probes.next(2.0)
    assert opts.rate == 2.0 and opts.users is None
    assert opts.duration_s == 10 + 5 + 200 / 2.0  # chat's warm-up and cool-down, 100 s


def test_probe_directories_name_their_unit(tmp_path: Path) -> None:
    assert probe_dir(tmp_path, 3, 24.0, "users").name == "probe-03-24users"
    assert probe_dir(tmp_path, 4, 12.5).name == "probe-04-12.5rps"
