"""Defect 7 of issue 16: a run that sends nothing, or whose every request failed before
any response, is an infrastructure failure (exit 3) that says why, not a result."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.robustness.conftest import run_cli

pytestmark = pytest.mark.integration


def _scenario(tmp_path: Path, load: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(
        f"name: s\nduration_s: 3\nload: {load}\nmodels: {{echo: 1}}\n"
        "prompt_tokens: {type: fixed, value: 8}\noutput_tokens: {type: fixed, value: 4}\n"
    )
    return p


@pytest.fixture
def hangup_url() -> Iterator[str]:
    """Answers ``GET /v1/models``; closes every other request without a response."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    head = conn.recv(65536)
                except OSError:
                    continue
                if head.startswith(b"GET"):
                    body = b'{"object":"list","data":[{"id":"echo","object":"model"}]}'
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
                    )

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    done.set()
    t.join(timeout=5)
    srv.close()


def test_a_generator_that_sent_nothing_is_named_with_its_failure(tmp_path: Path) -> None:
    """A generator that died before sending (its MemoryError was only in its log): the
    reason is the generator's, not event-loop lag."""
    from lbtune.loadgen.health import GeneratorHealth
    from lbtune.loadgen.recordio import finalize
    from lbtune.loadgen.runner import LoadResult
    from lbtune.run.plan import plan_run
    from lbtune.run.stress import StressOptions
    from lbtune.run.summary import nothing_measured

    plan = plan_run(StressOptions(scenario=str(_scenario(tmp_path, "{type: constant, users: 2}"))))
    load = LoadResult(
        records_dir=tmp_path,
        records_path=finalize(tmp_path),
        sent=0,
        outcomes={},
        health=GeneratorHealth(()),
        started_at=0.0,
        ended_at=3.0,
        stopped_early=False,
        failures=("local exited 1: MemoryError",),
    )
    why = nothing_measured(plan, load, [])
    assert why is not None and "sent no request" in why and "MemoryError" in why


def test_all_failed_before_any_response_exits_3(tmp_path: Path, hangup_url: str) -> None:
    scen = _scenario(tmp_path, "{type: constant, users: 2}")
    r = run_cli("stress", "-s", str(scen), "--target", hangup_url, "--out", str(tmp_path / "o"))
    assert r.rc == 3, r.stderr
    assert "Traceback" not in r.stderr
    err = [ln for ln in r.lines() if ln.startswith("error:")]
    assert len(err) == 1 and "failed before any response" in err[0], r.stderr
