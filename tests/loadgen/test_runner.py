"""Short real runs through ``run_load`` (Locust in child processes) against the echo server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from lbtune.loadgen.collect import Progress
from lbtune.loadgen.kerneltime import KERNEL_TIMESTAMPS
from lbtune.loadgen.recordio import read_records
from lbtune.loadgen.runner import LoadConfig, LoadResult, run_load

pytestmark = pytest.mark.integration


def run(url: str, tmp: Path, **kw: object) -> LoadResult:
    base: dict[str, object] = dict(
        target_url=url, scenario="fixed:output=5", records_dir=tmp, duration_s=2.0, grace_s=2.0
    )
    base.update(kw)
    return run_load(LoadConfig(**base))  # type: ignore[arg-type]


def accounted(res: LoadResult) -> None:
    rs = read_records(res.records_path)
    assert res.sent == sum(res.outcomes.values()) == len(rs) > 0
    assert len({r.request_id for r in rs}) == len(rs)


def test_closed_loop_counts_and_progress(echo_url: str, tmp_path: Path) -> None:
    seen: list[Progress] = []
    scraped: list[str] = []

    def on_progress(p: Progress) -> None:
        seen.append(p)
        if p.completed and not scraped:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                scraped.append(r.read().decode())

    from lbtune.loadgen.runner import _free_port

    port = _free_port()
    t_call = time.time()
    res = run_load(
        LoadConfig(
            target_url=echo_url,
            scenario="fixed:output=5",
            users=4,
            records_dir=tmp_path,
            duration_s=2.5,
            exporter_port=port,
        ),
        on_progress=on_progress,
    )
    accounted(res)
    assert res.outcomes["ok"] == res.sent
    # Whether this short run counts as degraded depends on the machine's load (the rules
    # are unit-tested in test_health.py); what must hold is that they were evaluated.
    h = res.health
    assert h.timing == ("kernel" if KERNEL_TIMESTAMPS else "loop")
    assert h.ttft_bound_p99_s is not None and h.idle_share is not None
    assert h.degraded == bool(h.reasons)
    assert seen and max(p.completed for p in seen) > 0
    opened = [p for p in seen if p.open_requests]
    assert opened, "4 closed-loop users, 45 ms requests: some must be open at a snapshot"
    for p in opened:
        assert len(p.open_requests) <= 4
        for o in p.open_requests:
            assert o.stream and o.sent_at <= p.now
            assert o.ttft is None or 0 <= o.ttft <= p.now - o.sent_at
    assert t_call < res.started_at <= min(r.sent_at for r in read_records(res.records_path))
    assert scraped and 'lbtune_requests_total{outcome="ok",replica="echo-0"}' in scraped[0]
    assert (tmp_path / "health.json").exists()


def test_failures_are_counted_once(echo_url: str, tmp_path: Path) -> None:
    res = run(echo_url, tmp_path, scenario="fixed:output=5,model=x-break", users=3)
    accounted(res)
    assert res.outcomes["broken_stream"] == res.sent


def test_open_loop_lateness_is_recorded(echo_url: str, tmp_path: Path) -> None:
    """A deliberately late dispatcher: one request in flight, ~20/s capacity, 40/s asked."""
    res = run(
        echo_url, tmp_path, rate=40.0, max_in_flight=1, scenario="fixed:output=5,arrival=constant"
    )
    accounted(res)
    rs = read_records(res.records_path)
    assert all(r.scheduled_at is not None for r in rs)
    lateness = [r.lateness or 0.0 for r in rs]
    assert min(lateness) >= 0 and max(lateness) > 0.2
    assert all(r.ended_at - (r.scheduled_at or 0) >= r.e2e for r in rs)
    w = res.health.workers[0]
    assert res.health.degraded and w.in_flight_cap_hits > 0
    assert any("lateness" in x for x in w.reasons)


def test_stop_event_ends_early_and_keeps_records(echo_url: str, tmp_path: Path) -> None:
    # Stop once requests have completed (a busy machine can take seconds to start the
    # generator; a fixed 2 s timer then stopped a run that had sent nothing), 30 s at most.
    stop = threading.Event()
    cap = threading.Timer(30.0, stop.set)
    cap.start()
    stopped_at: list[float] = []

    def on_progress(p: Progress) -> None:
        if p.completed > 0 and not stop.is_set():
            stopped_at.append(time.time())
            stop.set()

    res = run_load(
        LoadConfig(
            target_url=echo_url,
            scenario="fixed:output=5",
            users=4,
            records_dir=tmp_path,
            duration_s=60,
        ),
        stop=stop,
        on_progress=on_progress,
    )
    cap.cancel()
    assert stopped_at, "no request completed within 30 s"
    assert time.time() - stopped_at[0] < 15  # the run ended soon after the stop, not at 60 s
    assert res.stopped_early
    accounted(res)


def test_distributed_two_workers(echo_url: str, tmp_path: Path) -> None:
    res = run(echo_url, tmp_path, users=4, workers=2)
    accounted(res)
    rs = read_records(res.records_path)
    assert {r.worker for r in rs} == {"w0", "w1"}
    assert {r.index % 2 for r in rs if r.worker == "w1"} == {1}  # strided indices
    assert [w.worker for w in res.health.workers] == ["w0", "w1"]


def test_parent_stays_unpatched_and_key_never_leaks(echo_url: str, tmp_path: Path) -> None:
    secret = "sk-lbtune-test-SECRET-9f3"
    script = textwrap.dedent(f"""
        import json, sys, urllib.request
        from lbtune.loadgen.runner import LoadConfig, run_load, _free_port
        port = _free_port(); texts = []
        def grab(p):
            with urllib.request.urlopen(f"http://127.0.0.1:{{port}}/metrics") as r:
                texts.append(r.read().decode())
        res = run_load(LoadConfig(target_url={echo_url!r}, scenario="fixed:output=3", users=2,
                       records_dir={str(tmp_path)!r}, duration_s=1.5, exporter_port=port), grab)
        print(json.dumps({{"mods": [m for m in ("locust", "gevent") if m in sys.modules],
                          "metrics": texts, "sent": res.sent}}))
    """)
    env = {**os.environ, "LBTUNE_API_KEY": secret}
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["mods"] == [] and doc["sent"] > 0
    assert secret not in json.dumps(doc["metrics"]) and secret not in out.stderr
    for f in tmp_path.iterdir():
        assert secret.encode() not in f.read_bytes(), f
