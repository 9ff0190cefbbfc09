"""A search's level as a load: closed-loop users or an open-loop rate (no cluster: the
stress options the probes would run, and their plan); the figures per replica a twin probe
and a live one (its stress run stood in for) fill from their records."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from lbtune.capacity import probes as probe_module
from lbtune.capacity.probes import (
    LiveProbe,
    Probes,
    ProbeShape,
    TwinCase,
    TwinProbe,
    load_at,
    probe_dir,
)
from lbtune.metrics.stats import summarize
from lbtune.metrics.summary import RunSummary, Window
from lbtune.records.slo import Slo
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions
from lbtune.targets.haproxy.twin import routing_model
from lbtune.twin.options import TwinOptions
from tests.metrics.records import rec
from tests.twin.helpers import cluster_replicas, scenario_file


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


def test_a_twin_probe_fills_its_figures_per_replica(tmp_path: Path) -> None:
    reps = cluster_replicas("hetero4")
    case = TwinCase(
        reps,
        lambda plan: routing_model({"algorithm": "roundrobin"}, reps, seed=plan.seed),
        TwinOptions(),
    )
    base = StressOptions(scenario=str(scenario_file(tmp_path)), duration_s=12)
    got = TwinProbe(Probes(base, ProbeShape(), "users"), Slo(ttft_s=1.0), case)(4.0)
    names = {r.replica for r in got.replicas}
    assert len(names) >= 2 and names <= {r.name for r in reps}
    assert sum(r.judged for r in got.replicas) == got.judged > 0
    assert sum(r.met for r in got.replicas) == got.met


@dataclass(frozen=True)
class _Plan:
    window: tuple[float, float]

    def measured(self) -> tuple[float, float]:
        return self.window


@dataclass(frozen=True)
class _Stress:
    """What a live probe reads of a stress run's result."""

    summary: RunSummary
    records_path: Path
    plan: _Plan


def test_a_live_probe_fills_its_figures_per_replica_from_the_runs_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    window = (10.0, 20.0)
    records = [
        *(rec(i, sent=10.0 + i, ttft=0.1, e2e=0.5, replica="a") for i in range(4)),
        *(rec(4 + i, sent=14.0 + i, ttft=2.0, e2e=2.5, replica="b") for i in range(4)),
        rec(8, sent=19.0, replica=None),
        rec(9, sent=25.0, replica="c"),  # after the window
    ]
    summary = summarize(records, run_start=0.0, window=Window(*window), scenario="s", target="t")
    result = _Stress(summary, tmp_path / "requests.jsonl", _Plan(window))
    monkeypatch.setattr(probe_module, "run_stress", lambda opts, say: result)
    monkeypatch.setattr(probe_module, "read_records", lambda path: records)
    live = LiveProbe(
        Probes(StressOptions(scenario="chat"), ProbeShape()), Slo(ttft_s=1.0), tmp_path
    )
    got = live(2.0)
    assert (got.met, got.judged) == (5, 9)
    a, b = got.replicas
    assert (a.replica, a.met, a.judged, b.replica, b.met, b.judged) == ("a", 4, 4, "b", 0, 4)
