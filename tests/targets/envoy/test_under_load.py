"""10 structural applies (CDS and RDS replaced), and 10 live ones (EDS weights, draining
included), during a steady stream of requests drop none."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import requests

from tests.targets._cluster_fixtures import M8, M70
from tests.targets.envoy.conftest import RunningEnvoy

pytestmark = pytest.mark.integration

CLIENTS = 6
MAX_REQUESTS = 3000
MAX_SECONDS = 60.0

STRUCTURAL: list[dict[str, object]] = [
    {"lb_policy": "LEAST_REQUEST", "choice_count": 3},
    {"lb_policy": "ROUND_ROBIN", "slow_start_s": 5},
    {"lb_policy": "RING_HASH", "hash_bytes": 64},
    {"lb_policy": "MAGLEV", "hash_balance_factor": 200},
    {"lb_policy": "RANDOM", "retries": 2},
    {"lb_policy": "LEAST_REQUEST", "outlier_detection": True},
    {"max_requests": 512, "max_pending_requests": 256},
    {"max_connections_per_host": 16},
    {"lb_policy": "ROUND_ROBIN", "retries": 0, "outlier_detection": False},
    {"max_requests": 1024, "max_pending_requests": 1024, "max_connections_per_host": 0},
]


class Load:
    """``CLIENTS`` threads sending streamed and plain chats until stopped (bounded in
    count and time); every request ends as ok or as an error with its reason."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok = 0
        self.errors: list[str] = []
        self.streams: list[tuple[float, float]] = []
        """(start, end) of every stream that completed."""
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(CLIENTS)]

    def sent(self) -> int:
        return self.ok + len(self.errors)

    def run(self, i: int) -> None:
        session = requests.Session()
        deadline = time.monotonic() + MAX_SECONDS
        n = 0
        while not self.stop.is_set() and time.monotonic() < deadline and self.sent() < MAX_REQUESTS:
            n += 1
            stream = (i + n) % 2 == 0
            body: dict[str, Any] = {
                "model": M70 if n % 5 == 0 else M8,
                "messages": [{"role": "user", "content": f"client {i} request {n}"}],
                "max_tokens": 48 if stream else 8,
                "stream": stream,
            }
            problem = None
            started = time.monotonic()
            try:
                resp = session.post(
                    f"{self.url}/v1/chat/completions", json=body, stream=stream, timeout=30
                )
                if resp.status_code != 200:
                    problem = f"HTTP {resp.status_code}: {resp.text[:100]}"
                elif stream:
                    data = b"".join(resp.iter_content(chunk_size=None))
                    if b"[DONE]" not in data:
                        problem = "stream ended without [DONE]"
                else:
                    resp.json()
            except (requests.RequestException, ValueError) as exc:
                problem = f"{exc.__class__.__name__}: {exc}"
            with self.lock:
                if problem is None:
                    self.ok += 1
                    if stream:
                        self.streams.append((started, time.monotonic()))
                else:
                    self.errors.append(problem)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(MAX_SECONDS + 35)


LIVE: list[dict[str, object]] = [
    {"weight.h100-0": w1, "weight.l4-0": w2}
    for w1, w2 in [(200, 50), (0, 100), (100, 0), (30, 256), (100, 100)] * 2
]


@pytest.mark.parametrize(
    ("kind", "changes"), [("structural", STRUCTURAL), ("live", LIVE)], ids=["cds-rds", "eds"]
)
def test_ten_applies_under_load_drop_no_request(
    envoy: RunningEnvoy, kind: str, changes: list[dict[str, object]]
) -> None:
    target = envoy.target()
    target.apply(target.space().baseline())
    pid = envoy.pid
    with Load(envoy.layout.url) as load:
        deadline = time.monotonic() + 10
        while load.sent() < 20 and time.monotonic() < deadline:  # the stream is flowing
            time.sleep(0.01)
        applies: list[tuple[float, float]] = []
        for params in changes:
            t0 = time.monotonic()
            result = target.apply(params)
            applies.append((t0, time.monotonic()))
            assert result.reloaded == (kind == "structural"), params
            before = load.sent()
            deadline = time.monotonic() + 10
            while load.sent() < before + 10 and time.monotonic() < deadline:
                time.sleep(0.01)  # requests flow through the new config before the next one
    assert envoy.proc.poll() is None and envoy.pid == pid
    failed = len(load.errors)
    # Streams that were open through a whole apply (started before it, ended after it).
    across = sum(any(s < a and e > b for a, b in applies) for s, e in load.streams)
    print(
        f"envoy: {len(changes)} {kind} applies, {load.sent()} requests "
        f"({across} streams open across an apply), {failed} failed"
    )
    assert across > 0
    assert load.sent() > 100
    assert load.errors == [], f"{len(load.errors)} of {load.sent()} failed: {load.errors[:3]}"
    target.apply(target.space().baseline())
