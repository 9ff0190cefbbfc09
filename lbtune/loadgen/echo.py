"""A minimal OpenAI-style SSE server with exact timings, to check the generator itself.

``python -m lbtune.loadgen.echo --port P --ttft 0.05 --itl 0.01`` answers every
``POST /v1/chat/completions`` or ``/v1/completions`` with a role-only chunk at
once, then ``max_tokens`` content chunks (first after ``ttft``, then every
``itl``; ``--one-write`` sends the whole stream in one write), an empty finish
chunk, a usage chunk and ``[DONE]``. It records its own wall-clock ground truth
per request, served at ``GET /debug/requests`` (all; ``?clear=1`` also forgets
them) and ``GET /debug/requests/{id}``:

* ``t_recv`` — when the request's last byte *arrived*: the kernel's receive time
  stamp of the read that completed it (``SO_TIMESTAMPNS``), so the server's own
  event-loop lag does not enter it (``time.time()`` where the kernel gives none);
* ``t_first`` — ``time.time()`` right before the first content chunk is written
  (a causal lower bound of its arrival at the client: loopback adds ~20 µs);
* ``t_sent`` — ``time.time()`` right after that write returned with every byte taken
  by the kernel *and sent* (an upper bound of its arrival over loopback), ``null`` where
  the write was held back: the socket's buffer was full, or TCP kept the bytes queued
  (``SIOCOUTQNSD`` > 0: the congestion or receive window was full, so they left on a
  later ACK, up to a delayed ACK's 40 ms after the write). So the server's own delays
  between its stamps and its writes are measured, not assumed away;
* ``t_last`` — after the last write.

No framework: an asyncio loop for readiness and timers over non-blocking raw
sockets, and byte templates, so that the server is cheap next to the generator
it measures.

Special models provoke failures (for tests): ``x-http-500``, ``x-break`` (close
after two content chunks), ``x-hang`` (stop after one chunk, keep the socket).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import logging
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

__all__ = ["EchoServer", "main"]

log = logging.getLogger(__name__)

_ROLE = b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'
_TOKEN = b'{"choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":null}]}'
_TEXT = b'{"choices":[{"index":0,"text":"tok ","finish_reason":null}]}'
_FINISH = b'{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}'
_SO_TIMESTAMPNS = 35  # SO_TIMESTAMPNS_OLD (asm-generic); see lbtune.loadgen.client
_TIMESPEC = struct.Struct("@ll")
_ANC = socket.CMSG_SPACE(_TIMESPEC.size)


def _chunk(event: bytes) -> bytes:
    data = b"data: " + event + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Conn:
    """One client connection: a read buffer, pending output, and its closed state."""

    __slots__ = ("buf", "closed", "fd", "loop", "out", "sock", "srv")

    def __init__(self, srv: EchoServer, sock: socket.socket, loop: asyncio.AbstractEventLoop):
        self.srv = srv
        self.sock = sock
        self.fd = sock.fileno()
        self.loop = loop
        self.buf = b""
        self.out = b""
        self.closed = False
        loop.add_reader(self.fd, self.on_read)

    def on_read(self) -> None:
        try:
            data, anc, _flags, _addr = self.sock.recvmsg(65536, _ANC)
        except BlockingIOError:
            return
        except OSError:
            self.close()
            return
        if not data:
            self.close()
            return
        t = time.time()
        if anc and len(anc[0][2]) == _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack(anc[0][2])
            t = sec + nsec * 1e-9
        self.buf += data
        while not self.closed:
            i = self.buf.find(b"\r\n\r\n")
            if i < 0:
                return
            head = self.buf[:i].decode("latin-1")
            lines = head.split("\r\n")
            hdrs = {}
            for ln in lines[1:]:
                k, _, v = ln.partition(":")
                hdrs[k.strip().lower()] = v.strip()
            n = int(hdrs.get("content-length", "0"))
            if len(self.buf) < i + 4 + n:
                return
            body = self.buf[i + 4 : i + 4 + n]
            self.buf = self.buf[i + 4 + n :]
            try:
                method, path, _ = lines[0].split(" ", 2)
                self.srv.respond(self, method, path, hdrs, body, t)
            except (ValueError, KeyError):
                self.close()

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if self.out:
            self.out += data
            return
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.close()
            return
        if sent < len(data):
            self.out = data[sent:]
            self.loop.add_writer(self.fd, self.on_write)

    def on_write(self) -> None:
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            return
        except OSError:
            self.close()
            return
        self.out = self.out[sent:]
        if not self.out:
            self.loop.remove_writer(self.fd)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.fd)
        if self.out:
            self.loop.remove_writer(self.fd)
        self.sock.close()


SIOCOUTQNSD = 0x894B
"""``linux/sockios.h``: bytes in a TCP socket's send queue not yet sent."""


