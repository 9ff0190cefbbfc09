"""Outcome classification of the streaming client: exactly one outcome per request.

The client uses gevent sockets explicitly (no monkey patching), so it runs in
the test process against an echo server thread.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from lbtune.cluster.resolve import free_port
from lbtune.loadgen.client import StreamClient
from lbtune.loadgen.echo import EchoServer
from lbtune.loadgen.source import FixedWorkload
from lbtune.records.requests import OUTCOMES

SECRET = "sk-test-DO-NOT-LEAK-42"


def send(url: str, model: str = "m", timeout: float = 5.0, **kw: object):  # type: ignore[no-untyped-def]
    c = StreamClient(url, api_key=SECRET, timeout_s=timeout)
    try:
        return c.send(FixedWorkload(model=model, output_tokens=6, **kw).request(3))  # type: ignore[arg-type]
    finally:
        c.close()


def _truth(srv: EchoServer, rid: str) -> dict[str, float]:
    """The server's ground truth of ``rid``: its thread records it just after its last write,
    which the client may read first, so wait (bounded) for it to appear."""
    deadline = time.monotonic() + 5.0
    while rid not in srv.truth:
        assert time.monotonic() < deadline, f"the echo server never recorded {rid}"
        time.sleep(0.001)
    return {k: v for k, v in srv.truth[rid].items() if v is not None}


def test_ok_stream_matches_ground_truth(echo_thread: tuple[str, EchoServer]) -> None:
    url, srv = echo_thread
    r = send(url)
    assert r.outcome == "ok" and r.status_code == 200
    assert r.replica == "echo-0"
    assert len(r.chunk_times) == 6 and r.output_tokens == 6 and r.prompt_tokens == 7
    truth = _truth(srv, r.request_id)
    assert r.first_token_at is not None and r.headers_at is not None
    assert r.sent_at <= truth["t_recv"] <= truth["t_first"] <= r.first_token_at
    assert r.first_token_at <= truth["t_sent"]  # the kernel stamped it during the write
    assert r.first_token_at - truth["t_first"] < 0.05
    assert r.headers_at < r.first_token_at  # the role-only chunk came first
    assert all(b >= a for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False))


def test_completions_and_non_streaming(echo_thread: tuple[str, EchoServer]) -> None:
    url, _ = echo_thread
    r = send(url, api="completions")
    assert r.outcome == "ok" and len(r.chunk_times) == 6
    r = send(url, stream=False)
    assert r.outcome == "ok" and r.chunk_times == (r.ended_at,) and r.output_tokens == 6
    assert r.first_token_at == r.ended_at  # non-streaming TTFT = time to the full body


def test_http_error(echo_thread: tuple[str, EchoServer]) -> None:
    r = send(echo_thread[0], model="x-http-500")
    assert (r.outcome, r.status_code) == ("http_error", 500)
    assert r.error and "boom" in r.error


def test_broken_stream(echo_thread: tuple[str, EchoServer]) -> None:
    r = send(echo_thread[0], model="x-break")
    assert r.outcome == "broken_stream" and len(r.chunk_times) == 2


def test_timeout(echo_thread: tuple[str, EchoServer]) -> None:
    t0 = time.time()
    r = send(echo_thread[0], model="x-hang", timeout=0.3)
    assert r.outcome == "timeout"
    # The timeout counts from the call (connecting included); e2e from the write.
    assert r.ended_at - t0 >= 0.3 and r.e2e < 1.0 and r.sent_at >= t0


def test_connect_refused() -> None:
    port = free_port()  # nothing listens there (under xdist: in this worker's own range)
    r = send(f"http://127.0.0.1:{port}")
    assert r.outcome == "connect_error"


def test_keep_alive_reuse_and_stale_connection_retry() -> None:
    """A server that closes idle connections: the retry is invisible, one record."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    served: list[int] = []
    body = b'{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":1}}'

    def serve() -> None:
        for _ in range(2):
            conn, _ = srv.accept()
            conn.recv(65536)
            served.append(1)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            conn.close()  # keep-alive advertised, then closed: the next reuse is stale

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    c = StreamClient(f"http://127.0.0.1:{port}")
    wl = FixedWorkload(stream=False)
    r1, r2 = c.send(wl.request(1)), c.send(wl.request(2))
    assert (r1.outcome, r2.outcome) == ("ok", "ok")
    assert len(served) == 2
    srv.close()


@pytest.mark.parametrize("model", ["m", "x-http-500", "x-break"])
def test_secret_never_in_record(echo_thread: tuple[str, EchoServer], model: str) -> None:
    r = send(echo_thread[0], model=model)
    assert r.outcome in OUTCOMES
    assert SECRET not in repr(r)
