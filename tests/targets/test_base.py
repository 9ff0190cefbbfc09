"""The defaults of the balancer bases (lbtune.targets.targetbase) and the shared rules of
lbtune.targets.base, on a fake target.

Why a fake: every default here is policy over three files — the target's space file, the
last known good (``lkg/<name>.json``) and the feedback agent's settings — and over what
the subclass's ``apply``/``read_live`` report; none of it needs a running balancer. The fake
is the smallest concrete TargetBase (it keeps its "live" state in memory and records what
it was asked to apply), so each test can state exactly what the base must do. The real
targets run the same defaults against running balancers in ``test_contract.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from lbtune.agent.config import write_agent_file
from lbtune.errors import ApplyError, TargetError
from lbtune.metrics import promql
from lbtune.metrics.promql import BalancerSeries
from lbtune.records.endpoints import Endpoints
from lbtune.targets import balancer, names
from lbtune.targets.base import (
    ApplyResult,
    BalancerLaunch,
    LaunchSpec,
    ParamSet,
    Plan,
    RejectedBeforeApply,
    ScrapeJob,
    Supervisor,
    pool_names,
)
from lbtune.targets.lkg import LkgStore
from lbtune.targets.targetbase import BalancerBase, TargetBase
from tests.targets.test_haproxy_target import fake_endpoints

REPLICAS = ["r0", "r1"]
SPACE = {
    "target": "fake",
    "params": {
        "algorithm": {
            "type": "categorical",
            "choices": ["roundrobin", "leastconn"],
            "baseline": "roundrobin",
        },
        "weight": {"type": "int", "low": 0, "high": 256, "baseline": 100, "per_server": True},
    },
}


class FakeTarget(TargetBase):
    """Required hooks only: live state in memory, every apply recorded."""

    name = "fake"

    def __init__(self, state_dir: Path, agent_settings: Path | None = None) -> None:
        self.state_dir = state_dir
        self.space_file = state_dir / "space.yaml"
        self.space_file.write_text(yaml.safe_dump(SPACE), encoding="utf-8")
        self.agent_settings = agent_settings
        self.live: ParamSet = {}
        self.applied: list[tuple[ParamSet, bool]] = []

    def replica_names(self) -> list[str]:
        return REPLICAS

    def read_live(self) -> ParamSet:
        return self.space().complete({}, self.live)

    def apply(self, params: Mapping[str, object], *, check: bool = False) -> ApplyResult:
        checked = self.validate(params)
        self.applied.append((checked, check))
        if not check:
            self.live.update(checked)
        return ApplyResult(changed=True, applied=self.read_live(), check=check)


def _agent(tmp_path: Path, enabled: bool) -> Path:
    path = tmp_path / "agent.yaml"
    write_agent_file(path, {"enabled": enabled, "metrics_port": 1})
    return path


# --- rollback -----------------------------------------------------------------------------


def test_rollback_without_a_last_known_good_names_the_target_and_the_state_dir(
    tmp_path: Path,
) -> None:
    target = FakeTarget(tmp_path)
    with pytest.raises(ApplyError) as exc:
        target.rollback()
    assert str(exc.value) == f"No last known good recorded for fake in {tmp_path}"
    assert target.applied == []


@pytest.mark.parametrize("check", [False, True])
def test_rollback_reapplies_the_recorded_parameters(tmp_path: Path, check: bool) -> None:
    target = FakeTarget(tmp_path)
    good: ParamSet = {"algorithm": "leastconn", "weight.r0": 7, "weight.r1": 100}
    LkgStore(tmp_path, "fake").record(good, "file:good.yaml")
    result = target.rollback(check=check)
    assert target.applied == [(good, check)]
    assert result.check is check
    assert target.read_live()["algorithm"] == ("roundrobin" if check else "leastconn")


# --- who owns the weights -----------------------------------------------------------------


def test_without_an_agent_lbtune_owns_every_knob(tmp_path: Path) -> None:
    target = FakeTarget(tmp_path)
    assert not target.agent_owns_weights()
    assert target.owned_elsewhere() == frozenset()
    assert not any(s.fixed for s in target.space().params.values())
    assert target.validate({"weight.r0": 5}) == {"weight.r0": 5}
    assert target.replicas_out({"weight.r0": 0, "weight.r1": 3}) == {"r0"}


def test_while_the_agent_pushes_weights_they_are_its_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = FakeTarget(tmp_path, _agent(tmp_path, enabled=True))
    assert target.agent_owns_weights()
    assert target.owned_elsewhere() == {"weight.r0", "weight.r1"}
    space = target.space()
    assert space.params["weight.r0"].fixed and not space.params["algorithm"].fixed
    # Weight 0 is the agent's to set: not lbtune's to refuse.
    assert target.replicas_out({"weight.r0": 0, "weight.r1": 0}) == frozenset()
    with pytest.raises(RejectedBeforeApply, match=r"^weight\.r0: the feedback agent owns"):
        target.validate({"weight.r0": 5})
    assert target.applied == []
    with caplog.at_level(logging.WARNING):
        kept = target.validate({"weight.r0": 5, "algorithm": "leastconn"})
        target.validate({"weight.r1": 5, "algorithm": "leastconn"})
    assert kept == {"algorithm": "leastconn"}
    warnings = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    assert warnings == [
        "ignoring weight.r0: the feedback agent owns the per-server weights of this cluster"
    ]  # once per target


def test_an_observe_only_agent_leaves_the_weights_to_lbtune(tmp_path: Path) -> None:
    target = FakeTarget(tmp_path, _agent(tmp_path, enabled=False))
    assert not target.agent_owns_weights()
    assert target.owned_elsewhere() == frozenset()
    assert target.replicas_out({"weight.r1": 0}) == {"r1"}


def test_every_target_with_live_weights_follows_the_one_rule(tmp_path: Path) -> None:
    """The registry's own targets get the rule from the base: an agent settings file that
    pushes weights makes ``weight.*`` owned (no balancer is started: only the space is read)."""
    ep = fake_endpoints(tmp_path)
    settings = _agent(tmp_path, enabled=True)
    owned = ep.model_copy(update={"agent_config": str(settings)})
    target = balancer("haproxy").target(owned)
    assert target.agent_owns_weights()
    assert target.owned_elsewhere() == {f"weight.{r.name}" for r in ep.replicas}
    assert not balancer("haproxy").target(ep).agent_owns_weights()


# --- read-back ----------------------------------------------------------------------------


def test_read_back_names_every_knob_that_differs_but_owned_ones(tmp_path: Path) -> None:
    target = FakeTarget(tmp_path)
    target.live = {"algorithm": "leastconn", "weight.r0": 3}
    wanted: ParamSet = {"algorithm": "roundrobin", "weight.r0": 4, "weight.r1": 100}
    with pytest.raises(ApplyError) as exc:
        target.read_back(wanted, also=lambda: ["config file differs"])
    assert str(exc.value) == (
        "Read-back does not match what was applied: algorithm: wanted 'roundrobin', live "
        "'leastconn'; weight.r0: wanted 4, live 3; config file differs"
    )
    owned = FakeTarget(tmp_path, _agent(tmp_path, enabled=True))
    owned.live = {"weight.r0": 3}
    assert owned.read_back({"weight.r0": 4, "algorithm": "roundrobin"})["weight.r0"] == 3


# --- Plan: the two results of an apply ----------------------------------------------------


def test_a_plan_with_nothing_to_change_touches_nothing_and_says_so() -> None:
    live: ParamSet = {"a": 1}
    plan = Plan(live, dict(live), reload=True, began=0.0)
    assert not plan.changed and plan.diff == {}
    for check in (False, True):
        result = plan.untouched(check=check)
        assert (result.changed, result.reloaded, result.check) == (False, False, check)


def test_check_mode_reports_the_diff_and_the_reload_it_would_need() -> None:
    plan = Plan({"a": 1, "b": 2}, {"a": 1, "b": 3}, reload=True, began=0.0)
    result = plan.untouched(check=True)
    assert result.diff == {"b": (2, 3)} and result.applied == {"a": 1, "b": 3}
    assert result.changed and result.reloaded and result.check
    done = plan.done({"a": 1, "b": 3})
    assert done.changed and done.reloaded and not done.check and done.diff == {"b": (2, 3)}


def test_drift_of_the_files_is_a_change_without_a_diff() -> None:
    plan = Plan({"a": 1}, {"a": 1}, reload=False, began=0.0, drift=True)
    assert plan.changed and plan.diff == {}
    assert plan.untouched(check=False).applied == {"a": 1}


# --- BalancerBase -------------------------------------------------------------------------


class FakeBalancer(BalancerBase):
    """Required hooks only (never launched here)."""

    name = "fake"
    ansible_module = "lbtune_fake"
    test_preset = "mini2-fake"

    def launch(self, spec: LaunchSpec, supervisor: Supervisor) -> BalancerLaunch:
        raise NotImplementedError

    def scrape_jobs(self, spec: LaunchSpec) -> tuple[ScrapeJob, ...]:
        return ()

    def problems(self, endpoints: Endpoints) -> list[str]:
        return []

    def target(self, endpoints: Endpoints, *, space_file: Path | None = None) -> TargetBase:
        return FakeTarget(Path(endpoints.state_dir))


def test_the_balancer_defaults(tmp_path: Path) -> None:
    entry, ep = FakeBalancer(), fake_endpoints(tmp_path)
    assert entry.replica_header == "X-Lbtune-Replica" and not entry.live_weights
    assert entry.extra_ports == ()
    assert entry.replica_rows(ep) == [] and entry.series(ep) == BalancerSeries("fake")
    with pytest.raises(TargetError, match="fake takes no per-replica weights live"):
        entry.weights(ep)


@pytest.mark.parametrize("name", names())
def test_only_balancers_with_live_weights_give_them(name: str, tmp_path: Path) -> None:
    entry = balancer(name)
    assert isinstance(entry, BalancerBase)
    if not entry.live_weights:
        with pytest.raises(TargetError, match="no per-replica weights live"):
            entry.weights(fake_endpoints(tmp_path))


def test_haproxy_series_are_the_queries_the_summary_always_sent(tmp_path: Path) -> None:
    """HAProxy fills the run summary's balancer section from the same PromQL as before the
    section was balancer-neutral."""
    series = balancer("haproxy").series(fake_endpoints(tmp_path))
    q = promql.server_side_queries(30, balancer=series)
    assert q["balancer_queue_avg"] == (
        "sum by (proxy) (avg_over_time(haproxy_backend_current_queue[30s]))"
    )
    assert q["balancer_queue_max"] == (
        "max by (proxy) (max_over_time(haproxy_backend_current_queue[30s]))"
    )
    assert q["balancer_sessions_avg"] == (
        "sum by (server) (avg_over_time(haproxy_server_current_sessions[30s]))"
    )
    assert q["balancer_sessions_max"] == (
        "max by (server) (max_over_time(haproxy_server_current_sessions[30s]))"
    )
    assert q["balancer_responses"] == (
        "sum by (server, code) (increase(haproxy_server_http_responses_total[30s]))"
    )


def test_vllm_router_names_its_workers_as_replicas(tmp_path: Path) -> None:
    ep = fake_endpoints(tmp_path)
    series = balancer("vllm-router").series(ep)
    assert series.sessions == "vllm_router_running_requests" and series.server_label == "worker"
    assert dict(series.server_names) == {r.url.rstrip("/"): r.name for r in ep.replicas}
    assert series.queue is None and series.responses is None


# --- pool names ---------------------------------------------------------------------------


def test_model_names_become_unique_pool_names() -> None:
    assert pool_names(["a/b", "a_b", "all"]) == {
        "a/b": "model_a_b",
        "a_b": "model_a_b_2",
        "all": "model_all",
    }
    assert pool_names(["org/m:1", "org_m_1"]) == {
        "org/m:1": "model_org_m_1",
        "org_m_1": "model_org_m_1_2",
    }