def _unsent(sock: socket.socket) -> int:
    """Bytes the kernel took but has not sent yet (0 where it cannot say)."""
    try:
        got = fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, b"\0\0\0\0")
    except OSError:
        return 0
    return int(struct.unpack("i", got)[0])


def _sent_at(c: _Conn) -> float | None:
    """After a write: now, if the kernel took every byte and sent it (else ``None``:
    held back, in this process or in TCP's send queue). Checked before the clock is
    read, so the bytes left no later than the stamp."""
    if c.out or c.closed or _unsent(c.sock):
        return None
    return time.time()


class EchoServer:
    def __init__(
        self,
        ttft: float = 0.0,
        itl: float = 0.0,
        one_write: bool = False,
        replica: str = "echo-0",
        keep_truth: bool = True,
    ) -> None:
        self.ttft = ttft
        self.itl = itl
        self.one_write = one_write
        self.replica = replica.encode()
        self.keep_truth = keep_truth
        self.truth: dict[str, dict[str, float | None]] = {}
        self.requests = 0
        self._tok = {True: _chunk(_TOKEN), False: _chunk(_TEXT)}
        self._due: list[_Stream] = []
        self._pumping = False

    def respond(
        self, c: _Conn, method: str, path: str, hdrs: dict[str, str], body: bytes, t_recv: float
    ) -> None:
        if method == "GET":
            self._debug(c, path)
            return
        self.requests += 1
        rid = hdrs.get("x-request-id", "")
        req = json.loads(body or b"{}")
        model = str(req.get("model", ""))
        if model == "x-http-500":
            msg = b'{"error":"boom"}'
            c.write(
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(msg), msg)
            )
            return
        n = int(req.get("max_tokens", 16))
        chat = path.endswith("/chat/completions")
        tok = self._tok[chat]
        if not req.get("stream"):
            doc = json.dumps(
                {
                    "choices": [{"index": 0, "message": {"content": "tok " * n}, "text": "x"}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": n},
                }
            ).encode()
            t = time.time()
            c.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                b"X-Lbtune-Replica: %s\r\n\r\n%s" % (len(doc), self.replica, doc)
            )
            self._truth(rid, t_recv, (t, _sent_at(c)), t)
            return
        head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nX-Lbtune-Replica: %s\r\nx-request-id: %s\r\n\r\n"
            % (self.replica, rid.encode())
        )
        usage = b'{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d}}' % n
        tail = _chunk(_FINISH) + _chunk(usage) + _chunk(b"[DONE]") + b"0\r\n\r\n"
        if self.one_write and not model.startswith("x-"):
            t = time.time()
            c.write(head + _chunk(_ROLE) + tok * n + tail)
            self._truth(rid, t_recv, (t, _sent_at(c)), t)
            return
        c.write(head + _chunk(_ROLE))
        _Stream(self, c, rid, t_recv, n, tok, tail, model).schedule(self.ttft)

    def _soon(self, st: _Stream) -> None:
        """Run ``st.step`` in the loop's next pass, as ``call_soon(st.step)`` would.

        One callback per pass steps every stream that is due (each writes one chunk), not
        one callback per chunk: with zero delay between chunks the server's own cost per
        chunk set the measured rate of a fast generator (its core was saturated, loopback's
        softirq included, while its process time said 76 %; benchmarks/generator.py).
        """
        self._due.append(st)
        if not self._pumping:
            self._pumping = True
            st.c.loop.call_soon(self._pump)

    def _pump(self) -> None:
        due, self._due = self._due, []
        self._pumping = False
        for st in due:
            try:
                st.step()
            except Exception:  # as a callback of its own would: logged, the others go on
                log.exception("stream %s failed", st.rid)

    def _debug(self, c: _Conn, path: str) -> None:
        if path.startswith("/debug/requests/"):
            doc: Any = self.truth.get(path.rsplit("/", 1)[1])
        elif path.startswith("/debug/requests"):
            doc = self.truth
            if path.endswith("?clear=1"):  # hand over and forget (long benchmarks)
                self.truth = {}
        else:
            doc = {"requests": self.requests}
        out = json.dumps(doc).encode()
        status = b"200 OK" if doc is not None else b"404 Not Found"
        c.write(
            b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status, len(out), out)
        )

    def _truth(
        self, rid: str, t_recv: float, first: tuple[float, float | None], t_last: float
    ) -> None:
        """``first``: (``t_first``, ``t_sent``) of the first content write."""
        if self.keep_truth and rid:
            self.truth[rid] = {
                "t_recv": t_recv,
                "t_first": first[0],
                "t_sent": first[1],
                "t_last": t_last,
            }

    async def serve(self, host: str, port: int, ready: Callable[[int], Any] | None = None) -> None:
        loop = asyncio.get_running_loop()
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((host, port))
        ls.listen(4096)
        ls.setblocking(False)
        conns: set[_Conn] = set()

        def accept() -> None:
            while True:
                try:
                    sock, _ = ls.accept()
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:
                    return
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                conns.add(_Conn(self, sock, loop))
                if len(conns) > 256:  # forget closed ones now and then
                    conns.difference_update([x for x in conns if x.closed])

        loop.add_reader(ls.fileno(), accept)
        if ready is not None:
            ready(ls.getsockname()[1])
        try:
            await loop.create_future()
        finally:
            loop.remove_reader(ls.fileno())
            ls.close()
            for x in list(conns):
                x.close()


