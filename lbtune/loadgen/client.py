"""The streaming OpenAI client used by :class:`~lbtune.loadgen.user.LLMUser`.

Raw gevent sockets, HTTP/1.1 keep-alive; the bytes are handled by
:mod:`lbtune.loadgen.wire` (no per-line JSON). Response time stamps come from the
kernel: on plain TCP the socket has ``SO_TIMESTAMPNS`` set and every read is a
``recvmsg`` whose ancillary data carries the arrival time (``CLOCK_REALTIME``, the
clock of ``time.time()``) of the last byte it returned, so however late the event
loop gets to a socket, the stamp is when the bytes came. A read that returns the
first content event together with later bytes only bounds its arrival (the kernel
keeps one time per read): the record's ``first_token_bound_s`` says by how much.
Over TLS (records cannot be matched to segments) or where the kernel gives no
stamp, reads are stamped with ``time.time()`` and the record says ``timing="loop"``.
Send times are ``time.time()`` right before the request is written.

Every call of :meth:`StreamClient.send` returns exactly one
:class:`~lbtune.loadgen.records.RequestRecord` with exactly one outcome:

* ``ok`` — 2xx and the body ended (``[DONE]``, or the chunked/Content-Length end);
* ``http_error`` — non-2xx status (kept in ``status_code``);
* ``broken_stream`` — the connection closed or reset before the end;
* ``timeout`` — the per-request timeout (whole request, headers to end) fired;
* ``connect_error`` — no TCP (or TLS) connection could be made.

Non-streaming requests: TTFT is the time to the complete body (the first moment
any content is usable), and ``chunk_times`` holds that one time.

The API key (``LBTUNE_API_KEY`` or ``OPENAI_API_KEY``) is sent as a bearer token
and is scrubbed from error strings; it never reaches a record.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import ssl
import struct
import sys
from collections.abc import Callable
from time import time
from typing import Any
from urllib.parse import urlsplit

import gevent
from gevent import socket as gsocket

from lbtune.loadgen.records import OpenRequest, Outcome, RequestRecord, Timing
from lbtune.loadgen.wire import (
    MARKS,
    ChunkedDecoder,
    ProtocolError,
    ResponseHead,
    SseScanner,
    build_request,
    nonempty_at,
    parse_head,
    parse_json_body,
)
from lbtune.scenario.request import RequestSpec

__all__ = ["OpenSet", "StreamClient", "api_key_from_env"]

_RECV = 65536
_SO_TIMESTAMPNS = 35
"""``SO_TIMESTAMPNS_OLD`` = ``SCM_TIMESTAMPNS_OLD`` (asm-generic; Python has no constant):
the ancillary data is a native ``struct timespec``."""
_TIMESPEC = struct.Struct("@ll")
_ANC = socket.CMSG_SPACE(_TIMESPEC.size)
KERNEL_TIMESTAMPS = sys.platform.startswith("linux") and platform.machine() in (
    "x86_64",
    "aarch64",
    "arm64",
    "riscv64",
    "ppc64le",
)
"""Architectures whose socket option numbers are asm-generic's."""

Reader = Callable[[], tuple[bytes, float]]
"""One read of a response: (bytes, arrival time of the last byte); ``b""`` at EOF."""


def api_key_from_env() -> str | None:
    """``LBTUNE_API_KEY``, else ``OPENAI_API_KEY``, else ``None``."""
    return os.environ.get("LBTUNE_API_KEY") or os.environ.get("OPENAI_API_KEY") or None


class OpenSet:
    """The requests of one generator process that were sent and have not ended."""

    def __init__(self) -> None:
        self._states: dict[int, _State] = {}

    def __len__(self) -> int:
        return len(self._states)

    def add(self, st: _State) -> None:
        self._states[id(st)] = st

    def discard(self, st: _State) -> None:
        self._states.pop(id(st), None)

    def snapshot(self) -> tuple[OpenRequest, ...]:
        """Every open request now: its send time and, once streamed content came, its TTFT."""
        return tuple(
            OpenRequest(
                st.sent_at,
                st.times[0] - st.sent_at if st.stream and st.times else None,
                st.stream,
            )
            for st in list(self._states.values())
        )


class _RequestTimeout(Exception):
    pass


class _Closed(Exception):
    """The peer closed (or reset) the connection; ``got_bytes`` says if anything came."""

    def __init__(self, got_bytes: bool) -> None:
        super().__init__("connection closed by peer")
        self.got_bytes = got_bytes


