"""The twin's HAProxy model against a real HAProxy running the config lbtune renders.

Tiny replicas (threads answering at once, naming themselves) behind ``haproxy.cfg`` from
:func:`lbtune.targets.haproxy.config.render_config`; requests one at a time (nothing in
flight: no balance factor, no maxconn), and the replica HAProxy picked (its
``X-Lbtune-Replica`` header) against the model's pick for the same request. A sequence
compares only if HAProxy's own counters say no request of it was retried or redispatched
and no server changed state meanwhile (:func:`live_picks`): on a busy machine a failed
connection or health check sends a request elsewhere, which is HAProxy's retry policy at
work, not its hash or its round robin. Run under the
machine's lock (it starts servers)::

    flock /tmp/lbtune-live.lock .venv/bin/pytest tests/targets/haproxy/test_twin_live.py
"""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lbtune.records.endpoints import ReplicaAddress
from lbtune.targets.haproxy.config import render_config
from lbtune.targets.haproxy.files import Site, require
from lbtune.targets.haproxy.runtime import HaproxyRuntime
from lbtune.targets.haproxy.twin import routing_model
from lbtune.twin.replica import TwinReplica
from lbtune.twin.routing import ClusterView, Queue, Send
from tests.targets.haproxy_fixture import free_port, needs_haproxy
from tests.twin.helpers import M8, Req

pytestmark = [pytest.mark.integration, needs_haproxy]
NAMES = ("h100-0", "h100-1", "a100-0", "l4-0")
GPUS = ("h100-80g", "h100-80g", "a100-80g", "l4-24g")


