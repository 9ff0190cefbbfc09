"""The streaming OpenAI client used by :class:`~lbtune.loadgen.user.LLMUser`.

Raw gevent sockets, HTTP/1.1 keep-alive; one exchange (send, read, stamp) is
:mod:`lbtune.loadgen.response`, the bytes are :mod:`lbtune.loadgen.wire`'s (no
per-line JSON). Response time stamps come from the kernel
(:mod:`lbtune.loadgen.kerneltime`): on plain TCP every read carries the arrival time
(``CLOCK_REALTIME``, the clock of ``time.time()``) of the last byte it returned, so
however late the event loop gets to a socket, the stamp is when the bytes came. A
read that returns the first content event together with later bytes only bounds its
arrival: the record's ``first_token_bound_s`` says by how much. Over TLS (records
cannot be matched to segments) or where the kernel gives no stamp, reads are stamped
with ``time.time()`` and the record says ``timing="loop"``; a kernel-timed record
with such a read still carries an honest bound (the interval since the last stamped
read, :mod:`lbtune.loadgen.response`).
Send times are ``time.time()`` right before the request is written, once the
connection is ready (connecting is not in TTFT); the write's own duration is in
``first_token_bound_s``: the true TTFT lies in ``[ttft - bound, ttft]``.

Every call of :meth:`StreamClient.send` returns exactly one
:class:`~lbtune.records.requests.RequestRecord` with exactly one outcome:

* ``ok`` — 2xx and the body ended (``[DONE]``, or the chunked/Content-Length end);
* ``http_error`` — non-2xx status (kept in ``status_code``);
* ``broken_stream`` — the connection closed or reset before the end;
* ``timeout`` — the per-request timeout (whole request, headers to end) fired;
* ``connect_error`` — no TCP (or TLS) connection could be made.

Non-streaming requests: TTFT is the time to the complete body (the first moment
any content is usable), and ``chunk_times`` holds that one time.

The API key (``LBTUNE_API_KEY`` or ``OPENAI_API_KEY``, see :mod:`lbtune.safety.secrets`) is
sent as a bearer token and is scrubbed (any piece of 8 characters or more, in any case)
from every text of a record: it never reaches one.
"""

from __future__ import annotations

import dataclasses
import json
import ssl
from time import time
from typing import Any
from urllib.parse import urlsplit

import gevent
from gevent import socket as gsocket

from lbtune.loadgen import kerneltime
from lbtune.loadgen.response import Closed, RequestState, exchange
from lbtune.loadgen.wire import ProtocolError, build_request
from lbtune.records.requests import OpenRequest, Outcome, RequestRecord, Timing
from lbtune.safety.secrets import Scrubber, check_key, without_userinfo
from lbtune.scenario.request import RequestSpec

__all__ = ["OpenSet", "StreamClient"]


class OpenSet:
    """The requests of one generator process that were sent and have not ended."""

    def __init__(self) -> None:
        self._states: dict[int, RequestState] = {}

    def __len__(self) -> int:
        return len(self._states)

    def add(self, st: RequestState) -> None:
        self._states[id(st)] = st

    def discard(self, st: RequestState) -> None:
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


class _ConnectFailed(Exception):
    pass


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
        """``kernel_timestamps=False`` stamps reads with ``time.time()`` (for comparison).
        Kernel stamps are turned on for the process (:func:`kerneltime.hold`) here."""
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"target URL must be http(s)://host[:port], got {base_url!r}")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self._tls = ssl.create_default_context() if u.scheme == "https" else None
        self.timing: Timing = (
            "kernel" if kernel_timestamps and self._tls is None and kerneltime.hold() else "loop"
        )
        self._host_header = f"{self.host}:{self.port}" if u.port else self.host
        self._api_key = None if api_key is None else check_key(api_key, "the API key")
        self._scrubber = Scrubber([api_key] if api_key else [])
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
        req = self._request(spec, rid)
        st = RequestState()
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
                keep = exchange(sock, req, st, self._replica_header)
            except (Closed, ConnectionResetError, BrokenPipeError):
                if not reused or st.got_bytes:
                    raise
                sock.close()  # a stale keep-alive connection: retry once on a fresh one
                sock = self._connect()
                keep = exchange(sock, req, st, self._replica_header)
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
        except (Closed, OSError, ProtocolError) as e:
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
        rec = self._record(spec, rid, st, outcome, scheduled_at)
        if cut is not None:
            cut.record = rec  # type: ignore[attr-defined]
            raise cut
        return rec

    def _request(self, spec: RequestSpec, rid: str) -> bytes:
        """The request's bytes: its JSON body and headers (id, priority, bearer token)."""
        headers = {"x-request-id": rid}
        if spec.priority is not None:
            headers["priority"] = str(spec.priority)
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        body = json.dumps(spec.body(), separators=(",", ":")).encode()
        return build_request(self._host_header, self.prefix + spec.path(), body, headers)

    def _record(
        self,
        spec: RequestSpec,
        rid: str,
        st: RequestState,
        outcome: Outcome,
        scheduled_at: float | None,
    ) -> RequestRecord:
        """The one record of a request that has ended (or was cut off)."""
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
            error=st.error,
            priority=spec.priority,
            prefix_group=spec.prefix_group,
            session_id=spec.session_id,
            worker=self.worker,
            timing="loop" if st.unstamped else st.timing,
            first_token_bound_s=(
                st.first_bound + st.send_bound
                if spec.stream and st.first_bound is not None
                else None
            ),
            send_bound_s=st.send_bound if spec.stream and st.first_bound is not None else None,
        )
        return self._scrub(rec)

    def _scrub(self, rec: RequestRecord) -> RequestRecord:
        """``rec`` with the key (and any URL userinfo) masked in every text field: an error
        body, a replica header, a model name may echo it."""
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(rec):
            v = getattr(rec, f.name)
            if isinstance(v, str) and v:
                clean = without_userinfo(self._scrubber(v))
                if clean != v:
                    changes[f.name] = clean
        return dataclasses.replace(rec, **changes) if changes else rec

    # -- connections -------------------------------------------------------------

    def _checkout(self) -> tuple[Any, bool]:
        if self._idle:
            return self._idle.pop(), True
        return self._connect(), False

    def _connect(self) -> Any:
        try:
            sock = gsocket.create_connection((self.host, self.port), self.connect_timeout_s)
            sock.setsockopt(gsocket.IPPROTO_TCP, gsocket.TCP_NODELAY, 1)
            if self.timing == "kernel" and not kerneltime.enable(sock):
                self.timing = "loop"
            if self._tls is not None:
                from gevent import ssl as gssl

                ctx = gssl.create_default_context()
                sock = ctx.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(None)
            return sock
        except OSError as e:
            raise _ConnectFailed(f"cannot connect to {self.host}:{self.port}") from e