class StreamClient:
    """One keep-alive connection pool to one base URL (one per Locust user)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        replica_header: str = "X-Lbtune-Replica",
        timeout_s: float = 120.0,
        connect_timeout_s: float = 5.0,
        worker: str = "local",
        id_prefix: str = "lbt-",
        open_set: OpenSet | None = None,
        kernel_timestamps: bool = True,
    ) -> None:
        """``kernel_timestamps=False`` stamps reads with ``time.time()`` (for comparison)."""
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"target URL must be http(s)://host[:port], got {base_url!r}")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self._tls = ssl.create_default_context() if u.scheme == "https" else None
        self.timing: Timing = (
            "kernel" if kernel_timestamps and KERNEL_TIMESTAMPS and self._tls is None else "loop"
        )
        self._host_header = f"{self.host}:{self.port}" if u.port else self.host
        self._api_key = api_key
        self._replica_header = replica_header.lower()
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.worker = worker
        self.id_prefix = id_prefix
        self._idle: list[Any] = []
        self.in_flight = 0
        self.open = open_set if open_set is not None else OpenSet()

    def close(self) -> None:
        for s in self._idle:
            s.close()
        self._idle.clear()

    # -- one request -------------------------------------------------------------

    def send(
        self, spec: RequestSpec, *, scheduled_at: float | None = None, request_id: str = ""
    ) -> RequestRecord:
        rid = request_id or f"{self.id_prefix}{spec.index}"
        headers = {"x-request-id": rid}
        if spec.priority is not None:
            headers["priority"] = str(spec.priority)
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        body = json.dumps(spec.body(), separators=(",", ":")).encode()
        req = build_request(self._host_header, self.prefix + spec.path(), body, headers)
        st = _State()
        st.stream = spec.stream
        st.timing = self.timing
        self.in_flight += 1
        st.sent_at = time()
        self.open.add(st)
        timer = gevent.Timeout.start_new(self.timeout_s, _RequestTimeout)
        sock = None
        outcome: Outcome = "ok"
        cut: BaseException | None = None
        try:
            sock, reused = self._checkout()
            try:
                keep = self._exchange(sock, req, spec.stream, st)
            except (_Closed, ConnectionResetError, BrokenPipeError):
                if not reused or st.got_bytes:
                    raise
                sock.close()  # a stale keep-alive connection: retry once on a fresh one
                sock = self._connect()
                keep = self._exchange(sock, req, spec.stream, st)
            if keep:
                self._idle.append(sock)
                sock = None
            if st.status is not None and not 200 <= st.status < 300:
                outcome = "http_error"
                st.error = f"HTTP {st.status}: {st.error_body}"
        except _RequestTimeout:
            outcome, st.error = "timeout", f"no end after {self.timeout_s:g} s"
        except _ConnectFailed as e:
            outcome, st.error = "connect_error", str(e.__cause__ or e)
        except (_Closed, OSError, ProtocolError) as e:
            outcome, st.error = "broken_stream", f"{type(e).__name__}: {e}"
        except gevent.GreenletExit as e:
            # Killed when the test stopped: still one record, carried on the exception.
            outcome, st.error, cut = "cancelled", "cut off when the test stopped", e
        finally:
            timer.close()
            self.in_flight -= 1
            self.open.discard(st)
            if sock is not None:
                sock.close()
        ended = st.ended_at if st.ended_at is not None else time()
        sc = st.scanner
        out_tokens, in_tokens = (
            (st.usage_out, st.usage_in)
            if sc is None
            else (sc.usage_completion_tokens, sc.usage_prompt_tokens)
        )
        if out_tokens is None and sc is not None:
            out_tokens = len(st.times)  # no usage chunk: count content chunks
        rec = RequestRecord(
            request_id=rid,
            index=spec.index,
            model=spec.model,
            api=spec.api,
            stream=spec.stream,
            sent_at=st.sent_at,
            ended_at=ended,
            outcome=outcome,
            status_code=st.status,
            scheduled_at=scheduled_at,
            headers_at=st.headers_at,
            first_token_at=st.times[0] if st.times else None,
            chunk_times=tuple(st.times),
            prompt_tokens=in_tokens if in_tokens is not None else spec.prompt_tokens,
            output_tokens=out_tokens,
            replica=st.replica,
            error=self._scrub(st.error),
            priority=spec.priority,
            prefix_group=spec.prefix_group,
            session_id=spec.session_id,
            worker=self.worker,
            timing=st.timing,
            first_token_bound_s=st.first_bound if spec.stream else None,
        )
        if cut is not None:
            cut.record = rec  # type: ignore[attr-defined]
            raise cut
        return rec

    def _scrub(self, text: str | None) -> str | None:
        if text and self._api_key:
            return text.replace(self._api_key, "***")
        return text

    # -- connections -------------------------------------------------------------

    def _checkout(self) -> tuple[Any, bool]:
        if self._idle:
            return self._idle.pop(), True
        return self._connect(), False

    def _connect(self) -> Any:
        try:
            sock = gsocket.create_connection((self.host, self.port), self.connect_timeout_s)
            sock.setsockopt(gsocket.IPPROTO_TCP, gsocket.TCP_NODELAY, 1)
            if self.timing == "kernel":
                try:
                    sock.setsockopt(gsocket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                except OSError:
                    self.timing = "loop"
            if self._tls is not None:
                from gevent import ssl as gssl

                ctx = gssl.create_default_context()
                sock = ctx.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(None)
            return sock
        except OSError as e:
            raise _ConnectFailed(f"cannot connect to {self.host}:{self.port}") from e

    # -- the wire ----------------------------------------------------------------

    def _exchange(self, sock: Any, req: bytes, stream: bool, st: _State) -> bool:
        """Send ``req`` and read the whole response into ``st``; True = reusable."""
        read = _kernel_reader(sock) if st.timing == "kernel" else _loop_reader(sock)
        sock.sendall(req)
        buf = b""
        lower = st.sent_at
        while True:
            data, t = read()
            if not data:
                st.ended_at = t
                raise _Closed(got_bytes=bool(buf))
            st.got_bytes = True
            buf += data
            i = buf.find(b"\r\n\r\n")
            if i >= 0:
                break
            if len(buf) > 65536:
                raise ProtocolError("response head larger than 64 KiB")
            if len(data) < _RECV:  # the queue was drained: later bytes arrived after t
                lower = t
        st.headers_at = t
        st.lower = lower
        head = parse_head(buf[:i])
        st.status = head.status
        st.replica = head.headers.get(self._replica_header)
        rest = buf[i + 4 :]
        ok_status = 200 <= head.status < 300
        if not ok_status or not stream:
            body, st.ended_at = _read_body(read, head, rest, t)
            if ok_status:
                n, st.usage_out, st.usage_in = parse_json_body(body)
                if n:
                    st.times.append(st.ended_at)
            else:
                st.error_body = body[:160].decode("utf-8", "replace")
            return head.keep_alive
        peek = _Peek(sock) if st.timing == "kernel" else None
        return _read_stream(read, head, rest, st, peek)


def _kernel_reader(sock: Any) -> Reader:
    """Reads stamped with the kernel's arrival time of their last byte."""
    recvmsg = sock.recvmsg
    unpack = _TIMESPEC.unpack
    size = _TIMESPEC.size

    def read() -> tuple[bytes, float]:
        data, anc, _flags, _addr = recvmsg(_RECV, _ANC)
        if anc:
            cdata = anc[0][2]
            if len(cdata) == size:
                sec, nsec = unpack(cdata)
                return data, sec + nsec * 1e-9
        return data, time()  # EOF, or a segment the kernel did not stamp

    return read


