"""HTTP/1.1 and Server-Sent-Events on the wire, as bytes: the generator's hot path.

Pure code (no sockets, no gevent) so that every edge case is tested with hand-made
byte streams. The design goal is that a streamed token costs a few C-level byte
operations, never a ``json.loads``:

* :class:`ChunkedDecoder` undoes ``Transfer-Encoding: chunked`` incrementally.
* :class:`SseScanner` splits the body into SSE events (``\\n\\n``-terminated) and
  counts the events whose ``"content"`` (chat) or ``"text"`` (completions) string
  is non-empty, by counting byte patterns. Role-only chat chunks
  (``"delta":{"role":"assistant"}``), empty-content chunks and the final
  ``finish_reason`` chunk therefore do not count as tokens. Only the event that
  carries ``"usage"`` with ``completion_tokens`` is parsed with :mod:`json`.

A JSON string value cannot contain an unescaped ``"``, so the pattern
``"content":"`` can only match a key, never text inside a token.
"""

from __future__ import annotations

import json
from itertools import repeat

__all__ = [
    "ChunkedDecoder",
    "ProtocolError",
    "ResponseHead",
    "SseScanner",
    "build_request",
    "first_content_at",
    "nonempty_at",
    "parse_head",
    "parse_json_body",
]

_DONE = b"data: [DONE]"
_USAGE = b'"completion_tokens"'


class ProtocolError(Exception):
    """The server sent something that is not HTTP/1.1 as expected."""


def build_request(
    host: str, path: str, body: bytes, headers: dict[str, str] | None = None
) -> bytes:
    """A complete HTTP/1.1 POST request (keep-alive, JSON body)."""
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}",
        "Content-Type: application/json",
        "Accept: text/event-stream, application/json",
        f"Content-Length: {len(body)}",
        "Connection: keep-alive",
    ]
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class ResponseHead:
    """Status line and the few headers the client acts on."""

    __slots__ = ("chunked", "content_length", "headers", "keep_alive", "status")

    def __init__(
        self,
        status: int,
        headers: dict[str, str],
    ) -> None:
        self.status = status
        self.headers = headers
        te = headers.get("transfer-encoding", "").lower()
        self.chunked = "chunked" in te
        cl = headers.get("content-length")
        self.content_length: int | None = int(cl) if cl is not None and not self.chunked else None
        conn = headers.get("connection", "").lower()
        self.keep_alive = conn != "close" and (self.chunked or self.content_length is not None)


def parse_head(raw: bytes) -> ResponseHead:
    """Parse the bytes before ``\\r\\n\\r\\n`` (status line and headers)."""
    try:
        text = raw.decode("latin-1")
        status_line, *header_lines = text.split("\r\n")
        version, code, *_ = status_line.split(" ", 2)
        if not version.startswith("HTTP/1."):
            raise ValueError(version)
        status = int(code)
    except (ValueError, IndexError) as e:
        raise ProtocolError(f"bad status line: {raw[:80]!r}") from e
    headers: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return ResponseHead(status, headers)


def _chunk_size(line: bytes) -> int:
    """A chunk-size line's size (hex; extensions after ``;`` ignored)."""
    try:
        return int(line, 16)  # the usual line: hex digits alone (int() strips blanks)
    except ValueError:
        pass
    field = line.split(b";", 1)[0].strip()
    try:
        return int(field, 16)
    except ValueError as e:
        raise ProtocolError(f"bad chunk size {field[:20]!r}") from e


def _whole_chunks(data: bytes) -> tuple[bytes, bool] | None:
    """(payload, done) of ``data`` when it is whole chunks, each size line bare hex and no
    payload holding a CRLF (a streamed response read chunk-aligned: the usual read);
    None otherwise (the caller decodes it byte by byte).

    Split on CRLF, such data alternates size lines and payloads and ends with an empty
    piece; it is taken only when every payload's length is its size line's value, which
    is exactly when decoding it chunk by chunk gives the same bytes. A zero size is the
    last chunk: taken only as the data's end (trailers go the long way).
    """
    parts = data.split(b"\r\n")
    if not len(parts) & 1 or parts[-1]:
        return None
    sizes = parts[0:-1:2]
    payloads = parts[1::2]
    lens = list(map(len, payloads))
    try:
        if lens != list(map(int, sizes, repeat(16))):
            return None
    except ValueError:  # an extension (``;``) or not hex: the long way says which
        return None
    if 0 not in lens:
        return (payloads[0] if len(payloads) == 1 else b"".join(payloads)), False
    if lens.index(0) != len(lens) - 1:
        return None  # bytes after the last chunk
    return b"".join(payloads[:-1]), True  # "0\r\n\r\n": the last chunk, no trailers


