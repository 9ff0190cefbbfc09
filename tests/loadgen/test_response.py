"""Reading one response from hand-made reads (bytes, arrival time): no sockets."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lbtune.loadgen.kerneltime import Reader
from lbtune.loadgen.response import Closed, RequestState, read_body, read_stream
from lbtune.loadgen.wire import ResponseHead

ROLE = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
TOK = b'data: {"choices":[{"delta":{"content":"tok "}}]}\n\n'
DONE = b"data: [DONE]\n\n"


def chunk(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


def reader(*reads: tuple[bytes, float]) -> Reader:
    it: Iterator[tuple[bytes, float]] = iter(reads)
    return lambda: next(it, (b"", 99.0))


def state(timing: str = "loop") -> RequestState:
    st = RequestState()
    st.headers_at = st.lower = 1.0
    st.timing = timing  # type: ignore[assignment]
    return st


CHUNKED = ResponseHead(200, {"transfer-encoding": "chunked"})


def test_each_content_event_gets_its_reads_time() -> None:
    st = state()
    read = reader(
        (chunk(TOK), 2.0), (chunk(TOK) + chunk(TOK), 3.0), (chunk(DONE) + b"0\r\n\r\n", 4.0)
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
