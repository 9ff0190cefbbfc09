"""A fleet of real hosts (issue 16): three network namespaces, each with its own sshd,
HAProxy and simulated replicas (tests/robustness/fleet.py), driven the way an operator
drives a remote fleet.

1. ``lbtune apply --inventory <fleet inventory>``: Ansible over SSH, ``serial: 1``,
   ``max_fail_percentage: 0``. One rollout where lb2's link goes down right after lb1's
   apply (unreachable), one where lb3's HAProxy refuses its config (a broken template
   override, that host's var). Each is reported per host, the touched hosts are rolled
   back, the rest never touched, and every host's live state (read over its runtime
   socket) is the last known good: nothing half-applied.
2. ``lbtune stress --master`` in the root namespace and ``--worker`` inside lb2's namespace,
   load only to lb2's own HAProxy address; every request the worker sent is accounted for.

Root only (skipped otherwise, or where ``ip netns`` does not work).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.robustness.fleet import M8, Fleet, Host, missing_prerequisite

pytestmark = pytest.mark.integration

LBTUNE = [sys.executable, "-m", "lbtune"]
GOOD = {"weight.h100-0": 120, "weight.l4-0": 60, "queue_timeout_s": 30}
"""Applied to the whole fleet first: the last known good."""
NEW = {"weight.h100-0": 30, "weight.l4-0": 90, "queue_timeout_s": 45}
"""The rollouts that fail midway."""
CLI_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    why = missing_prerequisite()
    if why is not None:
        pytest.skip(f"no fleet of namespaces here: {why}")
    root = Path(f"/tmp/lbtf-{os.getpid()}")  # short: unix socket paths are limited
    root.mkdir(mode=0o700)
    try:
        with Fleet(root, 3) as f:
            yield f
        assert f.leftovers() == [], "namespaces or veths left behind"
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


# -- helpers ---------------------------------------------------------------------------


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("LBTUNE_CI", None)
    return subprocess.run(
        [*LBTUNE, *args], capture_output=True, text=True, timeout=CLI_TIMEOUT_S, cwd=cwd, env=env
    )


def inventory(fleet: Fleet, path: Path, per_host: Mapping[str, Mapping[str, Any]]) -> Path:
    """The fleet as an Ansible inventory: root over SSH with the fleet's key, lbtune's own
    venv as the hosts' Python, each host's own state dir (the playbook's serial: 1 and
    max_fail_percentage: 0 make the rollout one host at a time)."""
    ssh_args = (
        "-o ControlMaster=no -o ControlPath=none -o BatchMode=yes -o IdentitiesOnly=yes "
        "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
    )
    hosts = {
        h.name: {
            "ansible_host": h.addr,
            "lbtune_state_dir": str(h.state),
            **per_host.get(h.name, {}),
        }
        for h in fleet.hosts
    }
    doc = {
        "all": {
            "children": {
                "balancers": {
                    "vars": {
                        "ansible_connection": "ssh",
                        "ansible_user": "root",
                        "ansible_ssh_private_key_file": str(fleet.key),
                        "ansible_ssh_args": ssh_args,
                        "ansible_ssh_timeout": 5,
                        "ansible_python_interpreter": sys.executable,
                        "ansible_remote_tmp": str(fleet.root / "remote-tmp"),
                    },
                    "hosts": hosts,
                }
            }
        }
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@dataclass(frozen=True)
class Live:
    """One host's balancer as its HAProxy reports it now."""

    weights: dict[tuple[str, str], int]
    """(backend, server) -> weight, from ``show servers state`` on the runtime socket."""
    queue_timeout: str
    """``timeout queue`` of the config the master runs."""
    worker_pid: int
    reloads: int
    pending_file: bool
    """A rejected ``haproxy.cfg.new`` lies beside the live file."""


def live(h: Host) -> Live:
    from lbtune.targets.haproxy.files import HaproxyFiles
    from lbtune.targets.haproxy.master import reload_count, worker_pid

    files = HaproxyFiles.in_dir(h.state)
    states = h.runtime.servers_state()
    found = re.search(r"^\s*timeout queue (\S+)", files.cfg.read_text(), re.MULTILINE)
    assert found is not None, f"{h.name}: no timeout queue in {files.cfg}"
    return Live(
        weights={(s.backend, s.server): s.weight for s in states},
        queue_timeout=found.group(1),
        worker_pid=worker_pid(h.runtime),
        reloads=reload_count(files.master_socket),
        pending_file=files.cfg.with_name("haproxy.cfg.new").exists(),
    )


def assert_on(h: Host, params: Mapping[str, int], what: str) -> Live:
    """``h`` runs ``params`` everywhere: each server's weight in every backend it is in,
    and the config; lbtune's own read-back agrees."""
    from lbtune.targets.haproxy.target import HaproxyTarget

    now = live(h)
    for (backend, server), weight in now.weights.items():
        want = params[f"weight.{server}"]
        assert weight == want, f"{h.name} ({what}): {backend}/{server} weight {weight}, not {want}"
    assert now.queue_timeout == f"{params['queue_timeout_s']}s", f"{h.name} ({what})"
    read = HaproxyTarget(h.endpoints()).read_live()
    assert {k: read[k] for k in params} == dict(params), f"{h.name} ({what}): read-back {read}"
    return now


