"""Faults a careful operator meets (issue 16): the process that put an experiment live dies
(#13), a replica dies under HAProxy (#14: ``test_apply_safety``), a structural apply under
traffic.

Structural applies under traffic with 0 dropped requests: HAProxy here (reloads through
``lbtune.apply`` with requests in flight); the other balancers where they live —
``tests/targets/nginx/test_nginx_target.py::test_ten_reloads_under_streamed_load_drop_nothing``,
``tests/targets/envoy/test_under_load.py::test_ten_applies_under_load_drop_no_request``,
``tests/targets/test_haproxy_target.py::test_a_rejected_config_keeps_haproxy_serving_without_dropping_requests``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lbtune.apply import apply_params
from lbtune.apply.claim import lease_path
from lbtune.cluster import api
from lbtune.errors import DependencyError
from lbtune.records.endpoints import Endpoints
from lbtune.targets import get_target
from lbtune.targets.base import ParamSet
from lbtune.targets.lkg import LkgStore
from lbtune.targets.targetbase import TargetBase
from tests.robustness.conftest import LBTUNE, run_cli

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    state = tmp_path_factory.mktemp("faults")
    try:
        try:
            ep = api.up("mini2", state)
        except DependencyError as exc:
            pytest.skip(str(exc))
        yield ep
    finally:
        api.down(state)


def _target(ep: Endpoints) -> TargetBase:
    return get_target(ep.balancer, ep)


def _lkg(t: TargetBase) -> ParamSet:
    apply_params(t, {}, via="direct")  # records the baseline on a fresh cluster
    lkg = LkgStore(t.state_dir, t.name).get()
    assert lkg is not None
    return dict(lkg.params)


def _wait(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def _differs(t: TargetBase, good: ParamSet) -> bool:
    live = t.read_live()
    return any(live.get(k) != v for k, v in good.items())


HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from lbtune.apply.lease import hold
    from lbtune.records.statedir import StatePaths, read_endpoints
    from lbtune.targets import get_target
    ep = read_endpoints(StatePaths(Path(sys.argv[1])))
    t = get_target(ep.balancer, ep)
    hold(ep.state_dir, t.name, ttl_s=float(sys.argv[2]))
    t.apply({"algorithm": "leastconn", "weight.l4-0": 7})  # the experiment
    print("live", flush=True)
    time.sleep(600)
    """
)


def _start_holder(ep: Endpoints, ttl_s: float = 30.0) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, ep.state_dir, str(ttl_s)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "live"
    return proc


