"""Kernel time stamps keep event-loop lag out of TTFT.

A scripted server (a thread with plain blocking sockets) sends the first content
chunk while the test blocks the gevent loop with a busy loop; the order of events
is forced with threading events, not sleeps. With kernel stamps the recorded first
token is the chunk's arrival; with loop stamps it is the end of the block.
"""

from __future__ import annotations

import socket
import threading
import time

import gevent
import pytest

from lbtune.loadgen.client import StreamClient
from lbtune.loadgen.kerneltime import (
    KERNEL_TIMESTAMPS,
    Peek,
    enable,
    hold,
    kernel_reader,
    loop_reader,
)
from lbtune.loadgen.source import FixedWorkload
from lbtune.records.requests import RequestRecord

pytestmark = pytest.mark.skipif(not KERNEL_TIMESTAMPS, reason="kernel stamps are Linux-only")

BLOCK_AFTER_S = 0.15
"""The loop stays blocked at least this long after the first chunk was sent."""


def _chunk(event: bytes) -> bytes:
    data = b"data: " + event + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


ROLE = _chunk(b'{"choices":[{"delta":{"role":"assistant","content":""}}]}')
TOK = _chunk(b'{"choices":[{"delta":{"content":"tok "}}]}')
TAIL = _chunk(b'{"choices":[],"usage":{"completion_tokens":3}}') + _chunk(b"[DONE]") + b"0\r\n\r\n"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class Scripted:
    """One request: head + role at once; token 1 (and, if ``coalesce``, token 2) while
    the loop is blocked; the rest after the block."""

    def __init__(self, coalesce: bool) -> None:
        self.coalesce = coalesce
        self.answered = threading.Event()
        self.blocking = threading.Event()
        self.sent_first = threading.Event()
        self.unblocked = threading.Event()
        self.t_first = 0.0
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(1)
        self.url = f"http://127.0.0.1:{self.srv.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.srv.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(65536)
            conn.sendall(HEAD + ROLE)
            self.answered.set()
            if not self.blocking.wait(10):
                return
            time.sleep(0.02)  # well inside the block (which waits for sent_first)
            self.t_first = time.time()
            conn.sendall(TOK)
            if self.coalesce:
                time.sleep(0.03)
                conn.sendall(TOK)
            self.sent_first.set()
            if not self.unblocked.wait(10):
                return
            conn.sendall(TOK if self.coalesce else TOK + TOK)
            conn.sendall(TAIL)
            conn.recv(1)  # until the client closes


def measure(coalesce: bool, kernel: bool) -> tuple[RequestRecord, Scripted, float]:
    srv = Scripted(coalesce)
    client = StreamClient(srv.url, kernel_timestamps=kernel)
    g = gevent.spawn(client.send, FixedWorkload(output_tokens=3).request(0))
    deadline = time.monotonic() + 10
    while not srv.answered.is_set() and time.monotonic() < deadline:
        gevent.sleep(0.005)  # the loop runs: g connects, sends, and reads the head
    gevent.sleep(0.02)
    srv.blocking.set()
    assert srv.sent_first.wait(10)  # from here on the gevent loop is blocked
    t_sent = time.time()
    end = time.perf_counter() + BLOCK_AFTER_S
    while time.perf_counter() < end:  # the busy loop: no greenlet runs meanwhile
        pass
    # Let the client read what was sent during the block (its open request then has a
    # TTFT) before the server sends the rest, so no later byte shares that read.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        snap = client.open.snapshot()
        if not snap or snap[0].ttft is not None:
            break
        gevent.sleep(0.001)
    srv.unblocked.set()
    rec = g.get(timeout=10)
    client.close()
    srv.thread.join(5)
    srv.srv.close()
    return rec, srv, t_sent


def test_first_token_is_its_arrival_not_the_end_of_the_block() -> None:
    rec, srv, t_sent = measure(coalesce=False, kernel=True)
    assert rec.outcome == "ok" and rec.timing == "kernel"
    assert rec.first_token_at is not None and rec.first_token_bound_s is not None
    # Arrival is microseconds after the server's stamp; the block ended >= 150 ms later.
    # The bound is the write's duration only (the stamp is exact): far below the block.
    assert srv.t_first <= rec.first_token_at < srv.t_first + BLOCK_AFTER_S / 3
    assert rec.first_token_at <= t_sent
    assert rec.first_token_bound_s < BLOCK_AFTER_S / 3
    # ... all of it the write's: the first token was not read late.
    assert rec.send_bound_s == rec.first_token_bound_s and rec.read_bound_s == 0.0


def test_without_kernel_stamps_the_block_is_in_the_ttft() -> None:
    """The control: the same script with loop stamps fails the assertion above."""
    rec, srv, _ = measure(coalesce=False, kernel=False)
    assert rec.outcome == "ok" and rec.timing == "loop" and rec.first_token_bound_s is None
    assert rec.first_token_at is not None
    assert rec.first_token_at >= srv.t_first + BLOCK_AFTER_S


def test_a_coalesced_first_token_is_bounded() -> None:
    """Token 2 arrived before the loop read token 1. The stamp is token 1's own arrival
    where the kernel kept its segment apart, else token 2's arrival with a bound that
    reaches back to token 1's; either way the interval [stamp - bound, stamp] holds
    token 1's arrival, and the bound never reaches the end of the block."""
    rec, srv, _ = measure(coalesce=True, kernel=True)
    assert rec.outcome == "ok" and rec.first_token_at is not None
    b = rec.first_token_bound_s
    assert b is not None
    assert rec.first_token_at - b <= srv.t_first <= rec.first_token_at
    assert rec.first_token_at < srv.t_first + BLOCK_AFTER_S / 3
    assert rec.chunk_times[1] >= rec.first_token_at