def write_params(path: Path, params: Mapping[str, int]) -> Path:
    path.write_text(yaml.safe_dump({"target": "haproxy", "params": dict(params)}), "utf-8")
    return path


# -- 1. rollout over SSH ---------------------------------------------------------------


def test_a_rollout_over_ssh_stops_at_the_first_failing_host_and_leaves_none_half_applied(
    fleet: Fleet,
) -> None:
    from lbtune.records.statedir import StatePaths, write_endpoints

    t0 = time.monotonic()
    work = fleet.root / "controller"
    (work / "logs").mkdir(parents=True)
    # The controller's own state dir: the fleet's shape (replicas, space), its lock, its
    # last known good and the Ansible logs; the hosts keep theirs (lbtune_state_dir).
    write_endpoints(StatePaths(work), fleet.hosts[0].endpoints(state_dir=work))
    apply = ["apply", "--target", "haproxy", "--state-dir", str(work)]
    lb2 = fleet.hosts[1]

    # 0. A clean rollout to all three: the fleet's last known good.
    inv = inventory(fleet, work / "fleet.yml", {})
    done = run_cli(
        *apply,
        "--params",
        str(write_params(work / "good.yaml", GOOD)),
        "--inventory",
        str(inv),
        "--json",
        cwd=work,
    )
    assert done.returncode == 0, done.stderr
    hosts = {h["host"]: h["status"] for h in json.loads(done.stdout)["hosts"]}
    assert hosts == {"lb1": "changed", "lb2": "changed", "lb3": "changed"}, done.stdout
    before = {h.name: assert_on(h, GOOD, "after the good rollout") for h in fleet.hosts}
    new_file = str(write_params(work / "new.yaml", NEW))

    # A. lb2's link goes down right after lb1's apply (the playbook's controller-side
    # test hook, a host var of lb1): lb1 changed, lb2 unreachable, lb3 never run.
    hook = {"lbtune_after_apply_command": ["ip", "link", "set", lb2.root_veth, "down"]}
    inv_a = inventory(fleet, work / "fleet-a.yml", {"lb1": hook})
    try:
        a = run_cli(*apply, "--params", new_file, "--inventory", str(inv_a), cwd=work)
        down = subprocess.run(
            ["ip", "-br", "link", "show", lb2.root_veth], capture_output=True, text=True
        ).stdout
    finally:
        lb2.set_link(up=True)
    assert " DOWN " in f" {down} ", f"the hook did not take lb2 down: {down!r}"
    assert a.returncode == 3, (a.returncode, a.stdout, a.stderr)  # ApplyError
    assert "Traceback" not in a.stderr
    assert re.search(r"lb2: UNREACHABLE at task 'Apply parameters'", a.stderr), a.stderr
    assert "rolled back to the last known good" in a.stderr, a.stderr
    assert "(hosts lb1)" in a.stderr, f"only lb1 was touched and rolled back: {a.stderr}"
    assert "lb3" not in a.stderr, f"lb3 must never have been run: {a.stderr}"
    after_a = {h.name: assert_on(h, GOOD, "after rollout A") for h in fleet.hosts}
    assert after_a["lb1"].reloads == before["lb1"].reloads + 2, "lb1: applied, then rolled back"
    for name in ("lb2", "lb3"):  # untouched: the same worker, no reload
        assert after_a[name].worker_pid == before[name].worker_pid, name
        assert after_a[name].reloads == before[name].reloads, name

    # B. lb3's HAProxy refuses the config it would get (`haproxy -c` fails on a broken
    # template variable, that host's own lbtune_options): lb1 and lb2 changed, lb3
    # refused before anything was touched; lb1 and lb2 are rolled back.
    broken = {"lbtune_options": {"template_overrides": {"haproxy_timeout_queue": "bogus"}}}
    inv_b = inventory(fleet, work / "fleet-b.yml", {"lb3": broken})
    b = run_cli(*apply, "--params", new_file, "--inventory", str(inv_b), cwd=work)
    assert b.returncode == 3, (b.returncode, b.stdout, b.stderr)  # ApplyError
    assert "Traceback" not in b.stderr
    assert re.search(r"lb3: FAILED at task 'Apply parameters'.*HAProxy rejects", b.stderr), b.stderr
    assert "(hosts lb1, lb2)" in b.stderr, b.stderr
    assert "rolled back to the last known good" in b.stderr, b.stderr
    after_b = {h.name: assert_on(h, GOOD, "after rollout B") for h in fleet.hosts}
    for name in ("lb1", "lb2"):
        assert after_b[name].reloads == after_a[name].reloads + 2, f"{name}: applied, rolled back"
    assert after_b["lb3"].worker_pid == after_a["lb3"].worker_pid, "lb3 must not have reloaded"
    assert after_b["lb3"].reloads == after_a["lb3"].reloads

    # The controller's last known good is still the good rollout's.
    rb = run_cli(
        "apply",
        "--state-dir",
        str(work),
        "--inventory",
        str(inv),
        "--check",
        "--params",
        str(work / "good.yaml"),
        "--json",
        cwd=work,
    )
    assert rb.returncode == 0, rb.stderr
    assert not json.loads(rb.stdout)["changed"], "the fleet is exactly on the good set"
    took = time.monotonic() - t0
    print(f"fleet rollout: 6 playbook runs (3 rollouts, 2 rollbacks, 1 check) in {took:.1f} s")


