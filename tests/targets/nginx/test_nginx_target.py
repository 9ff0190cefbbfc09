"""The nginx target against a real nginx and simulated replicas: render + ``nginx -t`` per
algorithm, apply + read-back, model affinity, the replica header, refused input, the
exporter, and graceful reloads under a steady stream of streamed requests."""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from lbtune.errors import ConfigError
from lbtune.targets.base import RejectedBeforeApply, ReplicaAddress
from lbtune.targets.nginx import process, readback
from lbtune.targets.nginx.balancer import BALANCER, exporter_missing
from lbtune.targets.nginx.config import ALGORITHMS, Site, render_config
from lbtune.targets.nginx.target import SPACE_FILE, NginxTarget
from lbtune.targets.space import ParameterSpace
from tests.targets._cluster_fixtures import M8, M70
from tests.targets.nginx.conftest import MODELS, Running, chat, launch, needs_nginx

pytestmark = [needs_nginx, pytest.mark.integration]

REPLICAS = (
    ReplicaAddress("h100-0", "127.0.0.1", 18301, (M8, M70)),
    ReplicaAddress("l4-0", "127.0.0.1", 18302, (M8,)),
)


def _space() -> ParameterSpace:
    return ParameterSpace.load(SPACE_FILE, [r.name for r in REPLICAS])


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_renders_a_config_nginx_accepts_and_reads_back(
    algorithm: str, tmp_path: Path
) -> None:
    site = Site(tmp_path, "127.0.0.1", 18310, REPLICAS, MODELS)
    site.create()
    space = _space()
    params = space.baseline() | {
        "algorithm": algorithm,
        "weight.h100-0": 70,
        "weight.l4-0": 0,
        "max_conns.h100-0": 12,
        "max_fails": 3,
        "fail_timeout_s": 5,
        "hash_bytes": 64,
        "retry_on_overload": True,
        "next_upstream_tries": 2,
        "next_upstream_timeout_s": 30,
    }
    text = render_config(site, params)
    site.conf.write_text(text)
    assert process.test_config(site, site.conf) is None
    assert readback.parse_config(text, REPLICAS) == params
    assert ("http_429 http_503" in text) and (" down;" in text)


def test_a_config_nginx_rejects_is_reported_with_its_words(tmp_path: Path) -> None:
    site = Site(tmp_path, "127.0.0.1", 18310, REPLICAS, MODELS)
    site.create()
    text = render_config(site, _space().baseline(), {"keepalive": "bogus"})
    site.conf.write_text(text)
    problem = process.test_config(site, site.conf)
    assert problem is not None and "keepalive" in problem


def test_model_affinity_and_the_replica_header(nginx: Running) -> None:
    seen: dict[str, Counter[str]] = {M8: Counter(), M70: Counter()}
    for i in range(6):
        for model in (M8, M70):
            status, headers, _ = chat(nginx.url, model, content=f"q{i}")
            assert status == 200
            assert headers["x-lbtune-replica"] == headers["x-sim-replica"]
            seen[model][headers["x-lbtune-replica"]] += 1
    assert set(seen[M70]) == {"h100-0"}  # only the replica serving the 70B
    assert set(seen[M8]) == {"h100-0", "l4-0"}
    status, _, body = chat(nginx.url, "no-such-model")
    assert status == 404 and b"model_not_found" in body


def test_streams_arrive_whole_through_nginx(nginx: Running) -> None:
    status, headers, body = chat(nginx.url, M8, stream=True, max_tokens=8)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert body.count(b"data: ") >= 8 and body.rstrip().endswith(b"data: [DONE]")


def test_the_exporter_reads_stub_status(nginx: Running) -> None:
    assert exporter_missing(f"http://127.0.0.1:{nginx.spec.metrics_port}/metrics") is None
    job = BALANCER.scrape_jobs(nginx.spec)[0]
    assert job.job_name == "nginx" and job.targets == (f"127.0.0.1:{nginx.spec.metrics_port}",)


def test_apply_reloads_and_reads_back_and_a_repeat_is_no_change(nginx: Running) -> None:
    target = nginx.target
    target.apply(target.space().baseline())
    before = target.worker_pids()
    params = {"algorithm": "least_conn", "weight.l4-0": 30, "max_conns.h100-0": 8}
    result = target.apply(params)
    assert result.changed and result.reloaded
    assert result.diff["algorithm"] == ("round_robin", "least_conn")
    live = target.read_live()
    assert {k: live[k] for k in params} == params
    assert "least_conn;" in nginx.site.conf.read_text()
    assert target.worker_pids() - before  # a new worker runs the new file
    again = target.apply(params)
    assert not again.changed and again.diff == {} and not again.reloaded
    target.apply(target.space().baseline())


def test_check_mode_reports_the_diff_and_touches_nothing(nginx: Running) -> None:
    target = nginx.target
    target.apply(target.space().baseline())
    text, pids = nginx.site.conf.read_text(), target.worker_pids()
    result = target.apply({"algorithm": "hash"}, check=True)
    assert result.check and result.changed and result.reloaded
    assert result.diff == {"algorithm": ("round_robin", "hash")}
    assert nginx.site.conf.read_text() == text and target.worker_pids() == pids