class _Answer(BaseHTTPRequestHandler):
    def _reply(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        if b"slow" in self.rfile.read(length):
            time.sleep(2.5)
        body = b'{"ok":true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _reply
    do_POST = _reply

    def log_message(self, *args: object) -> None:
        return


@contextmanager
def haproxy(tmp: Path, params: Mapping[str, object]) -> Iterator[int]:
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Answer) for _ in NAMES]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    reps = tuple(
        ReplicaAddress(n, "127.0.0.1", s.server_address[1], (M8,), g)
        for n, s, g in zip(NAMES, servers, GPUS, strict=True)
    )
    port = free_port()
    site = Site(str(tmp), "127.0.0.1", port, free_port(), reps)
    cfg = tmp / "haproxy.cfg"
    cfg.write_text(render_config(site, params))  # type: ignore[arg-type]
    proc = subprocess.Popen(
        [require(), "-W", "-S", str(tmp / "master.sock"), "-f", str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                post(port, "warm up")
                break
            except OSError:
                time.sleep(0.05)
        # Until every server has passed its first health check: before it, a server is
        # "UP 1/2" (INI) and one failed check would take it out of the hash.
        while time.monotonic() < deadline and not _all_checked(tmp):
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for s in servers:
            s.shutdown()


def _all_checked(tmp: Path) -> bool:
    rows = HaproxyRuntime(str(tmp / "haproxy.sock")).stat()
    return all(r.status == "UP" and r.check_status == "L7OK" for r in rows if r.backend == "all")


def _disturbances(tmp: Path) -> dict[str, tuple[str, ...]]:
    """Per server: its status (``UP 1/2``, a check failed but it still takes traffic, counts
    as ``UP``) and the counters of retries, redispatches and state changes."""
    rows = HaproxyRuntime(str(tmp / "haproxy.sock")).stat()
    keys = ("wretr", "wredis", "chkdown", "eresp", "econ")
    return {
        f"{r.backend}/{r.server}": (r.status.split()[0], *(r.raw.get(k, "") for k in keys))
        for r in rows
    }


def _wait_idle(tmp: Path, timeout_s: float = 5.0) -> None:
    """Until HAProxy counts no open session on any server (bounded): the hash's load bound
    skips a server that still holds the previous request's session, which HAProxy may not
    have closed yet on a busy machine when the client already has its answer; the twin's
    model sees each request end before the next."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = HaproxyRuntime(str(tmp / "haproxy.sock")).stat()
        if all(r.raw.get("scur", "0") in ("", "0") for r in rows if r.backend == "all"):
            return
        time.sleep(0.01)


def live_picks(tmp: Path, port: int, contents: list[str], rounds: int = 3) -> list[str]:
    """HAProxy's pick for each request, from a sequence no retry, redispatch or server
    state change touched (up to ``rounds`` sequences; the last one's disturbance fails)."""
    why = ""
    for _ in range(rounds):
        before = _disturbances(tmp)
        picks = []
        for c in contents:
            _wait_idle(tmp)
            picks.append(post(port, c))
        after = _disturbances(tmp)
        down = [name for name, row in after.items() if row[0] != "UP"]
        if before == after and not down:
            return picks
        why = f"servers not UP: {down}; counters before {before}, after {after}"
    raise AssertionError(f"every sequence was disturbed by HAProxy's retries: {why}")


def body(content: str) -> bytes:
    msg = {"role": "system", "content": content}
    doc = {"model": M8, "max_tokens": 4, "messages": [msg, {"role": "user", "content": "hi"}]}
    return json.dumps(doc, separators=(",", ":")).encode()


def post(port: int, content: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(
        "POST", "/v1/chat/completions", body(content), {"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    resp.read()
    conn.close()
    if resp.status != 200:
        raise OSError(f"HTTP {resp.status}")
    return resp.getheader("X-Lbtune-Replica") or ""


def model_picks(params: Mapping[str, object], contents: list[str]) -> list[str]:
    reps = [TwinReplica(n, g, (M8,)) for n, g in zip(NAMES, GPUS, strict=True)]
    model = routing_model(params, reps)  # type: ignore[arg-type]
    out = []
    for i, c in enumerate(contents):
        d = model.route(Req(i, prompt_text=c, body=body(c)), 0.0, ClusterView({}))
        assert isinstance(d, Send)
        out.append(d.replica)
        model.on_end(Req(i), d.replica, 0.0)
    return out


KEYS = [f"system prompt number {k} " + "alpha bravo " * (k % 7) for k in range(24)]
WEIGHTED = {f"weight.{n}": w for n, w in zip(NAMES, (22, 88, 182, 250), strict=True)}


@pytest.mark.parametrize(
    "params",
    [
        {"algorithm": "hash", "hash_bytes": 64},
        {"algorithm": "hash", "hash_bytes": 1024, **WEIGHTED},
    ],
    ids=["hash-equal", "hash-weighted"],
)
def test_hash_picks_are_haproxys(tmp_path: Path, params: dict[str, object]) -> None:
    with haproxy(tmp_path, params) as port:
        live = live_picks(tmp_path, port, KEYS)
    assert model_picks(params, KEYS) == live


def test_roundrobin_sequence_is_haproxys(tmp_path: Path) -> None:
    params = {"algorithm": "roundrobin", **WEIGHTED}
    with haproxy(tmp_path, params) as port:
        live = [post(port, f"k{i}") for i in range(40)]
    twin = model_picks(params, [f"k{i}" for i in range(41)])
    # the warm-up request took the first pick
    assert twin[1:] == live


def test_maxconn_queue_timeout_is_a_503_after_the_timeout(tmp_path: Path) -> None:
    # Every server at maxconn 1 and busy 2.5 s: a fifth request waits in the backend's
    # queue and gets HAProxy's 503 when `timeout queue` (1 s) expires, as the twin says.
    params: dict[str, object] = {"queue_timeout_s": 1}
    params.update({f"maxconn.{n}": 1 for n in NAMES})
    with haproxy(tmp_path, params) as port:
        busy = [threading.Thread(target=post, args=(port, f"slow {i}")) for i in range(4)]
        for t in busy:
            t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        with pytest.raises(OSError, match="HTTP 503"):
            post(port, "queued")
        waited = time.monotonic() - t0
        for t in busy:
            t.join()
    reps = [TwinReplica(n, g, (M8,)) for n, g in zip(NAMES, GPUS, strict=True)]
    model = routing_model(params, reps)  # type: ignore[arg-type]
    for i in range(4):
        assert isinstance(model.route(Req(i), 0.0, ClusterView({})), Send)
    assert model.route(Req(9), 0.3, ClusterView({})) == Queue(1.0)
    assert 0.9 < waited < 1.6  # HAProxy checks its queue timeouts within its poll loop
