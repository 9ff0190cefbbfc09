"""Baseline clients the benchmarks compare lbtune against (run as child processes).

* ``locust`` — stock Locust ``FastHttpUser``: ``stream=True``, read in 64-byte
  pieces (larger reads wait for the whole stream, see FIELD-NOTES), split lines,
  ``json.loads`` every ``data:`` line, first non-empty ``delta.content`` = TTFT.
* ``aiohttp`` — a minimal asyncio + aiohttp client in the style of
  ``vllm bench serve``: ``async for line in resp.content`` + ``json.loads``.

``python benchmarks/_stockclients.py locust|aiohttp --url U --users N --duration S
--output-tokens T --out FILE`` writes ``{"records": [[id, sent, first, end,
tokens, ok], ...], "cpu_s": ..., "wall_s": ...}``; every request carries an
``x-request-id`` so the server's ground truth can be joined.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from typing import Any

CPU = [0.0, 0.0]
"""process_time() when the load started and ended (imports excluded)."""


def _body(tokens: int) -> dict[str, Any]:
    return {
        "model": "llama-3.1-8b-instruct",
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "alpha bravo delta echo gamma kilo lima"}],
    }


def _line_is_content(line: bytes) -> tuple[bool, bool]:
    """(content?, done?) for one SSE line — per-line JSON, as stock clients do."""
    if not line.startswith(b"data:"):
        return False, False
    data = line[5:].strip()
    if data == b"[DONE]":
        return False, True
    doc = json.loads(data)
    for ch in doc.get("choices") or ():
        if (ch.get("delta") or {}).get("content") or ch.get("text"):
            return True, False
    return False, False


def run_locust(url: str, users: int, duration: float, tokens: int) -> list[list[Any]]:
    from gevent import monkey

    monkey.patch_all()
    import gevent
    from locust import FastHttpUser, constant, task
    from locust.env import Environment

    records: list[list[Any]] = []
    body = _body(tokens)

    class StockUser(FastHttpUser):
        host = url
        wait_time = constant(0)

        @task
        def chat(self) -> None:
            rid = uuid.uuid4().hex
            sent = time.time()
            first = None
            n = 0
            ok = False
            hdrs = {"x-request-id": rid}
            path = "/v1/chat/completions"
            with self.client.post(
                path, json=body, stream=True, headers=hdrs, catch_response=True
            ) as r:
                buf = b""
                while True:
                    piece = r.stream.read(64)
                    if not piece:
                        break
                    buf += piece
                    *lines, buf = buf.split(b"\n")
                    for ln in lines:
                        content, done = _line_is_content(ln)
                        if content:
                            n += 1
                            if first is None:
                                first = time.time()
                        ok = ok or done
            records.append([rid, sent, first, time.time(), n, ok])

    env = Environment(user_classes=[StockUser], host=url)
    runner = env.create_local_runner()
    CPU[0] = time.process_time()
    runner.start(users, spawn_rate=max(users, 100))
    gevent.sleep(duration)
    runner.quit()
    CPU[1] = time.process_time()
    return records


def run_aiohttp(url: str, users: int, duration: float, tokens: int) -> list[list[Any]]:
    import asyncio

    import aiohttp

    records: list[list[Any]] = []
    body = _body(tokens)

    async def worker(session: aiohttp.ClientSession, end: float) -> None:
        while time.time() < end:
            rid = uuid.uuid4().hex
            sent = time.time()
            first = None
            n = 0
            ok = False
            async with session.post(
                f"{url}/v1/chat/completions", json=body, headers={"x-request-id": rid}
            ) as resp:
                async for line in resp.content:
                    content, done = _line_is_content(line.rstrip(b"\r\n"))
                    if content:
                        n += 1
                        if first is None:
                            first = time.time()
                    ok = ok or done
            records.append([rid, sent, first, time.time(), n, ok])

    async def main() -> None:
        conn = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
            end = time.time() + duration
            await asyncio.gather(*(worker(s, end) for _ in range(users)))

    CPU[0] = time.process_time()
    asyncio.run(main())
    CPU[1] = time.process_time()
    return records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("client", choices=("locust", "aiohttp"))
    ap.add_argument("--url", required=True)
    ap.add_argument("--users", type=int, required=True)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    fn = run_locust if a.client == "locust" else run_aiohttp
    recs = fn(a.url, a.users, a.duration, a.output_tokens)
    doc = {"records": recs, "cpu_s": CPU[1] - CPU[0], "wall_s": a.duration}
    with open(a.out, "w") as f:
        json.dump(doc, f)
    sys.exit(0)


if __name__ == "__main__":
    main()