class ChunkedDecoder:
    """Incremental ``Transfer-Encoding: chunked`` decoder.

    ``feed(data)`` returns the payload bytes completed by ``data``; ``done`` turns
    true after the terminating zero-size chunk (trailers are skipped).
    """

    __slots__ = ("_buf", "_need", "done")

    def __init__(self) -> None:
        self._buf = b""
        self._need = 0  # payload bytes still expected in the current chunk (+2 for CRLF)
        self.done = False

    def feed(self, data: bytes) -> bytes:
        if self.done:  # trailers, or bytes after the body: not payload
            return b""
        if not self._buf and not self._need:
            whole = _whole_chunks(data)
            if whole is not None:
                payload, self.done = whole
                return payload
        buf = self._buf + data if self._buf else data
        self._buf = b""
        out: list[bytes] = []
        pos = 0
        n = len(buf)
        find = buf.find
        while pos < n:
            need = self._need
            if need == 0:  # a chunk-size line
                eol = find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > 1024:
                        raise ProtocolError("chunk-size line too long")
                    break
                size = _chunk_size(buf[pos:eol])
                pos = eol + 2
                if size == 0:
                    self.done = True  # trailers, if any, are ignored
                    return out[0] if len(out) == 1 else b"".join(out)
                end = pos + size
                if end + 2 <= n:  # the whole chunk and its CRLF: the usual read
                    out.append(buf[pos:end])
                    pos = end + 2
                else:
                    self._need = size
            elif need > 0:  # inside a chunk's payload
                take = need if need <= n - pos else n - pos
                out.append(buf[pos : pos + take])
                pos += take
                need -= take
                self._need = need if need else -1
            else:  # need == -1: the CRLF after a payload
                if n - pos < 2:
                    break
                pos += 2
                self._need = 0
        if pos < n:
            self._buf = buf[pos:]
        return out[0] if len(out) == 1 else b"".join(out)

    @property
    def between_chunks(self) -> bool:
        """Nothing of a next chunk has been fed (no size line, no payload byte)."""
        return not self._buf and self._need <= 0


class SseScanner:
    """Counts content events in an SSE body without parsing JSON per event.

    ``feed(payload)`` returns the number of content events completed by
    ``payload``; complete events only (up to the last ``\\n\\n``) are scanned, so a
    pattern split across two reads is seen once, whole.
    """

    __slots__ = (
        "_carry",
        "done",
        "first_content_seen",
        "usage_completion_tokens",
        "usage_prompt_tokens",
    )

    def __init__(self) -> None:
        self._carry = b""
        self.done = False
        self.first_content_seen = False
        self.usage_completion_tokens: int | None = None
        self.usage_prompt_tokens: int | None = None

    def feed(self, payload: bytes) -> int:
        data = self._carry + payload if self._carry else payload
        if data.endswith(b"\n\n"):  # whole events: the usual read
            region = data
            self._carry = b""
        else:
            cut = data.rfind(b"\n\n")
            if cut < 0:
                # Tolerate CRLF-delimited events as well.
                cut = data.rfind(b"\r\n\r\n")
                if cut < 0:
                    self._carry = data
                    return 0
            cut += 2
            region = data[:cut]
            self._carry = data[cut:]
        count = region.count
        n = count(b'"content":"') + count(b'"text":"')
        if b':""' in region:  # empty deltas (the role chunk) are not content
            n -= count(b'"content":""') + count(b'"text":""')
        if b'": "' in region:  # Python's default separators (rare on the wire)
            n += (
                count(b'"content": "')
                - count(b'"content": ""')
                + count(b'"text": "')
                - count(b'"text": ""')
            )
        if _USAGE in region:
            self._parse_usage(region)
        if _DONE in region:
            self.done = True
        if n:
            self.first_content_seen = True
        return n

    @property
    def pending(self) -> bool:
        """Part of an event came in an earlier read (it is carried, not yet complete)."""
        return bool(self._carry)

    def feed_first(self, payload: bytes) -> tuple[int, bool]:
        """:meth:`feed`, and whether the first content event it completed was the last
        thing in ``payload`` (``True``: no later byte shared the read with it).

        Used until the first content event: a read that also holds later bytes gets
        the arrival time of its *last* byte from the kernel, so the first event's
        time stamp is then only an upper bound.
        """
        data = self._carry + payload if self._carry else payload
        n = self.feed(payload)
        if n != 1 or self._carry:
            return n, False
        p = first_content_at(data)
        if p < 0:
            return n, False
        end = data.find(b"\n\n", p)
        if end < 0:
            end = data.find(b"\r\n\r\n", p)
        return n, end >= 0 and not data[end:].strip()

    def _parse_usage(self, region: bytes) -> None:
        at = region.find(_USAGE)
        start = region.rfind(b"data:", 0, at)
        end = region.find(b"\n", at)
        if start < 0:
            return
        line = region[start + 5 : end if end >= 0 else len(region)].strip()
        try:
            usage = json.loads(line).get("usage") or {}
        except (ValueError, AttributeError):
            return
        if isinstance(usage.get("completion_tokens"), int):
            self.usage_completion_tokens = usage["completion_tokens"]
        if isinstance(usage.get("prompt_tokens"), int):
            self.usage_prompt_tokens = usage["prompt_tokens"]


MARKS = (b'"content":"', b'"text":"', b'"content": "', b'"text": "')


def nonempty_at(data: bytes, pat: bytes) -> int:
    """Index of the first ``pat`` followed by a non-empty string, else -1."""
    i = data.find(pat)
    while i >= 0 and data[i + len(pat) : i + len(pat) + 1] == b'"':
        i = data.find(pat, i + 1)
    return i


def first_content_at(data: bytes) -> int:
    """Index of the first content mark (any of :data:`MARKS`) with a non-empty string, else -1."""
    return min((i for i in (nonempty_at(data, m) for m in MARKS) if i >= 0), default=-1)


def parse_json_body(body: bytes) -> tuple[int, int | None, int | None]:
    """Non-streaming response: (content pieces, completion_tokens, prompt_tokens)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return 0, None, None
    usage = doc.get("usage") or {} if isinstance(doc, dict) else {}
    n = 0
    for ch in doc.get("choices") or () if isinstance(doc, dict) else ():
        msg = ch.get("message") or {}
        if (msg.get("content") if isinstance(msg, dict) else None) or ch.get("text"):
            n += 1
    ct = usage.get("completion_tokens")
    pt = usage.get("prompt_tokens")
    return n, ct if isinstance(ct, int) else None, pt if isinstance(pt, int) else None
