"""A replica kept busy (lbtune/cluster/steady.py), against a processor-sharing server."""

from __future__ import annotations

import http.server
import threading
import time

import gevent
import pytest

from lbtune.cluster.probing import ProbePlan
from lbtune.cluster.resolve import free_port
from lbtune.cluster.steady import _scrape_times, _Scrapes, steady_state
from lbtune.errors import ClusterError
from lbtune.records.endpoints import ReplicaEndpoint
from tests.cluster.conftest import M8
from tests.twin.psserver import PsServer


@pytest.mark.integration
def test_a_replica_kept_busy_shows_its_step_under_load() -> None:
    """Processor sharing above 2 slots (tests/twin/psserver.py): at 6 streams each gets a
    token every 3 x 4 ms; a lone stream every 4 ms. Requests of the warm-up are left out,
    and a replica that answers nothing is one line naming it."""
    ps = PsServer(slots=2, token_s=0.004)
    rep = ReplicaEndpoint(name="ps-0", url=ps.start(), models=[M8])
    try:
        plan = ProbePlan(decode_tokens=16, timeout_s=10.0)
        # 5 s: in CI a busy host let no request of a 2.5-s run finish (one line, naming it)
        busy = steady_state(rep, 6, 64, plan, duration_s=5.0, warmup_s=0.5)
        lone = steady_state(rep, 1, 64, plan, duration_s=1.5, warmup_s=0.3)
    finally:
        ps.stop()
    # the server paces its tokens; a busy host only adds time (the test runs beside others)
    assert 0.9 * 0.012 <= busy.step_s < 0.04
    assert 0.9 * 0.004 <= lone.step_s < 0.6 * busy.step_s
    assert busy.ttft_s > lone.ttft_s and busy.prompt_tokens > 32  # the server's count
    assert 6 <= busy.requests < busy.sent
    assert busy.scrape_s is not None and 0 < busy.scrape_s < 1  # its /metrics, timed meanwhile
    assert busy.engine is None  # it exports no vLLM histograms
    gone = ReplicaEndpoint(name="gone", url=f"http://127.0.0.1:{free_port()}", models=[M8])
    with pytest.raises(ClusterError, match="gone"):
        steady_state(gone, 2, 16, ProbePlan(timeout_s=2.0), duration_s=1.0, warmup_s=0.0)


@pytest.mark.integration
def test_a_replica_with_vllms_histograms_shows_its_engine_side(
    l4_replica: ReplicaEndpoint,
) -> None:
    """The simulator exports vLLM's TTFT, queue and token-interval histograms: kept busy,
    their means over the measured part come with the client's view. The engine's TTFT is
    within the client's (the client adds HTTP and the front end), and its token interval
    is the step the client measured, in wall time."""
    plan = ProbePlan(decode_tokens=16, timeout_s=20.0)
    busy = steady_state(l4_replica, 4, 64, plan, duration_s=3.0, warmup_s=0.5)
    e = busy.engine
    assert e is not None and e.requests >= 4
    assert 0 < e.ttft_s <= e.client_ttft_s
    assert e.queue_s is not None and e.queue_s <= e.ttft_s
    assert e.itl_s is not None and e.itl_s == pytest.approx(busy.step_s, rel=0.5)


class _SlowMetrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        time.sleep(1.0)  # a /metrics that takes a second to answer
        body = b"# TYPE x gauge\nx 1\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_slow_metrics_scrape_does_not_stall_the_streams() -> None:
    """The scrape that times /metrics runs beside the streams' greenlets (the driver is not
    monkey-patched: a urllib call in a greenlet would hold the hub until it answered). A
    greenlet ticking every 10 ms keeps ticking while a scrape waits a second."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowMetrics)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    rep = ReplicaEndpoint(name="slow", url=f"http://127.0.0.1:{srv.server_address[1]}", models=[M8])
    ticks = 0

    def tick() -> None:
        nonlocal ticks
        while True:
            gevent.sleep(0.01)
            ticks += 1

    seen = _Scrapes()
    ticker = gevent.spawn(tick)
    try:
        _scrape_times(rep, time.time(), time.monotonic() + 1.2, seen)
    finally:
        ticker.kill()
        srv.shutdown()
        srv.server_close()
    assert seen.took and min(seen.took) >= 0.9  # it did wait for the slow answer
    assert ticks >= 60  # ~120 in its 1.25 s; blocked by the scrape, 25 (the one 0.25-s pause)
