"""The cluster's keeper (:mod:`lbtune.cluster.keeper`) relaunches a dead balancer by itself.

Issue 29 (item 5): before, a killed HAProxy stayed down until someone ran ``cluster up``.
Here a real mini2 cluster's HAProxy master gets SIGKILL and, with nobody asking, the
balancer must serve again on its last known good (not on the baseline it was launched
with), the keeper's log must say so, and ``down`` must leave nothing running, the keeper
included (~10 s); so must Envoy, nginx and vllm-router, through the same path (~8 s each).
The cheap tests check, on stand-in processes, what keeps it from
fighting: the heal lock, the second look, ``down``'s order, and that it ends with its
cluster or at SIGTERM (~3 s in all).
"""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from lbtune.cluster import api, heal, keeper
from lbtune.cluster.config import load_config
from lbtune.process import supervisor
from lbtune.process.locks import pid_lock
from lbtune.process.supervisor import ProcessRecord
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import AGENT, KEEPER, SIM, StatePaths, write_endpoints
from tests.cluster.conftest import M8, alive, chat, mini_config, needs_binaries, started_pids

SLEEPER = ["sleep", "60"]


def _wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    """Poll ``check`` every 0.1 s until it holds; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.1)


def _record(paths: StatePaths, name: str) -> ProcessRecord:
    rec = supervisor.read_record(paths, name)
    assert rec is not None, f"no {name}.pid in {paths.root}"
    return rec


# ---------------------------------------------------------------------------------------
# The keeper's own rules, on stand-in processes (no balancer binary needed).


def test_the_backoff_waits_longer_after_each_failure_and_gives_up() -> None:
    b = keeper.Backoff(pause_s=2.0, max_failures=3, max_relaunches=10, window_s=600.0)
    assert b.record(0.0, ok=False) is None and b.not_before == 2.0
    assert not b.ready(1.9) and b.ready(2.0)
    assert b.record(2.0, ok=False) is None and b.not_before == 2.0 + 4.0
    assert b.record(6.0, ok=True) is None and b.not_before == 6.0  # a success resets it
    assert b.record(7.0, ok=False) is None
    assert b.record(9.0, ok=False) is None
    assert b.record(13.0, ok=False) == "3 relaunches in a row failed"
    many = keeper.Backoff(max_relaunches=3, window_s=60.0)
    assert many.record(0.0, ok=True) is None and many.record(30.0, ok=True) is None
    assert many.record(61.0, ok=True) is None  # the first one left the window
    reason = many.record(62.0, ok=True)
    assert reason is not None and "keeps dying" in reason


def _endpoints(paths: StatePaths) -> Endpoints:
    url = "http://127.0.0.1:9"
    return Endpoints(
        config_name="t",
        config_path="-",
        state_dir=str(paths.root),
        balancer="haproxy",
        balancer_url=url,
        stats_url=url,
        balancer_metrics_url=url,
        balancer_components=["haproxy"],
        balancer_jobs=["haproxy"],
        balancer_details={},
        replica_header=None,
        prometheus_url=url,
        exporter_port=9,
        exporter_url=url,
        prometheus_yml="-",
        replicas=[],
        time_scale=1.0,
        ground_truth_path=None,
    )


@pytest.fixture
def stand_in(tmp_path: Path) -> StatePaths:
    """A state dir whose cluster is a sleeping "sim" and whose endpoints name HAProxy."""
    paths = StatePaths(tmp_path / "state")
    paths.create()
    write_endpoints(paths, _endpoints(paths))
    supervisor.start(SIM, SLEEPER, paths)
    return paths


def _dead_haproxy(paths: StatePaths) -> ProcessRecord:
    rec = supervisor.start("haproxy", ["true"], paths)
    _wait_for("`true` exits", lambda: not supervisor.alive(rec), 5)
    return rec


def test_the_keeper_heals_only_on_a_second_look_and_never_while_a_heal_holds_the_lock(
    stand_in: StatePaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = stand_in
    healed: list[list[int]] = []
    monkeypatch.setattr(
        heal, "heal_balancer", lambda ep, p, dead, say, t: healed.append([r.pid for r in dead])
    )
    own = ProcessRecord(KEEPER, os.getpid(), 0.0, [sys.executable], str(paths.log(KEEPER)))
    paths.pid_file(KEEPER).write_text(own.to_json())
    said: list[str] = []
    k = keeper.Keeper(paths, said.append)
    try:
        dead = _dead_haproxy(paths)
        assert k.look() is None and healed == []  # seen dead once: maybe a restart's instant
        with pid_lock(paths.heal_lock, AssertionError):  # `up` (or another keeper) heals
            assert k.look() is None and healed == []
        assert k.look() is None and healed == [[dead.pid]]
    finally:
        paths.pid_file(KEEPER).unlink()  # names this process: not for `down` to stop
        api.down(paths.root)


def test_down_stops_the_keeper_first_then_the_agent_even_after_a_relaunch(
    stand_in: StatePaths,
) -> None:
    """After a relaunch the balancer is the newest process: reverse start order alone
    would stop it while the keeper still watches (and would relaunch it)."""
    paths = stand_in
    for name in (AGENT, KEEPER, "haproxy"):  # a relaunched HAProxy: newer than the keeper
        supervisor.start(name, SLEEPER, paths)
        time.sleep(0.02)  # distinct create times
    said: list[str] = []
    stopped = api.down(paths.root, progress=said.append)
    assert list(stopped) == [KEEPER, AGENT, "haproxy", SIM]
    assert [m.split()[1] for m in said] == [KEEPER, AGENT, "haproxy", SIM]


@pytest.mark.parametrize("how", ["down removes its PID file", "SIGTERM"])
def test_the_keeper_exits_with_its_cluster_and_at_sigterm(stand_in: StatePaths, how: str) -> None:
    paths = stand_in
    rec = keeper.start(paths)
    log = paths.log(KEEPER)
    try:
        _wait_for("the keeper starts", lambda: "keeping the balancer" in log.read_text(), 30)
        t0 = time.monotonic()
        if how == "SIGTERM":
            os.kill(rec.pid, signal.SIGTERM)
        else:
            paths.pid_file(KEEPER).unlink()
        _wait_for("the keeper exits", lambda: not supervisor.alive(rec), 5)
        took = time.monotonic() - t0
    finally:
        api.down(paths.root)
    text = log.read_text()
    assert ("SIGTERM: the keeper exits" if how == "SIGTERM" else "no longer names it") in text
    assert took < 3.0, text


# ---------------------------------------------------------------------------------------
# The real thing: a SIGKILLed HAProxy comes back on its last known good, unasked.


@pytest.mark.integration
@pytest.mark.timeout(120)
@needs_binaries
def test_the_keeper_relaunches_a_killed_haproxy_on_its_last_known_good(tmp_path: Path) -> None:
    from lbtune.apply import apply_params
    from lbtune.targets.haproxy.target import HaproxyTarget

    state = tmp_path / "state"
    paths = StatePaths(state)
    pids: list[int] = []
    try:
        ep = api.up(mini_config(), state)
        assert HaproxyTarget(ep).read_live()["algorithm"] != "leastconn"  # not the baseline
        good = apply_params(HaproxyTarget(ep), {"algorithm": "leastconn"}, via="direct").lkg
        assert good is not None
        killed = _record(paths, "haproxy")
        os.kill(killed.pid, signal.SIGKILL)
        t0 = time.monotonic()
        log = paths.log(KEEPER)
        _wait_for(
            "the keeper says it relaunched HAProxy",
            lambda: "haproxy relaunched" in log.read_text(),
            30,
        )
        took = time.monotonic() - t0
        now = _record(paths, "haproxy")
        assert now.pid != killed.pid and supervisor.alive(now)
        api.check_balancer(ep)
        with urllib.request.urlopen(f"{ep.balancer_url}/v1/models", timeout=5) as resp:
            assert resp.status == 200
        live = HaproxyTarget(ep).read_live()
        assert {k: live[k] for k in good.params} == good.params, (live, good)
        text = log.read_text()
        assert f"haproxy pid {killed.pid} gone" in text and "relaunching it" in text, text
        assert "back on its last known good" in text and good.sha256[:12] in text, text
        assert api.status(state).healthy
        pids = [*started_pids(state), _record(paths, KEEPER).pid]
        assert psutil.Process(_record(paths, KEEPER).pid).is_running()
    finally:
        api.down(state)
    assert pids and not [p for p in pids if alive(p)]
    assert not list(state.glob("*.pid"))
    print(f"HAProxy served again {took:.1f} s after its SIGKILL")


@pytest.mark.integration
@pytest.mark.timeout(120)
@needs_binaries
@pytest.mark.parametrize("preset", ["mini2-envoy", "mini2-nginx", "mini2-router"])
def test_the_keeper_relaunches_any_embedded_balancer(tmp_path: Path, preset: str) -> None:
    """Nothing in the keeper names a balancer: each comes back the same way."""
    state = tmp_path / "state"
    paths = StatePaths(state)
    pids: list[int] = []
    try:
        ep = api.up(load_config(preset)[0], state)
        killed = _record(paths, ep.balancer_components[0])
        os.kill(killed.pid, signal.SIGKILL)
        log = paths.log(KEEPER)
        _wait_for(
            f"the keeper says it relaunched {ep.balancer}",
            lambda: f"{ep.balancer} relaunched" in log.read_text(),
            30,
        )
        api.check_balancer(ep)
        assert chat(ep.balancer_url, M8).status_code == 200
        assert api.status(state).healthy, api.status(state).problems
        pids = started_pids(state)
    finally:
        api.down(state)
    assert pids and not [p for p in pids if alive(p)]
