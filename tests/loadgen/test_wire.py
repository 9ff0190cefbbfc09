"""Chunked decoding and SSE content detection on hand-made byte streams."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbtune.loadgen.wire import ChunkedDecoder, ProtocolError, SseScanner, parse_head

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
ROLE_EMPTY = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOK = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\n\n'
TOK_SPACED = b'data: {"choices": [{"delta": {"content": "yo"}}]}\n\n'
TEXT = b'data: {"choices":[{"index":0,"text":" the","finish_reason":null}]}\n\n'
EMPTY_TEXT = b'data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}]}\n\n'
QUOTE = b'data: {"choices":[{"delta":{"content":"\\"content\\":\\"x"}}]}\n\n'
FINISH = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3}}\n\n'
DONE = b"data: [DONE]\n\n"


def chunked(*events: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


def scan(stream: bytes, split: int | None = None) -> tuple[int, SseScanner]:
    sc = SseScanner()
    if split is None:
        return sc.feed(stream), sc
    n = sum(sc.feed(stream[i : i + split]) for i in range(0, len(stream), split))
    return n, sc


def test_role_only_and_empty_chunks_do_not_count() -> None:
    n, sc = scan(ROLE + ROLE_EMPTY + FINISH + EMPTY_TEXT + USAGE + DONE)
    assert n == 0
    assert not sc.first_content_seen
    assert sc.done
    assert sc.usage_completion_tokens == 3


def test_content_chunks_counted_both_apis_and_separators() -> None:
    n, sc = scan(ROLE + TOK + TOK_SPACED + TEXT + QUOTE + FINISH + USAGE + DONE)
    assert n == 4  # the escaped '"content":"' inside a token is not a key
    assert sc.usage_completion_tokens == 3 and sc.usage_prompt_tokens == 12


@pytest.mark.parametrize("split", [1, 2, 3, 7, 13, 64])
def test_split_across_reads(split: int) -> None:
    stream = ROLE + TOK * 5 + FINISH + USAGE + DONE
    n, sc = scan(stream, split)
    assert n == 5
    assert sc.done and sc.usage_completion_tokens == 3


@pytest.mark.parametrize("split", [1, 2, 5, 9, 1000])
def test_chunked_decoding_any_split(split: int) -> None:
    events = [ROLE, TOK, TOK, USAGE, DONE]
    raw = chunked(*events)
    dec = ChunkedDecoder()
    out = b"".join(dec.feed(raw[i : i + split]) for i in range(0, len(raw), split))
    assert out == b"".join(events)
    assert dec.done


def test_chunked_extension_and_bad_size() -> None:
    dec = ChunkedDecoder()
    assert dec.feed(b"2;ext=1\r\nab\r\n0\r\n\r\n") == b"ab"
    assert dec.done
    with pytest.raises(ProtocolError):
        ChunkedDecoder().feed(b"zz\r\nab\r\n")


def test_chunk_boundary_inside_an_event() -> None:
    # One SSE event split over two HTTP chunks, the split inside the key.
    half = TOK.index(b"conte") + 3
    raw = chunked(TOK[:half], TOK[half:])
    dec, sc = ChunkedDecoder(), SseScanner()
    n = sum(sc.feed(dec.feed(raw[i : i + 4])) for i in range(0, len(raw), 4))
    assert n == 1


def test_parse_head() -> None:
    h = parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Lbtune-Replica: h100-0")
    assert h.status == 200 and h.chunked and h.keep_alive
    assert h.headers["x-lbtune-replica"] == "h100-0"
    h = parse_head(b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\nConnection: close")
    assert h.status == 503 and h.content_length == 0 and not h.keep_alive
    with pytest.raises(ProtocolError):
        parse_head(b"garbage")


def _reference_dechunk(raw: bytes) -> bytes:
    """RFC 9112 chunked decoding, whole body at once: the decoder's yardstick."""
    out: list[bytes] = []
    pos = 0
    while True:
        eol = raw.index(b"\r\n", pos)
        size = int(raw[pos:eol].split(b";", 1)[0].strip(), 16)
        pos = eol + 2
        if size == 0:
            return b"".join(out)
        out.append(raw[pos : pos + size])
        pos += size + 2


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(min_size=1, max_size=40), max_size=12),
    st.lists(st.booleans(), max_size=12),
    st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=30),
)
def test_chunked_decoding_equals_the_reference_for_any_reads(
    payloads: list[bytes], extensions: list[bool], reads: list[int]
) -> None:
    """Whatever the chunks (sizes, extensions) and however the bytes are cut into reads,
    the incremental decoder gives what whole-body decoding gives, and nothing after the
    terminating chunk."""
    raw = b"".join(
        b"%x%s\r\n%s\r\n" % (len(p), b";x=1" if i < len(extensions) and extensions[i] else b"", p)
        for i, p in enumerate(payloads)
    )
    raw += b"0\r\n\r\n"
    dec, got, pos, i = ChunkedDecoder(), [], 0, 0
    while pos < len(raw):
        step = reads[i % len(reads)]
        got.append(dec.feed(raw[pos : pos + step]))
        pos, i = pos + step, i + 1
    assert b"".join(got) == _reference_dechunk(raw) == b"".join(payloads)
    assert dec.done
    assert dec.feed(b"5\r\nhello\r\n") == b""
