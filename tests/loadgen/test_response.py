"""Reading one response from hand-made reads (bytes, arrival time): no sockets."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from lbtune.loadgen.kerneltime import RECV, SO_TIMESTAMPNS, Peek, Read, Reader
from lbtune.loadgen.response import Closed, RequestState, exchange, read_body, read_stream
from lbtune.loadgen.wire import ResponseHead

ROLE = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
TOK = b'data: {"choices":[{"delta":{"content":"tok "}}]}\n\n'
DONE = b"data: [DONE]\n\n"


def chunk(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


def reader(*reads: tuple[bytes, float], stamped: bool = True) -> Reader:
    """Reads of the given (bytes, time), each kernel-stamped or not (``stamped``)."""
    it: Iterator[Read] = iter((data, t, stamped) for data, t in reads)
    return lambda: next(it, (b"", 99.0, False))


def state(timing: str = "loop") -> RequestState:
    st = RequestState()
    st.headers_at = st.lower = 1.0
    st.stamped = timing == "kernel"
    st.timing = timing  # type: ignore[assignment]
    return st


CHUNKED = ResponseHead(200, {"transfer-encoding": "chunked"})


def test_each_content_event_gets_its_reads_time() -> None:
    st = state()
    read = reader(
        (chunk(TOK), 2.0),
        (chunk(TOK) + chunk(TOK), 3.0),
        (chunk(DONE) + b"0\r\n\r\n", 4.0),
        stamped=False,
    )
    assert read_stream(read, CHUNKED, chunk(ROLE), st) is True
    assert st.times == [2.0, 3.0, 3.0] and st.ended_at == 4.0
    assert st.first_bound is None  # loop stamps carry no bound


def test_kernel_first_event_alone_in_its_read_is_exact() -> None:
    st = state("kernel")
    read = reader((chunk(TOK), 2.0), (chunk(DONE) + b"0\r\n\r\n", 3.0))
    read_stream(read, CHUNKED, b"", st)
    assert st.times == [2.0] and st.first_bound == 0.0


def test_kernel_first_event_sharing_its_read_is_bounded_by_the_previous_read() -> None:
    st = state("kernel")
    read = reader((chunk(ROLE), 2.0), (chunk(TOK) + chunk(TOK), 5.0), (b"0\r\n\r\n", 6.0))
    read_stream(read, CHUNKED, b"", st)
    assert st.times == [5.0, 5.0]
    assert st.first_bound == pytest.approx(3.0)  # in (2.0, 5.0]


def test_content_length_stream_ends_at_its_length() -> None:
    body = ROLE + TOK + DONE
    head = ResponseHead(200, {"content-length": str(len(body))})
    st = state()
    assert read_stream(reader((body, 2.0)), head, b"", st) is True
    assert st.times == [2.0] and st.ended_at == 2.0


def test_a_stream_cut_before_its_end_is_closed() -> None:
    st = state()
    with pytest.raises(Closed) as e:
        read_stream(reader((chunk(TOK), 2.0)), CHUNKED, b"", st)
    assert e.value.got_bytes and st.times == [2.0] and st.ended_at == 99.0


def test_body_by_length_chunks_or_close() -> None:
    length = ResponseHead(200, {"content-length": "6"})
    assert read_body(reader((b"def", 2.0)), length, b"abc", 1.0) == (b"abcdef", 2.0)
    body = chunk(b"abc") + chunk(b"def") + b"0\r\n\r\n"
    assert read_body(reader((body[4:], 3.0)), CHUNKED, body[:4], 1.0) == (b"abcdef", 3.0)
    until_close = ResponseHead(200, {})
    assert read_body(reader((b"x", 2.0)), until_close, b"", 1.0) == (b"x", 99.0)
    with pytest.raises(Closed):
        read_body(reader(), length, b"abc", 1.0)


def test_an_unstamped_first_event_is_never_exact() -> None:
    """Alone in its read, but the kernel gave no stamp: the loop's time, with the whole
    interval since the last stamped read as its bound, and the request is marked."""
    st = state("kernel")
    read = reader((chunk(TOK), 2.0), (chunk(DONE) + b"0\r\n\r\n", 3.0), stamped=False)
    read_stream(read, CHUNKED, b"", st)
    assert st.times == [2.0] and st.first_bound == pytest.approx(1.0) and st.unstamped


def test_an_unstamped_read_does_not_move_the_lower_end() -> None:
    """The role chunk's read drained the socket but carries the loop's time (2.0, an
    upper bound of when it was read): the first token is bounded from 1.0, not 2.0."""
    st = state("kernel")
    got: Iterator[Read] = iter(
        [
            (chunk(ROLE), 2.0, False),
            (chunk(TOK) + chunk(TOK), 5.0, True),
            (chunk(DONE) + b"0\r\n\r\n", 6.0, True),
        ]
    )
    read_stream(lambda: next(got, (b"", 99.0, False)), CHUNKED, b"", st)
    assert st.times == [5.0, 5.0] and st.first_bound == pytest.approx(4.0)


class ScriptedSocket:
    """A socket whose write takes ``write_s`` and whose reads are scripted (bytes, stamp
    or ``None`` = no kernel stamp): each is what one ``recvmsg`` returns, or a peek
    (``MSG_PEEK``) of it, which ``recv`` then consumes."""

    def __init__(self, write_s: float, reads: list[tuple[bytes, float | None]]) -> None:
        self.write_s = write_s
        self.reads = reads
        self.wrote: tuple[float, float] = (0.0, 0.0)

    def sendall(self, data: bytes) -> None:
        t0 = time.time()
        time.sleep(self.write_s)
        self.wrote = (t0, time.time())

    def recvmsg(self, n: int, anc: int, flags: int = 0) -> tuple[bytes, list[Any], int, None]:
        data, t = self.reads[0] if self.reads else (b"", None)
        if flags & socket.MSG_PEEK:
            data = data[:n]
        elif self.reads:
            self.reads.pop(0)
        if t is None:
            return data, [], 0, None
        sec = int(t)
        cmsg = struct.pack("@ll", sec, round((t - sec) * 1e9))
        return data, [(socket.SOL_SOCKET, SO_TIMESTAMPNS, cmsg)], 0, None

    def recv(self, n: int) -> bytes:
        data, t = self.reads.pop(0)
        if n < len(data):
            self.reads.insert(0, (data[n:], t))
        return data[:n]


def test_the_write_is_inside_the_bound() -> None:
    """``sent_at`` is taken right before the write, and a slow write (20 ms: a busy
    loop or a preempted process) widens the bound: the request reached the wire
    within [sent_at, sent_at + send_bound]."""
    t0 = time.time()
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    sock = ScriptedSocket(
        0.02,
        [
            (head + chunk(ROLE), t0 + 0.03),
            (chunk(TOK), t0 + 0.08),
            (chunk(DONE) + b"0\r\n\r\n", t0 + 0.09),
        ],
    )
    st = RequestState()
    st.timing = "kernel"
    assert exchange(sock, b"GET / HTTP/1.1\r\n\r\n", st, "x-replica") is True
    assert st.sent_at <= sock.wrote[0] and sock.wrote[1] <= st.sent_at + st.send_bound
    assert st.send_bound >= 0.02 and st.first_bound == 0.0 and not st.unstamped
    assert st.times == [pytest.approx(t0 + 0.08)]


def test_an_unstamped_head_marks_the_request() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    t0 = time.time()
    sock = ScriptedSocket(
        0.0, [(head + chunk(ROLE), None), (chunk(TOK) + chunk(DONE) + b"0\r\n\r\n", t0 + 0.05)]
    )
    st = RequestState()
    st.timing = "kernel"
    exchange(sock, b"GET / HTTP/1.1\r\n\r\n", st, "x-replica")
    # The head's read set no lower end: the token is bounded from the write.
    assert st.unstamped and st.first_bound == pytest.approx(t0 + 0.05 - st.sent_at)


def test_a_head_that_came_alone_is_the_lower_end() -> None:
    """nginx and Envoy send the head before the first chunk. The head's read drained the
    socket, so a first token read together with later bytes arrived after the head's
    stamp: the bound runs from there, not from the write (a P99 bound near the whole
    TTFT put nginx studies' measurements out of trust in CI)."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    t0 = time.time()
    sock = ScriptedSocket(
        0.0,
        [
            (head, t0 + 0.03),
            (chunk(ROLE) + chunk(TOK) + chunk(TOK), t0 + 0.08),
            (chunk(DONE) + b"0\r\n\r\n", t0 + 0.09),
        ],
    )
    st = RequestState()
    st.timing = "kernel"
    exchange(sock, b"GET / HTTP/1.1\r\n\r\n", st, "x-replica")
    assert st.times == [pytest.approx(t0 + 0.08)] * 2 and not st.unstamped
    assert st.first_bound == pytest.approx(0.05, abs=1e-6)


class Queue(Peek):
    """The kernel's receive queue as :class:`Peek` sees it, for a script of arrivals.

    A model, not a socket: a real one merges segments when it likes, and this case
    needs them apart. Per the kernel's rule, a read is stamped with the arrival of the
    last segment it touched. Each batch of segments arrives just before the next read
    of the whole queue (``RECV`` bytes), so a test decides what came between reads.
    """

    __slots__ = ("batches", "queued")

    def __init__(self, *batches: list[tuple[bytes, float]]) -> None:
        self.batches = list(batches)
        self.queued: list[tuple[bytes, float]] = []

    def peek(self, n: int) -> Read:
        if n >= RECV and self.batches:
            self.queued += self.batches.pop(0)
        data, t = b"", 99.0
        for seg, at in self.queued:
            if len(data) >= n:
                break
            data, t = data + seg, at
        return data[:n], t, bool(data)

    def consume(self, n: int) -> None:
        while n > 0 and self.queued:
            seg, at = self.queued[0]
            self.queued[0] = (seg[n:], at)
            n -= min(n, len(seg))
            if not self.queued[0][0]:
                self.queued.pop(0)

    def read(self) -> Read:
        data, t, stamped = self.peek(RECV)
        self.consume(len(data))
        return data, t, stamped


def test_a_first_event_begun_in_an_earlier_read_is_bounded_from_that_read() -> None:
    """Token 1 arrives in two parts (3.0 completes it) and tokens 2 and 3 are queued
    behind it, each in its own segment, before the loop reads again. This read holds no
    mark of token 1 (it came with the earlier read), so its end must not be looked for
    by mark: that finds token 2's, whose own segment's stamp (4.0) would be claimed as
    exact. The interval [stamp - bound, stamp] must hold 3.0."""
    tok = chunk(TOK)
    cut = tok.index(b"tok ") + 2  # token 1's mark came with the earlier read
    q = Queue(
        [(chunk(ROLE) + tok[:cut], 2.0)],
        [(tok[cut:], 3.0), (tok, 4.0), (tok, 5.0)],
        [(chunk(DONE) + b"0\r\n\r\n", 6.0)],
    )
    st = state("kernel")
    st.lower = 1.0
    read_stream(q.read, CHUNKED, b"", st, q)
    assert len(st.times) == 3 and st.first_bound is not None
    assert st.times[0] - st.first_bound <= 3.0 <= st.times[0]
