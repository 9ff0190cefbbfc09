"""What every target's Ansible module runs on a host (lbtune.apply.host), with a fake target."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from lbtune.apply.host import HostRequest, MakeTarget, module_result, run_on_host
from lbtune.errors import ConfigError, TargetError
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import StatePaths, write_endpoints
from lbtune.targets.base import ApplyResult, ParamSet
from lbtune.targets.lkg import LkgStore
from lbtune.targets.space import ParameterSpace, SpaceFile
from lbtune.targets.targetbase import TargetBase
from tests.targets.test_haproxy_target import fake_endpoints

SPACE = SpaceFile.model_validate(
    {
        "target": "haproxy",
        "params": {
            "algorithm": {
                "type": "categorical",
                "choices": ["roundrobin", "leastconn"],
                "baseline": "roundrobin",
            },
            "weight": {"type": "int", "low": 0, "high": 256, "baseline": 100, "per_server": True},
            "a": {"type": "int", "low": 0, "high": 10, "baseline": 0},
        },
    }
)


class FakeTarget(TargetBase):
    """A :class:`~lbtune.targets.targetbase.TargetBase` that records its calls and touches
    nothing (its ``replicas_out`` and ``owned_elsewhere`` are the base's)."""

    name = "haproxy"

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.calls: list[str] = []
        self.fake_space = ParameterSpace.from_file(SPACE, self.replica_names())

    def replica_names(self) -> list[str]:
        return ["h100-0", "a100-0", "l4-0"]

    def validate(self, params: Mapping[str, object]) -> ParamSet:
        return {k: v for k, v in params.items() if isinstance(v, int | float | str | bool)}

    def space(self) -> ParameterSpace:
        return self.fake_space

    def read_live(self) -> ParamSet:
        return {}

    def apply(self, params: Mapping[str, object], *, check: bool = False) -> ApplyResult:
        self.calls.append(f"apply check={check}")
        return ApplyResult(changed=True, applied=self.validate(params), diff={}, check=check)

    def rollback(self, *, check: bool = False) -> ApplyResult:
        self.calls.append(f"rollback check={check}")
        lkg = LkgStore(self.state_dir, self.name).get()
        assert lkg is not None
        return ApplyResult(changed=True, applied=dict(lkg.params), check=check)


@pytest.fixture
def host(tmp_path: Path) -> tuple[Endpoints, FakeTarget]:
    ep = fake_endpoints(tmp_path)
    write_endpoints(StatePaths(tmp_path), ep)
    return ep, FakeTarget(tmp_path)


def make(fake: FakeTarget) -> MakeTarget:
    return lambda ep, options: fake


def test_apply_and_check_call_the_targets_apply(
    host: tuple[Endpoints, FakeTarget], tmp_path: Path
) -> None:
    _, fake = host
    req = HostRequest(target="haproxy", state_dir=tmp_path, params={"algorithm": "leastconn"})
    done = run_on_host(req, make(fake))
    assert done.applied == {"algorithm": "leastconn"}
    run_on_host(HostRequest("haproxy", tmp_path, {"a": 1}, check=True), make(fake))
    assert fake.calls == ["apply check=False", "apply check=True"]
    assert module_result(done)["diff"] == {} and module_result(done)["check"] is False


def test_rollback_makes_the_controllers_lkg_the_hosts_and_calls_target_rollback(
    host: tuple[Endpoints, FakeTarget], tmp_path: Path
) -> None:
    _, fake = host
    good = {"algorithm": "roundrobin", "weight.l4-0": 100}
    back = run_on_host(HostRequest("haproxy", tmp_path, good, rollback=True), make(fake))
    assert fake.calls == ["rollback check=False"] and back.applied == good
    store = LkgStore(tmp_path, "haproxy")
    assert store.get() is not None and len(store.history()) == 1
    run_on_host(HostRequest("haproxy", tmp_path, good, rollback=True), make(fake))
    assert len(store.history()) == 1  # the same set is not recorded twice


def test_the_wrong_balancer_or_no_cluster_is_refused(
    host: tuple[Endpoints, FakeTarget], tmp_path: Path
) -> None:
    _, fake = host
    with pytest.raises(ConfigError, match="runs haproxy, not envoy"):
        run_on_host(HostRequest("envoy", tmp_path, {}), make(fake))
    with pytest.raises(TargetError, match=r"no endpoints\.json"):
        run_on_host(HostRequest("haproxy", tmp_path / "nowhere", {}), make(fake))
    assert fake.calls == []