def test_a_read_carries_the_kernels_arrival_time() -> None:
    """Bytes that wait unread keep the time they came, not the time they were read.

    The kernel turns its stamping on lazily (from a work queue) when the first socket
    asks; :func:`hold` keeps it on for the process and waits until it is. The read must
    say the kernel stamped it, and the stamp must be the arrival: a loop time (taken
    after the 50 ms wait) or a missing stamp fails.
    """
    assert hold()
    with socket.create_server(("127.0.0.1", 0)) as srv:
        a = socket.create_connection(srv.getsockname())
        b, _ = srv.accept()
        with a, b:
            assert enable(b)
            t0 = time.time()
            a.sendall(b"x")
            deadline = time.monotonic() + 10
            peek = Peek(b)
            while not peek.peek(1)[0]:  # queued (MSG_PEEK leaves it there)
                assert time.monotonic() < deadline
            t1 = time.time()
            time.sleep(0.05)  # the read comes late; its stamp must not
            data, t, stamped = kernel_reader(b)()
            assert data == b"x" and stamped and t0 <= t <= t1
            a.close()
            data, t, stamped = loop_reader(b)()
            assert data == b"" and not stamped  # EOF


def test_an_unstamped_read_says_so() -> None:
    """Without SO_TIMESTAMPNS on the socket the kernel gives no stamp: the read carries
    the loop's time and says it is not the kernel's."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        a = socket.create_connection(srv.getsockname())
        b, _ = srv.accept()
        with a, b:
            a.sendall(b"x")
            deadline = time.monotonic() + 10
            while not Peek(b).peek(1)[0]:
                assert time.monotonic() < deadline
            t0 = time.time()
            data, t, stamped = kernel_reader(b)()
            assert data == b"x" and not stamped and t >= t0


def _queued_pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    srv = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    assert hold() and enable(b)
    return srv, a, b


def _peek_all(b: socket.socket, n: int) -> tuple[bytes, float, bool]:
    peek = Peek(b)
    deadline = time.monotonic() + 10
    while True:
        got = peek.peek(65536)
        if len(got[0]) >= n:
            return got
        assert time.monotonic() < deadline


def test_a_first_event_that_ends_the_read_is_exact() -> None:
    """Through HAProxy a chunk's closing CRLF comes with the next chunk, so the first
    content event is the last thing in its read: the read's stamp (its last byte's
    arrival) is then the event's own arrival, and the time is exact. When a later
    event shares the same segment, the time stays inexact (the control)."""
    event = TOK[: TOK.index(b"\n\n") + 2]  # "size CRLF data: ... \n\n", no chunk CRLF yet
    srv, a, b = _queued_pair()
    with srv, a, b:
        a.sendall(event)
        data, t, stamped = _peek_all(b, len(event))
        assert stamped and data == event
        assert Peek(b).first_event_arrival(data, t) == (t, True)
    srv, a, b = _queued_pair()
    with srv, a, b:
        a.sendall(TOK + TOK)  # one write: the second event shares the first's segment
        data, t, stamped = _peek_all(b, 2 * len(TOK))
        assert stamped
        assert Peek(b).first_event_arrival(data, t)[1] is False


class _SendsBetweenPeeks:
    """A real socket whose first ``recvmsg`` is followed by a write from the peer (and
    a wait until its bytes are queued): the bytes arrive between the event's peeks,
    at a moment no real load can be made to hit on purpose."""

    def __init__(self, b: socket.socket, a: socket.socket, more: bytes) -> None:
        self.b, self.a, self.more = b, a, more
        self.recv = b.recv
        self.calls = 0

    def recvmsg(
        self, n: int, anc: int, flags: int = 0
    ) -> tuple[bytes, list[tuple[int, int, bytes]], int, object]:
        got = self.b.recvmsg(n, anc, flags)
        self.calls += 1
        if self.calls == 1:
            queued = len(self.b.recv(65536, socket.MSG_PEEK))
            self.a.sendall(self.more)
            _peek_all(self.b, queued + len(self.more))
        return got


def test_a_stamp_that_moves_between_peeks_is_not_claimed_exact() -> None:
    """Token 2 was merged into token 1's segment (which took token 2's arrival), and
    token 3 arrives between the peeks for token 1's end and the byte after it, merged
    into the same segment: the two stamps differ though no boundary lies between them.
    Seen in CI (256 streams beside a busy loop): a first token claimed exact 30 ms after
    the server's write. The event's own stamp moved, so the time is not exact."""
    srv, a, b = _queued_pair()
    with srv, a, b:
        a.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        a.sendall(TOK)
        _, t_one, _ = _peek_all(b, len(TOK))
        a.sendall(TOK)
        data, t, stamped = _peek_all(b, 2 * len(TOK))
        assert stamped and t > t_one  # the merge: the segment took token 2's arrival
        assert Peek(b).first_event_arrival(data, t)[1] is False  # no race: one segment
        racy = _SendsBetweenPeeks(b, a, TOK)
        arrival, exact = Peek(racy).first_event_arrival(data, t)
        assert racy.calls >= 2 and b.recv(65536, socket.MSG_PEEK) == TOK * 3
        assert Peek(b).peek(len(TOK))[1] > t  # the premise: token 3 moved the stamp
        assert not exact and arrival == t
