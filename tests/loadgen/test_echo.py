"""The echo server's zero-delay streams: one loop pass steps every due stream once."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from lbtune.loadgen.echo import EchoServer

REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s"
)


@pytest.fixture()
def zero_delay() -> Iterator[int]:
    """An in-process echo server with no delay before or between chunks."""
    srv = EchoServer(ttft=0.0, itl=0.0, keep_truth=False)
    ready = threading.Event()
    port: list[int] = []
    loop = asyncio.new_event_loop()

    def on_ready(p: int) -> None:
        port.append(p)
        ready.set()

    def run() -> None:
        with contextlib.suppress(RuntimeError):  # stopped by the fixture
            loop.run_until_complete(srv.serve("127.0.0.1", 0, on_ready))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(5)
    yield port[0]
    loop.call_soon_threadsafe(loop.stop)
    t.join(5)


def _stream(port: int, tokens: int) -> bytes:
    body = b'{"model":"m","stream":true,"max_tokens":%d}' % tokens
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(REQUEST % (len(body), body))
        got = b""
        while not got.endswith(b"0\r\n\r\n"):
            data = s.recv(65536)
            assert data, "the server closed the stream early"
            got += data
    return got


def test_concurrent_zero_delay_streams_get_every_chunk_in_order(zero_delay: int) -> None:
    results: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: results.append(_stream(zero_delay, 50))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(results) == 8
    for raw in results:
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        events = [e for e in body.split(b"\r\n") if e.startswith(b"data: ")]
        content = [e for e in events if b'"content":"tok "' in e]
        assert len(content) == 50
        assert events[0].startswith(b'data: {"choices":[{"index":0,"delta":{"role"')
        assert events[-1] == b"data: [DONE]\n\n"
        assert b'"completion_tokens":50' in events[-2]


class _Loop:
    """Records call_soon (a fake: the test is about how many callbacks one pass needs)."""

    def __init__(self) -> None:
        self.soon: list[Any] = []

    def call_soon(self, fn: Any) -> None:
        self.soon.append(fn)


class _Step:
    def __init__(self, loop: _Loop, log: list[str], name: str, fail: bool = False) -> None:
        self.c = type("C", (), {"loop": loop})()
        self.rid, self.log, self.fail = name, log, fail

    def step(self) -> None:
        self.log.append(self.rid)
        if self.fail:
            raise RuntimeError("boom")


def test_one_callback_per_pass_steps_every_due_stream_and_a_failure_stops_none() -> None:
    srv = EchoServer()
    loop, log = _Loop(), list[str]()
    streams = [_Step(loop, log, "a"), _Step(loop, log, "b", fail=True), _Step(loop, log, "c")]
    for st in streams:
        srv._soon(st)  # type: ignore[arg-type]
    assert len(loop.soon) == 1  # one callback for the pass, not one per chunk
    loop.soon.pop()()
    assert log == ["a", "b", "c"]  # b raised; c was still stepped
    srv._soon(streams[0])  # type: ignore[arg-type]
    assert len(loop.soon) == 1  # the next pass gets its own callback
