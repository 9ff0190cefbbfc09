"""``api.check_balancer`` on a real HAProxy whose worker crashes.

What a study saw: HAProxy 2.6's worker segfaulted and its master, on exit-on-failure,
stopped everything; the study then failed every remaining trial. Here a mini2 cluster's
HAProxy worker gets SIGSEGV (the same exit) and the check must name the dead balancer,
its exit and its log, while it stays silent as long as HAProxy runs. ~10 s.

The cluster's keeper would relaunch the balancer a second or two after it died
(tests/cluster/test_keeper.py): these tests stop it first, to see the dead balancer as
a study sees it before the keeper's relaunch, and ``up``'s own heal (as after the keeper
gave up).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from lbtune.cluster import api
from lbtune.errors import BalancerDown
from lbtune.process import supervisor
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import KEEPER, StatePaths
from tests.cluster.conftest import mini_config, needs_binaries

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120), needs_binaries]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Endpoints]:
    try:
        yield api.up(mini_config(), tmp_path / "state")
    finally:
        api.down(tmp_path / "state")


def _stop_keeper(state_dir: str | Path) -> None:
    paths = StatePaths(Path(state_dir))
    rec = supervisor.read_record(paths, KEEPER)
    assert rec is not None and supervisor.alive(rec), "up started the cluster's keeper"
    supervisor.stop(rec, paths)


def test_a_crashed_haproxy_is_named_and_a_running_one_is_not(cluster: Endpoints) -> None:
    api.check_balancer(cluster)  # running: silent
    _stop_keeper(cluster.state_dir)
    (rec,) = [
        r for r in supervisor.records(StatePaths(Path(cluster.state_dir))) if r.name == "haproxy"
    ]
    _segv_workers(rec.pid)
    deadline = time.monotonic() + 20
    while supervisor.alive(rec) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not supervisor.alive(rec), "the master exits once its worker crashed"
    with pytest.raises(BalancerDown) as err:
        api.check_balancer(cluster)
    text = str(err.value)
    assert "haproxy" in text and "no longer running" in text and str(rec.pid) in text
    assert rec.log in text and "lbtune optimize --resume" in text


def _segv_workers(master: int) -> None:
    """SIGSEGV to every worker of HAProxy's master. A worker left by a reload is soft-stopping
    and may exit between listing and signal (CI saw it): that one is skipped, but at least one
    worker must have taken the signal."""
    hit = 0
    for w in psutil.Process(master).children():
        try:
            os.kill(w.pid, signal.SIGSEGV)
            hit += 1
        except ProcessLookupError:
            continue
    assert hit, "HAProxy's master has a live worker to crash"


def _crash_haproxy(ep: Endpoints) -> supervisor.ProcessRecord:
    """SIGSEGV to HAProxy's workers; returns its (dead) master's record."""
    (rec,) = [r for r in supervisor.records(StatePaths(Path(ep.state_dir))) if r.name == "haproxy"]
    _segv_workers(rec.pid)
    deadline = time.monotonic() + 20
    while supervisor.alive(rec) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not supervisor.alive(rec), "the master exits once its worker crashed"
    return rec


def test_cluster_up_relaunches_a_crashed_haproxy_on_its_last_known_good(
    cluster: Endpoints,
) -> None:
    """Issue 29 (class 5): before, the cluster stayed down until `down` and `up`; now `up`
    relaunches the balancer alone, on its last known good, and says so."""
    from lbtune.apply import apply_params
    from lbtune.targets.haproxy.target import HaproxyTarget

    good = apply_params(HaproxyTarget(cluster), {"algorithm": "leastconn"}, via="direct").lkg
    assert good is not None
    _stop_keeper(cluster.state_dir)
    dead = _crash_haproxy(cluster)
    said: list[str] = []
    ep = api.up(mini_config(), cluster.state_dir, progress=said.append)
    api.check_balancer(ep)  # running again
    (now,) = [r for r in supervisor.records(StatePaths(Path(ep.state_dir))) if r.name == "haproxy"]
    assert now.pid != dead.pid and ep.balancer_url == cluster.balancer_url
    assert HaproxyTarget(ep).read_live()["algorithm"] == "leastconn"
    assert any("haproxy is not running" in m and "relaunching" in m for m in said), said
    assert any("back on its last known good" in m and good.sha256[:12] in m for m in said), said
    assert any("the keeper was not running: started it again" in m for m in said), said
    keeper = supervisor.read_record(StatePaths(Path(ep.state_dir)), KEEPER)
    assert keeper is not None and supervisor.alive(keeper)


@pytest.mark.parametrize("preset", ["mini2-envoy", "mini2-nginx"])
def test_cluster_up_relaunches_a_killed_envoy_or_nginx(tmp_path: Path, preset: str) -> None:
    """SIGKILL to the balancer's main process: `up` clears what it left (nginx's workers
    keep serving and its unix sockets stay behind a SIGKILL) and relaunches it on the
    same port."""
    import urllib.request

    from lbtune.cluster.config import load_config

    cfg, state = load_config(preset)[0], tmp_path / "state"
    try:
        ep = api.up(cfg, state)
        _stop_keeper(state)
        (rec,) = [
            r for r in supervisor.records(StatePaths(state)) if r.name == ep.balancer_components[0]
        ]
        left = [p for p in psutil.Process(rec.pid).children(recursive=True)]
        os.kill(rec.pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while supervisor.alive(rec) and time.monotonic() < deadline:
            time.sleep(0.1)
        said: list[str] = []
        healed = api.up(cfg, state, progress=said.append)
        api.check_balancer(healed)
        assert any("relaunching" in m for m in said), said
        assert not [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        with urllib.request.urlopen(f"{healed.balancer_url}/v1/models", timeout=5) as resp:
            assert resp.status == 200 and healed.balancer_url == ep.balancer_url
    finally:
        api.down(state)