# -- 2. Locust master and worker across namespaces ---------------------------------------


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _served(h: Host) -> int:
    """Requests lb2's HAProxy sent to a replica (per-server session totals, 8B backend)."""
    from lbtune.targets.base import pool_names

    backend = pool_names([M8])[M8]
    return sum(s.stot for s in h.runtime.stat() if s.backend == backend)


@dataclass(frozen=True)
class Distributed:
    master: subprocess.CompletedProcess[str]
    worker: subprocess.CompletedProcess[str]
    master_out: Path
    worker_out: Path
    served: int
    """Requests lb2's HAProxy passed to its replicas during the run."""
    seconds: float


@pytest.fixture(scope="module")
def distributed(fleet: Fleet) -> Distributed:
    """One ``stress --master`` (root namespace, bound to lb2's veth peer address) and one
    ``stress --worker`` inside lb2's namespace; load to lb2's HAProxy only."""
    h = fleet.hosts[1]
    work = fleet.root / "stress"
    work.mkdir()
    port = _free_port(h.peer)
    common = [
        "stress",
        "--target",
        h.url,
        "--allow-remote",
        "--scenario",
        "chat",
        "--master-port",
        str(port),
    ]
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    master_out, worker_out = work / "master", work / "worker"
    served0 = _served(h)
    t0 = time.monotonic()
    master = subprocess.Popen(
        [
            *LBTUNE,
            *common,
            "--master",
            "--expect-workers",
            "1",
            "--master-bind",
            h.peer,
            "--duration",
            "4",
            "--users",
            "2",
            "--json",
            "--out",
            str(master_out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=work,
        env=env,
        start_new_session=True,
    )
    worker = subprocess.Popen(
        h.exec(
            *LBTUNE,
            *common,
            "--worker",
            "--master-host",
            h.peer,
            "--json",
            "--out",
            str(worker_out),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=work,
        env=env,
        start_new_session=True,
    )
    fleet.extra += [master, worker]  # killed by the fleet whatever happens here
    try:
        m_out, m_err = master.communicate(timeout=CLI_TIMEOUT_S)
        w_out, w_err = worker.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the master or the worker did not end in time (the fleet kills both)")
    seconds = time.monotonic() - t0
    return Distributed(
        subprocess.CompletedProcess(master.args, master.returncode, m_out, m_err),
        subprocess.CompletedProcess(worker.args, worker.returncode, w_out, w_err),
        master_out,
        worker_out,
        _served(h) - served0,
        seconds,
    )


def test_a_worker_in_another_namespace_accounts_for_every_request(
    distributed: Distributed,
) -> None:
    from lbtune.loadgen.recordio import read_records

    w = distributed.worker
    assert w.returncode == 0, w.stderr[-2000:]
    summary = json.loads(w.stdout)
    outcomes = summary["outcomes"]
    records = read_records(distributed.worker_out)
    sent = outcomes["sent"]
    assert sent > 0, "the worker sent nothing"
    assert sent == sum(outcomes["counts"].values()), outcomes
    assert len(records) == sent, (len(records), outcomes)
    assert outcomes["counts"]["ok"] == sent, outcomes
    # The balancer counts the same requests: the worker's records are all there is.
    assert distributed.served == sent, (distributed.served, sent)
    assert "10.213.2.2" in json.dumps(summary["target"]), summary["target"]
    print(
        f"distributed: worker sent {sent}, outcomes {outcomes['counts']}, lb2 HAProxy "
        f"served {distributed.served}, {distributed.seconds:.1f} s"
    )


def test_the_masters_report_holds_the_remote_workers_requests(distributed: Distributed) -> None:
    """Every request the worker recorded reaches the master's records (shipped as Locust
    messages); each summary counts its own measurement window, so the runs are compared
    request by request, not by their windowed counts."""
    from lbtune.loadgen.recordio import read_records

    m = distributed.master
    assert m.returncode == 0, m.stderr[-1500:]
    worker_ids = {r.request_id for r in read_records(distributed.worker_out)}
    master_ids = {r.request_id for r in read_records(distributed.master_out)}
    assert worker_ids and master_ids == worker_ids
    assert json.loads(m.stdout)["outcomes"]["sent"] > 0
