"""An OpenAI-compatible server that is neither lbtune's simulator nor vLLM, for the twin
fit's tests: a capacity law of its own (processor sharing above a slot count).

Every running request advances one token per ``token_s`` while at most ``slots`` run;
above that, all of them slow down together by ``running / slots`` (the share of a
processor each gets). The prompt is "prefilled" the same way at ``prefill_s`` a token
(whitespace-separated words count as tokens). It answers ``/v1/completions`` and
``/v1/chat/completions`` (streamed or not, with a usage chunk), ``/v1/models`` (with
``max_model_len``), ``/health`` and ``/metrics`` with nothing of vLLM's on it (one gauge of
its own: Prometheus scrapes it, ``lbtune cluster up`` waits for that).

Run in a thread: :class:`PsServer` ``.start()`` gives its URL, ``.stop()`` ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any

MODEL_LEN = 8192


@dataclass
class PsServer:
    slots: int = 2
    token_s: float = 0.004
    prefill_s: float = 0.00002
    host: str = "127.0.0.1"
    port: int = 0
    running: int = 0
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> str:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop

            async def main() -> None:
                srv = await asyncio.start_server(self._handle, self.host, self.port)
                self.port = srv.sockets[0].getsockname()[1]
                ready.set()
                async with srv:
                    await srv.serve_forever()

            try:
                loop.run_until_complete(main())
            except asyncio.CancelledError:
                pass
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("psserver did not start")
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():

            def cancel_all() -> None:  # in the loop's own thread: its task set holds still
                for t in asyncio.all_tasks(loop):
                    t.cancel()

            # One call: cancelling the server's task ends the loop, which closes it, so a
            # second call_soon_threadsafe from here raised "Event loop is closed" (seen under
            # load). Closed already: it has stopped.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(cancel_all)
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- the capacity law ----------------------------------------------------------------

    async def _work(self, seconds_alone: float) -> None:
        """``seconds_alone`` of work, stretched while more than ``slots`` requests run."""
        left = seconds_alone
        while left > 1e-9:
            share = min(1.0, self.slots / max(1, self.running))
            tick = min(left / share, 0.002)
            await asyncio.sleep(tick)
            left -= tick * share

    # -- HTTP -----------------------------------------------------------------------------

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (x.partition(":") for x in lines[1:] if x)
                }
                body = await r.readexactly(int(headers.get("content-length", "0")))
                await self._route(method, path, body, w)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            w.close()

    async def _route(self, method: str, path: str, body: bytes, w: asyncio.StreamWriter) -> None:
        if path == "/health":
            return self._send(w, 200, b"{}")
        if path == "/metrics":
            expo = b"# TYPE ps_running gauge\nps_running %d\n" % self.running
            return self._send(w, 200, expo, b"text/plain; version=0.0.4")
        if path == "/v1/models":
            data = {
                "data": [
                    {"id": m, "max_model_len": MODEL_LEN} for m in ("m", "llama-3.1-8b-instruct")
                ]
            }
            return self._send(w, 200, json.dumps(data).encode())
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            return self._send(w, 404, b'{"error":"not found"}')
        req = json.loads(body)
        chat = path.endswith("chat/completions")
        text = (
            req.get("prompt")
            if not chat
            else " ".join(str(m.get("content", "")) for m in req.get("messages", []))
        )
        prompt_tokens = max(1, len(str(text).split()))
        out = int(req.get("max_tokens") or 16)
        self.running += 1
        try:
            await self._work(prompt_tokens * self.prefill_s)
            if not req.get("stream"):
                await self._work(self.token_s * max(0, out - 1))
                doc = {
                    "choices": [{"index": 0, "text": "tok " * out, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": out},
                }
                return self._send(w, 200, json.dumps(doc).encode())
            w.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            for i in range(out):
                if i:
                    await self._work(self.token_s)
                delta: dict[str, Any] = {"delta": {"content": "tok "}} if chat else {"text": "tok "}
                self._event(w, {"choices": [{"index": 0, **delta, "finish_reason": None}]})
                await w.drain()
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": out}
            self._event(w, {"choices": [], "usage": usage})
            done = b"data: [DONE]\n\n"
            w.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            await w.drain()
        finally:
            self.running -= 1
        return None

    @staticmethod
    def _event(w: asyncio.StreamWriter, doc: dict[str, Any]) -> None:
        data = b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"
        w.write(b"%x\r\n%s\r\n" % (len(data), data))

    @staticmethod
    def _send(
        w: asyncio.StreamWriter, status: int, body: bytes, ctype: bytes = b"application/json"
    ) -> None:
        w.write(
            b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
            % (status, ctype, len(body), body)
        )
