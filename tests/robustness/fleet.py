"""A fleet of real balancer hosts on this machine, in network namespaces (root only).

Each host ``lbN`` is a namespace ``lbt-<random>-N`` joined to the root namespace by a veth
pair (root side ``10.213.N.1/30``, host side ``10.213.N.2/30``) and runs, inside the
namespace: its own sshd (a per-fleet host key and authorized key, ``PermitRootLogin
prohibit-password``), its own simulated replicas (``python -m lbtune.sim``, on the
namespace's loopback) and its own HAProxy (master-worker, rendered by lbtune's HAProxy
target from ``lbtune/data/playbooks/templates/haproxy.cfg.j2``) listening on the host address. Every
host has its own lbtune state dir (``endpoints.json``, sockets); Ansible reaches it over
SSH, the module runs inside the namespace.

Only these namespace addresses and loopback are ever load targets. :class:`Fleet` is a
context manager: everything it created (processes, namespaces, veths) is removed on exit,
on failure too.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from lbtune.records.endpoints import Endpoints, ReplicaEndpoint
from lbtune.records.statedir import StatePaths, write_endpoints
from lbtune.sim.spec import HostSpec, ReplicaSpec
from lbtune.targets.base import DEFAULT_REPLICA_HEADER, ReplicaAddress
from lbtune.targets.haproxy import config
from lbtune.targets.haproxy.files import HaproxyFiles, Site
from lbtune.targets.haproxy.runtime import HaproxyRuntime

SUBNET = "10.213"
BALANCER_PORT = 8000
STATS_PORT = 8404
M8 = "llama-3.1-8b-instruct"
M70 = "llama-3.1-70b-instruct-awq"
REPLICAS = (("h100-0", 8101, "h100-80g", (M8, M70)), ("l4-0", 8102, "l4-24g", (M8,)))
START_TIMEOUT_S = 30.0
GUARD_ROUTE = f"{SUBNET}.0.0/16"


def missing_prerequisite() -> str | None:
    """Why a fleet cannot be built here (``None`` when it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for binary in ("ip", "haproxy", "ssh", "ssh-keygen"):
        if shutil.which(binary) is None:
            return f"`{binary}` not found"
    if not Path("/usr/sbin/sshd").exists():
        return "sshd not found (apt-get install openssh-server; scripts/setup.sh installs it)"
    probe = f"lbt-probe-{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if f" {SUBNET}." in f" {_routes()}":
        return f"{SUBNET}.0.0/16 is already routed on this machine"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


def wait_for(check: Callable[[], str | None], timeout: float, what: str) -> None:
    """Poll ``check`` (``None`` = ready) until ``timeout``; AssertionError with its last word."""
    deadline = time.monotonic() + timeout
    last: str | None = "not checked"
    while time.monotonic() < deadline:
        last = check()
        if last is None:
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not ready after {timeout:.0f} s: {last}")


@dataclass
class Host:
    """One balancer host of the fleet."""

    name: str
    index: int
    netns: str
    root_veth: str
    state: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def addr(self) -> str:
        """The host's address (inside its namespace)."""
        return f"{SUBNET}.{self.index}.2"

    @property
    def peer(self) -> str:
        """The root namespace's address on this host's veth."""
        return f"{SUBNET}.{self.index}.1"

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{BALANCER_PORT}"

    @property
    def runtime(self) -> HaproxyRuntime:
        """HAProxy's runtime API (a unix socket: reachable from any namespace)."""
        return HaproxyRuntime(HaproxyFiles.in_dir(self.state).runtime_socket)

    def endpoints(self, state_dir: Path | None = None) -> Endpoints:
        root = state_dir or self.state
        stats = f"http://{self.addr}:{STATS_PORT}"
        return Endpoints(
            config_name=f"fleet-{self.name}",
            config_path="<tests/robustness/fleet.py>",
            state_dir=str(root),
            balancer="haproxy",
            balancer_url=self.url,
            stats_url=f"{stats}/stats",
            balancer_metrics_url=f"{stats}/metrics",
            balancer_components=["haproxy"],
            balancer_jobs=["haproxy"],
            balancer_details=HaproxyFiles.in_dir(self.state).details(),
            replica_header=DEFAULT_REPLICA_HEADER,
            prometheus_url="http://127.0.0.1:9",  # none runs: the fleet test needs none
            exporter_port=0,
            exporter_url="http://127.0.0.1:9/metrics",
            prometheus_yml=str(root / "prometheus.yml"),
            replicas=[
                ReplicaEndpoint(name=n, url=f"http://127.0.0.1:{p}", models=list(m), gpu=g)
                for n, p, g, m in REPLICAS
            ],
            time_scale=4.0,
            ground_truth_path=None,
        )

    def exec(self, *cmd: str) -> list[str]:
        """``cmd`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *cmd]

    def start(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.state / "logs" / f"{name}.log", "wb")  # noqa: SIM115 (kept by the child)
        proc = subprocess.Popen(
            self.exec(*cmd), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.procs.append(proc)
        return proc

    def set_link(self, up: bool) -> None:
        """Bring the root side of the veth up or down (down: the host is unreachable)."""
        _ip("link", "set", self.root_veth, "up" if up else "down")


class Fleet:
    """``with Fleet(tmp, 3) as fleet:`` three hosts up; everything removed on exit."""

    def __init__(self, root: Path, count: int = 3) -> None:
        self.root = root
        self.tag = secrets.token_hex(3)
        self.hosts = [
            Host(
                name=f"lb{i}",
                index=i,
                netns=f"lbt-{self.tag}-{i}",
                root_veth=f"lbt{self.tag}r{i}",
                state=root / f"lb{i}",
            )
            for i in range(1, count + 1)
        ]
        self.key = root / "id_ed25519"
        self.extra: list[subprocess.Popen[Any]] = []
        """Processes of a test (load generators) the fleet kills on exit."""
        self._guard = False

    # -- building ------------------------------------------------------------------------

    def __enter__(self) -> Fleet:
        try:
            # A host whose link is down must be unreachable at once, and its packets must
            # never follow the default route off this machine.
            _ip("route", "add", "unreachable", GUARD_ROUTE)
            self._guard = True
            self._keys()
            for h in self.hosts:
                self._network(h)
            for h in self.hosts:
                self._processes(h)
            for h in self.hosts:
                self._wait(h)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _keys(self) -> None:
        keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "lbtune-fleet", "-f"]
        subprocess.run([*keygen, str(self.key)], check=True, timeout=30)
        subprocess.run([*keygen, str(self.root / "host_ed25519")], check=True, timeout=30)
        shutil.copy(self.key.with_suffix(".pub"), self.root / "authorized_keys")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir

    def _network(self, h: Host) -> None:
        ns_veth = f"lbt{self.tag}n{h.index}"
        _ip("netns", "add", h.netns)
        _ip("link", "add", h.root_veth, "type", "veth", "peer", "name", ns_veth)
        _ip("link", "set", ns_veth, "netns", h.netns)
        _ip("addr", "add", f"{h.peer}/30", "dev", h.root_veth)
        _ip("link", "set", h.root_veth, "up")
        _ip("-n", h.netns, "addr", "add", f"{h.addr}/30", "dev", ns_veth)
        _ip("-n", h.netns, "link", "set", ns_veth, "up")
        _ip("-n", h.netns, "link", "set", "lo", "up")

    def _processes(self, h: Host) -> None:
        (h.state / "logs").mkdir(parents=True)
        sshd_config = h.state / "sshd_config"
        sshd_config.write_text(
            f"ListenAddress {h.addr}\nPort 22\nHostKey {self.root / 'host_ed25519'}\n"
            f"PidFile {h.state / 'sshd.pid'}\nAuthorizedKeysFile {self.root / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "Subsystem sftp internal-sftp\nLogLevel ERROR\n",
            encoding="utf-8",
        )
        h.start("sshd", ["/usr/sbin/sshd", "-D", "-e", "-f", str(sshd_config)])
        spec = HostSpec(
            host="127.0.0.1",
            time_scale=4.0,
            replicas=[
                ReplicaSpec(name=n, port=p, gpu=g, models=list(m)) for n, p, g, m in REPLICAS
            ],
        )
        (h.state / "sim.json").write_text(spec.model_dump_json(indent=2), encoding="utf-8")
        h.start("sim", [sys.executable, "-m", "lbtune.sim", "--spec", str(h.state / "sim.json")])
        site = Site(
            state_dir=str(h.state),
            host=h.addr,
            port=BALANCER_PORT,
            stats_port=STATS_PORT,
            replicas=tuple(
                ReplicaAddress(n, "127.0.0.1", p, tuple(m), g) for n, p, g, m in REPLICAS
            ),
        )
        files = HaproxyFiles.in_dir(h.state)
        files.cfg.write_text(config.render_untuned(site), encoding="utf-8")
        write_endpoints(StatePaths(h.state), h.endpoints())
        h.start("haproxy", ["haproxy", "-W", "-S", files.master_socket, "-f", str(files.cfg)])

    def _wait(self, h: Host) -> None:
        from lbtune.targets.haproxy.balancer import servers_missing

        def ready() -> str | None:
            for p in h.procs:
                if p.poll() is not None:
                    log = (h.state / "logs").glob("*.log")
                    tails = {f.name: f.read_text(errors="replace")[-300:] for f in log}
                    return f"a process of {h.name} exited ({p.args!r}): {tails}"
            missing = servers_missing(h.runtime, [n for n, *_ in REPLICAS], h.url)
            if missing is not None:
                return missing
            if _tcp(h.addr, 22):
                return None
            return "sshd not listening yet"

        wait_for(ready, START_TIMEOUT_S, f"host {h.name}")

    # -- tearing down --------------------------------------------------------------------

    def close(self) -> None:
        """Stop every process, delete every namespace and veth (idempotent)."""
        procs = [*self.extra, *(p for h in self.hosts for p in h.procs)]
        for p in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        for h in self.hosts:
            self._kill_in(h.netns)
            subprocess.run(["ip", "netns", "del", h.netns], capture_output=True, timeout=10)
            subprocess.run(["ip", "link", "del", h.root_veth], capture_output=True, timeout=10)
        if self._guard:
            subprocess.run(["ip", "route", "del", "unreachable", GUARD_ROUTE], capture_output=True)
            self._guard = False

    @staticmethod
    def _kill_in(netns: str) -> None:
        """Whatever still runs in ``netns`` (an ssh session's child, a HAProxy worker)."""
        for _ in range(2):
            out = subprocess.run(
                ["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=10
            ).stdout.split()
            if not out:
                return
            for pid in out:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.2)

    def leftovers(self) -> list[str]:
        """Namespaces or veths of this fleet still present (after :meth:`close`: none)."""
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
        return [
            x
            for h in self.hosts
            for x in (h.netns, h.root_veth)
            if x in names or f"{x}@" in links or f"{x} " in links
        ] + ([GUARD_ROUTE] if f"unreachable {GUARD_ROUTE}" in _routes() else [])


def _routes() -> str:
    return subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout


def _tcp(host: str, port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0
