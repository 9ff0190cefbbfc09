"""What ``lbtune apply`` must never do: take a served model out of service, apply a file
written for another target, or explain a failure with a contradiction (issue 16: #1, #2,
#10, #14).

Each cluster-backed case runs against every registered target that can express it (the
target's own test preset), and asserts that a refused set touched nothing: the live
parameters and the last known good are what they were.
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lbtune.apply import apply_params
from lbtune.apply.host import HostRequest, run_on_host
from lbtune.apply.paramfile import read_params_for
from lbtune.apply.runner import PlaybookRun, check_inventory
from lbtune.apply.serving import models_without_replica
from lbtune.cluster import api
from lbtune.errors import ConfigError
from lbtune.process.probes import http_get
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import StatePaths, read_endpoints, write_endpoints
from lbtune.targets import get_target
from lbtune.targets.base import zero_weight_replicas
from lbtune.targets.lkg import LkgStore
from lbtune.targets.targetbase import TargetBase
from tests.robustness.conftest import run_cli

# --- pure: the rule and the messages ------------------------------------------------------


def test_a_model_whose_every_replica_is_out_is_named() -> None:
    replicas = {"a": ["m8", "m70"], "b": ["m8"]}
    assert models_without_replica(replicas, frozenset({"a"})) == {"m70": ["a"]}
    assert models_without_replica(replicas, frozenset({"b"})) == {}
    assert models_without_replica(replicas, frozenset({"a", "b"})) == {
        "m70": ["a"],
        "m8": ["a", "b"],
    }


def test_zero_weight_means_out_and_nothing_else_does() -> None:
    params = {"weight.a": 0, "weight.b": 1, "maxconn.a": 0, "weighted": 0, "weight.c": False}
    assert zero_weight_replicas(params) == frozenset({"a"})


def test_a_file_for_another_target_is_refused_in_one_line(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("target: vllm-router\nparams:\n  policy: round_robin\n")
    with pytest.raises(ConfigError) as exc:
        read_params_for(f, "haproxy")
    assert "'vllm-router'" in str(exc.value) and "'haproxy'" in str(exc.value)
    assert "\n" not in str(exc.value)
    assert read_params_for(f, "vllm-router") == {"policy": "round_robin"}


def test_flat_file_target_key(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("target: haproxy\nweight.a: 5\n")
    assert read_params_for(f, "haproxy") == {"weight.a": 5}
    with pytest.raises(ConfigError, match="written for target 'haproxy'"):
        read_params_for(f, "nginx")


@pytest.mark.parametrize("value", ["7", "[1, 2]", "hello", "null"])
def test_params_that_is_not_a_mapping_says_so(tmp_path: Path, value: str) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(f"target: haproxy\nparams: {value}\n")
    with pytest.raises(ConfigError) as exc:
        read_params_for(f, "haproxy")
    assert "params: must be a mapping" in str(exc.value)
    assert "unknown knob" not in str(exc.value)


def test_a_missing_inventory_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        check_inventory(tmp_path / "nope.yml")


def test_a_binary_inventory_is_named(tmp_path: Path) -> None:
    f = tmp_path / "inv.yml"
    f.write_bytes(b"\x7fELF\x00\x01\xff\xfe" * 20)
    with pytest.raises(ConfigError, match="not a text file"):
        check_inventory(f)
    check_inventory(tmp_path)  # a directory inventory is Ansible's to read


def test_a_play_that_ran_on_no_host_does_not_say_successful(tmp_path: Path) -> None:
    run = PlaybookRun("target-apply.yml", 0, "successful", [], tmp_path / "x.log", 0.1, "inv.yml")
    assert not run.ok
    msg = run.failure()
    assert "successful" not in msg and "rc 0" not in msg
    assert "no host of the inventory inv.yml ran the play" in msg


# --- every target: a set that leaves a model unserved is refused ---------------------------


def _target(ep: Endpoints) -> TargetBase:
    return get_target(ep.balancer, ep)


def _snapshot(t: TargetBase) -> tuple[Any, Any]:
    lkg = LkgStore(t.state_dir, t.name).get()
    return t.read_live(), None if lkg is None else lkg.sha256


def _all_out(t: TargetBase) -> dict[str, object]:
    """Every per-replica knob of the space at the value that takes its replica out."""
    out = {k: 0 for k in t.space().params if k.startswith("weight.")}
    if not out or not t.replicas_out(t.space().complete(out, t.read_live())):
        pytest.skip(f"{t.name}: no knob takes a replica out of rotation")
    return dict(out)


@pytest.mark.integration
@pytest.mark.parametrize("check", [True, False], ids=["check", "apply"])
def test_all_replicas_out_is_refused_before_anything_is_touched(
    deployed: Endpoints, check: bool
) -> None:
    t = _target(deployed)
    params = _all_out(t)
    apply_params(t, {}, via="direct")  # a baseline LKG exists
    before = _snapshot(t)
    with pytest.raises(ConfigError, match="no replica able to take traffic"):
        apply_params(t, params, via="direct", check=check)
    assert _snapshot(t) == before


@pytest.mark.integration
def test_the_only_replica_of_one_model_out_is_refused(deployed: Endpoints) -> None:
    by_model: dict[str, list[str]] = {}
    for r in deployed.replicas:
        for m in r.models:
            by_model.setdefault(m, []).append(r.name)
    only = next((names[0] for names in by_model.values() if len(names) == 1), None)
    t = _target(deployed)
    if only is None or f"weight.{only}" not in t.space().params:
        pytest.skip("every model has two replicas here, or no weight knob")
    before = _snapshot(t)
    with pytest.raises(ConfigError, match="no replica able to take traffic"):
        apply_params(t, {f"weight.{only}": 0}, via="direct")
    assert _snapshot(t) == before


@pytest.mark.integration
def test_an_apply_is_verified_by_a_real_request_per_model(deployed: Endpoints) -> None:
    t = _target(deployed)
    models = {m for r in deployed.replicas for m in r.models}
    before = _served(deployed)
    apply_params(t, {}, via="direct")  # changes nothing: only the verification requests
    after = _served(deployed)
    assert {m for m in models if after.get(m, 0) > before.get(m, 0)} == models


def _served(ep: Endpoints) -> dict[str, float]:
    """Model -> requests its replicas finished, from their own /metrics."""
    out: dict[str, float] = {}
    pattern = re.compile(r'^vllm:request_success_total\{[^}]*model_name="([^"]+)"[^}]*\} (\S+)$')
    for r in ep.replicas:
        status, body = http_get(r.url + "/metrics", timeout=5)
        assert status == 200
        for line in body.decode().splitlines():
            if m := pattern.match(line):
                out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


# --- the CLI on a running HAProxy cluster ---------------------------------------------------


@pytest.fixture(scope="module")
def haproxy_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if shutil.which("haproxy") is None:
        pytest.skip("haproxy is needed")
    state = tmp_path_factory.mktemp("safety-cli")
    try:
        api.up("mini2", state)
        yield state
    finally:
        api.down(state)


def _cli_snapshot(state: Path) -> tuple[str, Any]:
    ep = read_endpoints(StatePaths(state))
    assert ep is not None
    return (state / "haproxy.cfg").read_text(), _snapshot(_target(ep))


@pytest.mark.integration
def test_cli_refuses_a_file_for_another_target(haproxy_state: Path, tmp_path: Path) -> None:
    f = tmp_path / "router.yaml"
    f.write_text("target: vllm-router\nparams:\n  algorithm: leastconn\n")
    before = _cli_snapshot(haproxy_state)
    r = run_cli(
        "apply",
        "--target",
        "haproxy",
        "--params",
        str(f),
        "--direct",
        "--state-dir",
        str(haproxy_state),
    )
    assert r.rc == 2, r.stderr
    assert len(r.lines()) == 1 and "vllm-router" in r.stderr and "Traceback" not in r.stderr
    assert _cli_snapshot(haproxy_state) == before


@pytest.mark.integration
def test_cli_says_params_must_be_a_mapping(haproxy_state: Path, tmp_path: Path) -> None:
    f = tmp_path / "seven.yaml"
    f.write_text("target: haproxy\nparams: 7\n")
    before = _cli_snapshot(haproxy_state)
    r = run_cli("apply", "--params", str(f), "--direct", "--state-dir", str(haproxy_state))
    assert r.rc == 2, r.stderr
    assert len(r.lines()) == 1 and "params: must be a mapping" in r.stderr
    assert "unknown knob" not in r.stderr
    assert _cli_snapshot(haproxy_state) == before


@pytest.mark.integration
def test_cli_refuses_all_weights_zero(haproxy_state: Path, tmp_path: Path) -> None:
    f = tmp_path / "zero.yaml"
    f.write_text("weight.h100-0: 0\nweight.l4-0: 0\n")
    before = _cli_snapshot(haproxy_state)
    for extra in (["--check"], []):
        r = run_cli(
            "apply", "--params", str(f), "--direct", "--state-dir", str(haproxy_state), *extra
        )
        assert r.rc == 2, r.stderr
        assert len(r.lines()) == 1 and "no replica able to take traffic" in r.stderr
    assert _cli_snapshot(haproxy_state) == before


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["missing", "binary"])
def test_cli_names_a_bad_inventory(haproxy_state: Path, tmp_path: Path, kind: str) -> None:
    inv = tmp_path / "inv.yml"
    if kind == "binary":
        inv.write_bytes(bytes(range(256)) * 8)
    f = tmp_path / "p.yaml"
    f.write_text("algorithm: leastconn\n")
    before = _cli_snapshot(haproxy_state)
    r = run_cli("apply", "--params", str(f), "-i", str(inv), "--state-dir", str(haproxy_state))
    assert r.rc == 2, r.stderr
    assert len(r.lines()) == 1 and "successful" not in r.stderr and str(inv) in r.stderr
    assert _cli_snapshot(haproxy_state) == before


# --- HAProxy: a dead replica's requests go to the live one ---------------------------------


def _post(url: str, body: dict[str, object]) -> tuple[int, str | None]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with opener.open(req, timeout=60) as resp:
            resp.read()
            return int(resp.status), resp.headers.get("X-Lbtune-Replica")
    except urllib.error.HTTPError as exc:
        return int(exc.code), None


@pytest.mark.integration
def test_haproxy_sends_a_dead_replicas_requests_to_the_live_one(tmp_path: Path) -> None:
    if shutil.which("haproxy") is None:
        pytest.skip("haproxy is needed")
    state = tmp_path / "state"
    try:
        ep = api.up("mini2", state)
        victim = next(r for r in ep.replicas if r.name == "l4-0")
        status, _ = _post(victim.url + "/admin/crash", {})
        assert status == 200
        body = {
            "model": "llama-3.1-8b-instruct",
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}],
        }
        got = [_post(ep.balancer_url + "/v1/chat/completions", body) for _ in range(20)]
    finally:
        api.down(state)
    assert got == [(200, "h100-0")] * 20


def test_the_ansible_module_refuses_on_the_host_too(tmp_path: Path) -> None:
    """A remote host checks against its own model -> replicas map (the controller may
    have none)."""
    from tests.apply.test_host import FakeTarget
    from tests.targets.test_haproxy_target import fake_endpoints

    ep = fake_endpoints(tmp_path)
    write_endpoints(StatePaths(tmp_path), ep)
    fake = FakeTarget(tmp_path)
    zero = {f"weight.{r.name}": 0 for r in ep.replicas}
    req = HostRequest(target="haproxy", state_dir=tmp_path, params=zero)
    with pytest.raises(ConfigError, match="no replica able to take traffic"):
        run_on_host(req, lambda ep, options: fake)
    assert fake.calls == []
    run_on_host(
        HostRequest(target="haproxy", state_dir=tmp_path, params={**zero, "weight.l4-0": 1}),
        lambda ep, options: fake,
    )
    assert fake.calls == ["apply check=False"]