class _Peek:
    """Reads that leave the bytes queued (``MSG_PEEK``), for the first content event.

    The kernel stamps a read with the arrival of the last segment it touched, so a
    peek of ``n`` bytes tells when byte ``n - 1`` arrived. That recovers the first
    event's own arrival when later bytes were already queued behind it, as long as
    the kernel kept them in separate segments (it merges some).
    """

    __slots__ = ("_recv", "_recvmsg")

    def __init__(self, sock: Any) -> None:
        self._recvmsg = sock.recvmsg
        self._recv = sock.recv

    def peek(self, n: int) -> tuple[bytes, float]:
        data, anc, _flags, _addr = self._recvmsg(n, _ANC, socket.MSG_PEEK)
        if anc and len(anc[0][2]) == _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack(anc[0][2])
            return data, sec + nsec * 1e-9
        return data, time()

    def consume(self, n: int) -> None:
        while n > 0:  # the bytes are queued: this never waits
            got = len(self._recv(n))
            if not got:
                return
            n -= got

    def first_event_arrival(self, data: bytes, t: float) -> tuple[float, bool]:
        """(arrival, exact) of the first content event in the peeked ``data``."""
        p = min((i for i in (nonempty_at(data, m) for m in MARKS) if i >= 0), default=-1)
        end = data.find(b"\n\n", p) if p >= 0 else -1
        if end < 0:
            return t, False
        end += 2
        if data[end : end + 2] == b"\r\n":  # the HTTP chunk's own end, same write
            end += 2
        if end >= len(data):
            return t, False
        d1, t1 = self.peek(end)  # stamp of the segment holding the event's last byte
        d2, t2 = self.peek(end + 1)  # ... and of the next byte's
        if len(d1) < end or len(d2) < end + 1:
            return t, False
        return t1, t1 != t2  # different segments: nothing later was merged into it


