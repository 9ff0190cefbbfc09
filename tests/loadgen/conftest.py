"""Fixtures: the generator's own echo server (lbtune.loadgen.echo) on a free port.

The simulator is the product's target; these tests check the *instrument*, so
they use a server whose timings and failure modes the test controls exactly.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from lbtune.loadgen.echo import EchoServer


def _start_echo_process(*args: str) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "lbtune.loadgen.echo", "--port", "0", *args],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    port = int(json.loads(proc.stdout.readline())["port"])
    return proc, port


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    """A separate-process echo server: TTFT 20 ms, 5 ms between tokens."""
    proc, port = _start_echo_process("--ttft", "0.02", "--itl", "0.005")
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=5)


@pytest.fixture(scope="module")
def echo_thread() -> Iterator[tuple[str, EchoServer]]:
    """An in-process echo server in a thread (its ground truth is readable)."""
    srv = EchoServer(ttft=0.02, itl=0.005)
    ready = threading.Event()
    port: list[int] = []

    def run() -> None:
        loop = asyncio.new_event_loop()

        def on_ready(p: int) -> None:
            port.append(p)
            ready.set()

        loop.run_until_complete(srv.serve("127.0.0.1", 0, on_ready))

    threading.Thread(target=run, daemon=True).start()
    assert ready.wait(5)
    yield f"http://127.0.0.1:{port[0]}", srv