class _Stream:
    """The timed content chunks of one streamed response (asyncio timers, no coroutine)."""

    __slots__ = (
        "c",
        "i",
        "model",
        "n",
        "rid",
        "srv",
        "t_first",
        "t_recv",
        "t_sent",
        "tail",
        "tok",
    )

    def __init__(
        self,
        srv: EchoServer,
        c: _Conn,
        rid: str,
        t_recv: float,
        n: int,
        tok: bytes,
        tail: bytes,
        model: str,
    ) -> None:
        self.srv, self.c, self.rid, self.t_recv = srv, c, rid, t_recv
        self.n, self.tok, self.tail, self.model = n, tok, tail, model
        self.i = 0
        self.t_first = 0.0
        self.t_sent: float | None = None

    def schedule(self, delay: float) -> None:
        if delay > 0:
            self.c.loop.call_later(delay, self.step)
        else:
            self.srv._soon(self)

    def step(self) -> None:
        c = self.c
        if c.closed:
            return  # the client went away
        i = self.i
        if i >= self.n:
            c.write(self.tail)
            self.srv._truth(self.rid, self.t_recv, (self.t_first, self.t_sent), time.time())
            return
        if i == 0:
            self.t_first = time.time()  # just before the bytes leave: a causal lower bound
        c.write(self.tok)
        if i == 0:
            self.t_sent = _sent_at(c)
        self.i = i + 1
        if self.model == "x-break" and i == 1:
            c.close()
            return
        if self.model == "x-hang":
            return  # one chunk, then silence on an open socket
        if self.i < self.n:
            self.schedule(self.srv.itl)
        else:
            self.step()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lbtune.loadgen.echo")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft", type=float, default=0.0)
    ap.add_argument("--itl", type=float, default=0.0)
    ap.add_argument("--one-write", action="store_true")
    ap.add_argument("--replica", default="echo-0")
    ap.add_argument("--no-truth", action="store_true")
    a = ap.parse_args(argv)
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # clients hang up at test end
    srv = EchoServer(a.ttft, a.itl, a.one_write, a.replica, keep_truth=not a.no_truth)

    def ready(port: int) -> None:
        print(json.dumps({"port": port}), flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(srv.serve(a.host, a.port, ready))


if __name__ == "__main__":
    main()
