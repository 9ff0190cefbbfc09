"""A minimal OpenAI-style SSE server with exact timings, to check the generator itself.

``python -m lbtune.loadgen.echo --port P --ttft 0.05 --itl 0.01`` answers every
``POST /v1/chat/completions`` or ``/v1/completions`` with a role-only chunk at
once, then ``max_tokens`` content chunks (first after ``ttft``, then every
``itl``; ``--one-write`` sends the whole stream in one write), an empty finish
chunk, a usage chunk and ``[DONE]``. It records its own wall-clock ground truth
per request (``t_recv`` after the body is read, ``t_first`` right before the
first content write, ``t_last``), served at ``GET /debug/requests`` (all) and
``GET /debug/requests/{id}``. No framework: asyncio streams and byte templates,
so that the server is cheap next to the generator it measures.

Special models provoke failures (for tests): ``x-http-500``, ``x-break`` (close
after two content chunks), ``x-hang`` (stop after one chunk, keep the socket).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import time
from typing import Any

__all__ = ["EchoServer", "main"]

_ROLE = b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'
_TOKEN = b'{"choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":null}]}'
_TEXT = b'{"choices":[{"index":0,"text":"tok ","finish_reason":null}]}'
_FINISH = b'{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}'


def _chunk(event: bytes) -> bytes:
    data = b"data: " + event + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


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
        self.truth: dict[str, dict[str, float]] = {}
        self.requests = 0
        self._tok = {True: _chunk(_TOKEN), False: _chunk(_TEXT)}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            import socket

            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                hdrs = {}
                for ln in lines[1:]:
                    k, _, v = ln.partition(":")
                    hdrs[k.strip().lower()] = v.strip()
                n = int(hdrs.get("content-length", "0"))
                body = await reader.readexactly(n) if n else b""
                t_recv = time.time()
                rid = hdrs.get("x-request-id", "")
                if method == "GET":
                    self._debug(writer, path)
                    continue
                self.requests += 1
                if not await self._complete(writer, path, body, rid, t_recv):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def _debug(self, writer: asyncio.StreamWriter, path: str) -> None:
        if path.startswith("/debug/requests/"):
            doc: Any = self.truth.get(path.rsplit("/", 1)[1])
        elif path.startswith("/debug/requests"):
            doc = self.truth
        else:
            doc = {"requests": self.requests}
        out = json.dumps(doc).encode()
        status = b"200 OK" if doc is not None else b"404 Not Found"
        writer.write(
            b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status, len(out), out)
        )

    async def _complete(
        self, writer: asyncio.StreamWriter, path: str, body: bytes, rid: str, t_recv: float
    ) -> bool:
        req = json.loads(body or b"{}")
        model = str(req.get("model", ""))
        if model == "x-http-500":
            msg = b'{"error":"boom"}'
            writer.write(
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(msg), msg)
            )
            return True
        n = int(req.get("max_tokens", 16))
        chat = path.endswith("/chat/completions")
        tok = self._tok[chat]
        head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nX-Lbtune-Replica: %s\r\nx-request-id: %s\r\n\r\n"
            % (self.replica, rid.encode())
        )
        usage = b'{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d}}' % n
        tail = _chunk(_FINISH) + _chunk(usage) + _chunk(b"[DONE]") + b"0\r\n\r\n"
        if not req.get("stream"):
            doc = json.dumps(
                {
                    "choices": [{"index": 0, "message": {"content": "tok " * n}, "text": "x"}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": n},
                }
            ).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                b"X-Lbtune-Replica: %s\r\n\r\n%s" % (len(doc), self.replica, doc)
            )
            t = time.time()
            self._truth(rid, t_recv, t, t)
            return True
        if self.one_write and not model.startswith("x-"):
            writer.write(head + _chunk(_ROLE) + tok * n + tail)
            t = time.time()
            self._truth(rid, t_recv, t, t)
            return True
        writer.write(head + _chunk(_ROLE))
        await self._sleep(self.ttft)
        t_first = 0.0
        for i in range(n):
            if i:
                await self._sleep(self.itl)
            if writer.is_closing():
                return False  # the client went away
            if i == 0:
                t_first = time.time()  # just before the bytes leave: a causal lower bound
            writer.write(tok)
            if model == "x-break" and i == 1:
                await writer.drain()
                return False
            if model == "x-hang":
                await writer.drain()
                await asyncio.sleep(3600)
        writer.write(tail)
        self._truth(rid, t_recv, t_first, time.time())
        return True

    @staticmethod
    async def _sleep(s: float) -> None:
        await asyncio.sleep(s)

    def _truth(self, rid: str, t_recv: float, t_first: float, t_last: float) -> None:
        if self.keep_truth and rid:
            self.truth[rid] = {"t_recv": t_recv, "t_first": t_first, "t_last": t_last}

    async def serve(self, host: str, port: int, ready: Any = None) -> None:
        srv = await asyncio.start_server(self.handle, host, port, backlog=4096, limit=1 << 20)
        if ready is not None:
            ready(srv.sockets[0].getsockname()[1])
        async with srv:
            await srv.serve_forever()


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
