"""A real HAProxy for tests: a tiny config, admin socket in a tmp dir, stopped afterwards."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from lbtune.cluster.resolve import free_port as free_port

needs_haproxy = pytest.mark.skipif(
    shutil.which("haproxy") is None, reason="haproxy is needed (sudo apt-get install haproxy)"
)


def _config(
    sock: Path, backends: Mapping[str, list[str]], static: Mapping[str, list[str]], port: int
) -> str:
    lines = [
        "global",
        f"    stats socket {sock} mode 600 level admin",
        "defaults",
        "    mode http",
        "    timeout connect 1s",
        "    timeout client 5s",
        "    timeout server 5s",
        "frontend f",
        f"    bind 127.0.0.1:{port}",
        f"    default_backend {next(iter(backends))}",
    ]
    for algo, table in (("roundrobin", backends), ("static-rr", static)):
        for be, servers in table.items():
            lines += [f"backend {be}", f"    balance {algo}"]
            # Closed loopback ports: nothing is checked, nothing is ever connected to.
            lines += [f"    server {s} 127.0.0.1:{i + 1} weight 100" for i, s in enumerate(servers)]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def running_haproxy(
    tmp: Path,
    backends: Mapping[str, list[str]],
    static: Mapping[str, list[str]] | None = None,
) -> Iterator[Path]:
    """Start ``haproxy -W -S master.sock -f cfg``; yield the admin socket path."""
    binary = shutil.which("haproxy")
    if binary is None:
        pytest.skip("haproxy is needed")
    sock = tmp / "admin.sock"
    cfg = tmp / "haproxy.cfg"
    cfg.write_text(_config(sock, backends, static or {}, free_port()))
    log = (tmp / "haproxy.log").open("w")
    proc = subprocess.Popen(
        [binary, "-W", "-S", str(tmp / "master.sock"), "-f", str(cfg)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            with socket.socket(socket.AF_UNIX) as s:
                try:
                    s.connect(str(sock))
                    break
                except OSError:
                    pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"haproxy did not start: {(tmp / 'haproxy.log').read_text()}")
            time.sleep(0.02)
        yield sock
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
