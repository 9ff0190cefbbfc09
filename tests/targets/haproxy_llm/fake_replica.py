"""A fake OpenAI-compatible replica for the scheduler's tests: fixed vLLM gauges on /metrics
(changed by the test), a 200 naming itself on the generation paths, 200 on /health."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeReplica:
    """``FakeReplica(name)``: serves on a free loopback port until :meth:`close`."""

    def __init__(self, name: str, model: str = "m") -> None:
        self.name = name
        self.model = model
        self.waiting = 0.0
        self.running = 0.0
        self.kv = 0.0
        self.metrics_ok = True
        self.hits = 0
        self.delay_s = 0.0
        """Wait this long before answering (cut short when ``answer`` is set)."""
        self.answer = threading.Event()
        self.stream_gap_s = 0.0
        """When set, answer with headers at once and the body this much later (or on gap)."""
        self.gap = threading.Event()
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/metrics":
                    if not outer.metrics_ok:
                        self._send(200, b"# nothing here\n", "text/plain")
                        return
                    text = (
                        "# TYPE vllm:num_requests_waiting gauge\n"
                        f'vllm:num_requests_waiting{{model_name="{outer.model}"}} {outer.waiting}\n'
                        f'vllm:kv_cache_usage_perc{{model_name="{outer.model}"}} {outer.kv}\n'
                        f'vllm:num_requests_running{{model_name="{outer.model}"}} {outer.running}\n'
                    )
                    self._send(200, text.encode(), "text/plain")
                else:
                    self._send(200, b'{"status":"ok"}')

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                with outer._lock:
                    outer.hits += 1
                if outer.delay_s:
                    outer.answer.wait(outer.delay_s)
                if outer.stream_gap_s:  # headers now, the body (one SSE event) later
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.flush()
                    outer.gap.wait(outer.stream_gap_s)
                    event = b"data: [DONE]\n\n"
                    self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event))
                    return
                self._send(200, json.dumps({"replica": outer.name}).encode())

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # HAProxy's health checks hang up early: not an error here

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