def _loop_reader(sock: Any) -> Reader:
    """Reads stamped with ``time.time()`` when the loop got to them (TLS)."""
    recv = sock.recv

    def read() -> tuple[bytes, float]:
        data = recv(_RECV)
        return data, time()

    return read


class _ConnectFailed(Exception):
    pass


class _State:
    __slots__ = (
        "ended_at",
        "error",
        "error_body",
        "first_bound",
        "got_bytes",
        "headers_at",
        "lower",
        "replica",
        "scanner",
        "sent_at",
        "status",
        "stream",
        "times",
        "timing",
        "usage_in",
        "usage_out",
    )

    def __init__(self) -> None:
        self.sent_at = 0.0
        self.headers_at: float | None = None
        self.ended_at: float | None = None
        self.got_bytes = False
        self.status: int | None = None
        self.stream = True
        self.timing: Timing = "loop"
        self.lower = 0.0
        self.first_bound: float | None = None
        self.replica: str | None = None
        self.times: list[float] = []
        self.scanner: SseScanner | None = None
        self.error: str | None = None
        self.error_body = ""
        self.usage_in: int | None = None
        self.usage_out: int | None = None


def _read_stream(
    read: Reader, head: ResponseHead, rest: bytes, st: _State, peek: _Peek | None = None
) -> bool:
    """Read an SSE body, stamping content chunks; True = connection reusable.

    Until the first content event, reads are peeks (``peek``, kernel stamps only), so
    that when the first event shares a read with later bytes its own segment's stamp
    can still be had; each read's lower time bound (the previous read's stamp, once
    that read drained the socket) is kept: a stamp that is not exact lies in
    (lower, stamp], and ``st.first_bound`` says how wide that is.
    """
    sc = st.scanner = SseScanner()
    times = st.times
    t = st.headers_at or time()
    lower = st.lower
    kernel = st.timing == "kernel"
    dec = ChunkedDecoder() if head.chunked else None
    remaining = head.content_length
    data = rest
    peeked = False
    while True:
        if data:
            payload = dec.feed(data) if dec is not None else data
            if payload:
                if times:
                    k = sc.feed(payload)
                    if k:
                        if k == 1:
                            times.append(t)
                        else:
                            times.extend([t] * k)
                else:
                    k, alone = sc.feed_first(payload)
                    if k:
                        t1, exact = t, alone and (dec is None or dec.between_chunks)
                        if peeked and not exact:
                            assert peek is not None
                            t1, exact = peek.first_event_arrival(data, t)
                        times.append(t1)
                        if k > 1:
                            times.extend([t] * (k - 1))
                        if kernel:
                            st.first_bound = 0.0 if exact else max(0.0, t1 - lower)
            if peeked:
                assert peek is not None
                peek.consume(len(data))
                peeked = False
            if dec is not None:
                if dec.done:
                    st.ended_at = t
                    return head.keep_alive
            elif remaining is not None:
                remaining -= len(data)
                if remaining <= 0:
                    st.ended_at = t
                    return head.keep_alive
            if len(data) < _RECV:
                lower = t
        if peek is not None and not times:
            data, t = peek.peek(_RECV)
            peeked = True
        else:
            data, t = read()
        if not data:
            st.ended_at = t
            if sc.done or (remaining is not None and remaining <= 0):
                return False
            raise _Closed(got_bytes=True)


def _read_body(read: Reader, head: ResponseHead, rest: bytes, t: float) -> tuple[bytes, float]:
    """Read a whole (non-streamed) body: (body, arrival of its last byte)."""
    if head.chunked:
        dec = ChunkedDecoder()
        parts = [dec.feed(rest)] if rest else []
        while not dec.done:
            data, t = read()
            if not data:
                raise _Closed(got_bytes=True)
            parts.append(dec.feed(data))
        return b"".join(parts), t
    if head.content_length is not None:
        parts = [rest]
        have = len(rest)
        while have < head.content_length:
            data, t = read()
            if not data:
                raise _Closed(got_bytes=True)
            parts.append(data)
            have += len(data)
        return b"".join(parts), t
    parts = [rest]
    while True:
        data, t = read()
        if not data:
            return b"".join(parts), t
        parts.append(data)