def test_the_guard_restores_the_last_known_good_when_its_holder_is_killed(
    cluster: Endpoints,
) -> None:
    t = _target(cluster)
    good = _lkg(t)
    proc = _start_holder(cluster)
    try:
        assert _differs(t, good)
        proc.kill()  # SIGKILL: no handler, no atexit
        proc.wait(timeout=10)
        assert _wait(lambda: not _differs(t, good), 30), t.read_live()
        path = lease_path(cluster.state_dir, t.name)
        assert _wait(lambda: not path.exists(), 30)
        log = (Path(cluster.state_dir) / "logs" / f"lease-guard-{t.name}.log").read_text()
        assert f"holder (pid {proc.pid}) died): restored" in log
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_released_lease_restores_nothing(cluster: Endpoints) -> None:
    t = _target(cluster)
    good = _lkg(t)
    code = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from lbtune.apply.lease import hold
        from lbtune.records.statedir import StatePaths, read_endpoints
        from lbtune.targets import get_target
        ep = read_endpoints(StatePaths(Path(sys.argv[1])))
        t = get_target(ep.balancer, ep)
        release = hold(ep.state_dir, t.name)
        release()
        t.apply({"weight.l4-0": 9})  # after the release: the holder's own business
        """
    )
    try:
        subprocess.run([sys.executable, "-c", code, cluster.state_dir], check=True, timeout=60)
        assert not lease_path(cluster.state_dir, t.name).exists()
        # release() waited for the guard to exit: a wrong restore would be done by now
        assert t.read_live()["weight.l4-0"] == 9
    finally:
        t.apply(good)


@pytest.mark.skipif(sys.platform != "linux", reason="needs /proc")
def test_kill_9_of_optimize_mid_trial_puts_the_last_known_good_back(
    cluster: Endpoints, tmp_path: Path
) -> None:
    t = _target(cluster)
    good = _lkg(t)
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    proc = subprocess.Popen(
        [
            *LBTUNE,
            "optimize",
            "--state-dir",
            cluster.state_dir,
            "--budget",
            "8",
            "--trial-duration",
            "6",
            "--sampler",
            "random",
            "--pruner",
            "none",
            "--screen",
            "0",  # the kill must land in a live trial, not in the twin's screen
            "--confirm-runs",
            "0",
            "--storage",
            f"sqlite:///{tmp_path / 'studies.db'}",
            "--study",
            "killed",
            "--out",
            str(tmp_path / "report"),
            "--ci",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "optimize.log").open("w"),
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        changed = _wait(lambda: proc.poll() is None and _differs(t, good), 240)
        assert changed, (tmp_path / "optimize.log").read_text()[-2000:]
        assert json.loads(lease_path(cluster.state_dir, t.name).read_text())["holder"] == proc.pid
        os.kill(proc.pid, signal.SIGKILL)  # the optimizer only: its guard has its own session
        proc.wait(timeout=10)
        lease = lease_path(cluster.state_dir, t.name)
        guard_log = Path(cluster.state_dir) / "logs" / f"lease-guard-{t.name}.log"
        assert _wait(lambda: not lease.exists(), 60)  # the guard is done
        assert f"holder (pid {proc.pid}) died): restored" in guard_log.read_text()
        assert not _differs(t, good), t.read_live()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever it left behind (load generators)
        proc.wait(timeout=10)


def test_structural_applies_under_traffic_drop_no_request(cluster: Endpoints) -> None:
    t = _target(cluster)
    good = _lkg(t)
    url = cluster.balancer_url + "/v1/chat/completions"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    body = json.dumps(
        {
            "model": "llama-3.1-8b-instruct",
            "max_tokens": 4,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()
    statuses: list[int | str] = []
    stop = threading.Event()

    def send() -> None:
        while not stop.is_set() and len(statuses) < 2000:
            req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            try:
                with opener.open(req, timeout=30) as resp:
                    resp.read()
                    statuses.append(int(resp.status))
            except (OSError, urllib.error.HTTPError) as exc:
                statuses.append(repr(exc))

    senders = [threading.Thread(target=send) for _ in range(4)]
    for th in senders:
        th.start()
    try:
        for algorithm in ("leastconn", "random", "roundrobin", "leastconn", "roundrobin"):
            assert apply_params(t, {"algorithm": algorithm}, via="direct").result.reloaded
    finally:
        stop.set()
        for th in senders:
            th.join(timeout=60)
        t.apply(good)
    assert statuses and all(s == 200 for s in statuses), [s for s in statuses if s != 200][:5]


def test_while_a_study_holds_the_cluster_nothing_else_changes_or_loads_it(
    cluster: Endpoints, tmp_path: Path
) -> None:
    """Issue 29 (item 1): ``apply``, ``rollback`` and ``stress`` of another process refuse
    in one line (exit 3) while a study holds the cluster's lease, and a second study does
    not take it over (before: ``apply`` became the last known good the study then
    "restored"; a second study died with ``Address already in use``)."""
    t = _target(cluster)
    _lkg(t)
    proc = _start_holder(cluster)
    lease = lease_path(cluster.state_dir, t.name)
    try:
        params = tmp_path / "p.yaml"
        params.write_text("weight.l4-0: 50\n")
        before = t.read_live(), LkgStore(t.state_dir, t.name).get()
        state = ["--state-dir", cluster.state_dir]
        for args in (
            ["apply", "--direct", "--params", str(params)],
            ["apply", "--params", str(params)],
            ["rollback", "--direct"],
            ["stress", "-d", "2", "--out", str(tmp_path / "stress")],
        ):
            r = run_cli(*args, *state)
            assert r.rc == 3, (args, r.stderr)
            assert len(r.lines()) == 1 and f"pid {proc.pid}" in r.stderr, (args, r.stderr)
        assert not (tmp_path / "stress").exists()
        r = run_cli(
            "optimize", *state, "--budget", "2", "--trial-duration", "2",
            "--storage", f"sqlite:///{tmp_path / 'studies.db'}", "--study", "second",
            "--out", str(tmp_path / "second"), cwd=tmp_path,
        )  # fmt: skip
        assert r.rc == 3, r.stderr
        assert "two studies never share a cluster" in r.lines()[-1], r.stderr
        assert "Traceback" not in r.stderr and "Address already in use" not in r.stderr
        assert json.loads(lease.read_text())["holder"] == proc.pid
        assert (t.read_live(), LkgStore(t.state_dir, t.name).get()) == before
    finally:
        proc.kill()
        proc.wait(timeout=10)
        assert _wait(lambda: not lease.exists(), 60)  # its guard restored the last known good
    assert apply_params(t, {}, via="direct")  # free again