def test_hash_sends_one_prompt_prefix_to_one_replica(nginx: Running) -> None:
    target = nginx.target
    target.apply({"algorithm": "hash", "hash_bytes": 32})
    try:
        for prompt in ("alpha " * 20, "bravo " * 20, "charlie " * 20):
            served = {
                chat(nginx.url, M8, content=prompt + str(i))[1]["x-lbtune-replica"]
                for i in range(4)
            }
            assert len(served) == 1  # the prefix (32 chars) is the same, the suffix differs
    finally:
        target.apply(target.space().baseline())


@pytest.mark.parametrize(
    "params",
    [{"weight.h100-0": 999}, {"no_such_knob": 1}, {"algorithm": "ip_hash"}, {"max_fails": "3"}],
)
def test_bad_params_are_a_config_error_and_touch_nothing(
    nginx: Running, params: dict[str, object]
) -> None:
    text, pids = nginx.site.conf.read_text(), nginx.target.worker_pids()
    with pytest.raises(ConfigError):
        nginx.target.apply(params)
    assert nginx.site.conf.read_text() == text and nginx.target.worker_pids() == pids


def test_a_config_nginx_rejects_leaves_the_live_one_running(nginx: Running) -> None:
    text, pids = nginx.site.conf.read_text(), nginx.target.worker_pids()
    broken = NginxTarget(nginx.site, template_overrides={"keepalive": "bogus"})
    with pytest.raises(RejectedBeforeApply, match="keepalive"):
        broken.apply({"max_fails": 4})
    assert nginx.site.conf.read_text() == text and nginx.target.worker_pids() == pids
    assert chat(nginx.url, M8)[0] == 200


def test_ten_reloads_under_streamed_load_drop_nothing(nginx: Running) -> None:
    """Streams in flight finish on the old workers; nothing is refused meanwhile."""
    target = nginx.target
    target.apply(target.space().baseline())
    outcomes: list[tuple[int, bool]] = []
    lock = threading.Lock()
    open_now = [0]
    stop = threading.Event()
    deadline = time.monotonic() + 60

    def user() -> None:
        while not stop.is_set() and time.monotonic() < deadline:
            with lock:
                open_now[0] += 1
            try:
                status, _, body = chat(nginx.url, M8, stream=True, max_tokens=24, timeout=20)
                whole = body.rstrip().endswith(b"data: [DONE]")
            except OSError:
                status, whole = 0, False
            with lock:
                open_now[0] -= 1
                outcomes.append((status, whole))

    threads = [threading.Thread(target=user, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    reloads, open_at_reloads = 0, 0
    try:
        for i in range(10):
            time.sleep(0.15)  # let streams get going on the current workers
            with lock:
                open_at_reloads += open_now[0]
            algorithm = sorted(ALGORITHMS)[i % len(ALGORITHMS)]
            result = target.apply({"weight.l4-0": 10 + 5 * (i + 1), "algorithm": algorithm})
            reloads += int(result.reloaded)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert reloads == 10
    assert open_at_reloads > 0  # requests were in flight when nginx reloaded
    failed = [o for o in outcomes if o != (200, True)]
    assert failed == [], f"{len(failed)} of {len(outcomes)} requests failed: {failed[:5]}"
    target.apply(target.space().baseline())


def test_everything_launched_is_stopped(
    replicas: tuple[ReplicaAddress, ...], tmp_path: Path
) -> None:
    running = launch(tmp_path, replicas)
    master = process.master(running.site)
    exporter = psutil.Process(running.supervisor.records["nginx-exporter"].pid)
    family = [master, *master.children(), exporter]
    running.supervisor.stop_all()
    _, alive = psutil.wait_procs(family, timeout=10)
    assert alive == []


def _admin(replica: ReplicaAddress, action: str) -> None:
    conn = http.client.HTTPConnection(replica.host, replica.port, timeout=5)
    try:
        conn.request("POST", f"/admin/{action}", b"{}", {"Content-Type": "application/json"})
        assert conn.getresponse().status == 200
    finally:
        conn.close()


def test_retry_on_overload_hands_a_refused_request_to_another_replica(
    nginx: Running, replicas: tuple[ReplicaAddress, ...]
) -> None:
    target, h100 = nginx.target, replicas[0]
    target.apply(target.space().baseline())
    _admin(h100, "drain")  # h100-0 answers 503 to new requests
    try:
        plain = [chat(nginx.url, M8, content=f"p{i}") for i in range(6)]
        assert 503 in {status for status, _, _ in plain}  # round robin hits the drained one
        target.apply({"retry_on_overload": True})
        retried = [chat(nginx.url, M8, content=f"r{i}") for i in range(6)]
        assert [status for status, _, _ in retried] == [200] * 6
        assert {h["x-lbtune-replica"] for _, h, _ in retried} == {"l4-0"}
    finally:
        _admin(h100, "ready")
        target.apply(target.space().baseline())


def test_the_replica_header_map_matches_what_nginx_reports_for_a_host_name(
    tmp_path: Path,
) -> None:
    named = (ReplicaAddress("h100-0", "localhost", 18301, (M8, M70)),)
    text = render_config(Site(tmp_path, "127.0.0.1", 18310, named, MODELS), _space().baseline())
    # $upstream_addr holds the address nginx resolved, not the name in the server line.
    assert '"~(^|\\s)127\\.0\\.0\\.1:18301$" h100-0;' in text
    assert "server localhost:18301 " in text
