"""A real Envoy: model affinity, the replica header, live weights (EDS), structural changes
(CDS/RDS), check mode, a rejected config, read-back from the admin API."""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from lbtune.errors import ConfigError
from lbtune.targets.base import ParamSet, RejectedBeforeApply, ReplicaAddress
from lbtune.targets.envoy import deploy
from lbtune.targets.envoy.admin import EnvoyAdmin
from tests.targets._cluster_fixtures import M8, M70
from tests.targets.envoy.conftest import RunningEnvoy, chat

pytestmark = pytest.mark.integration


def served_by(envoy: RunningEnvoy, model: str, n: int) -> collections.Counter[str]:
    seen: collections.Counter[str] = collections.Counter()
    for _ in range(n):
        resp = chat(envoy.layout.url, model)
        assert resp.status_code == 200, resp.text
        seen[resp.headers["x-lbtune-replica"]] += 1
    return seen


def test_requests_go_only_to_replicas_serving_their_model(envoy: RunningEnvoy) -> None:
    envoy.target().apply(envoy.target().space().baseline())
    assert served_by(envoy, M70, 6) == {"h100-0": 6}
    assert set(served_by(envoy, M8, 6)) == {"h100-0", "l4-0"}
    unknown = chat(envoy.layout.url, "gpt-9")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    models = requests.get(envoy.layout.url + "/v1/models", timeout=5).json()
    assert sorted(m["id"] for m in models["data"]) == sorted([M8, M70])
    assert requests.get(envoy.layout.url + "/health", timeout=5).status_code == 200


def test_a_stream_arrives_in_chunks_through_envoy(envoy: RunningEnvoy) -> None:
    resp = chat(envoy.layout.url, M8, stream=True, max_tokens=16, content="tell me a story")
    assert resp.status_code == 200
    pieces = [p for p in resp.iter_content(chunk_size=None) if p]
    assert len(pieces) > 2  # unbuffered: the SSE events are not collected into one piece
    assert b"[DONE]" in pieces[-1]


def test_weights_change_live_without_a_restart(envoy: RunningEnvoy) -> None:
    target = envoy.target()
    admin = EnvoyAdmin(envoy.layout.admin_url)
    target.apply({"weight.h100-0": 100, "weight.l4-0": 100, "lb_policy": "ROUND_ROBIN"})
    pid, structural_before = envoy.pid, deploy.current_files(envoy.layout, ["cds.json", "rds.json"])
    result = target.apply({"weight.h100-0": 200, "weight.l4-0": 0})
    assert result.changed and not result.reloaded
    assert result.diff["weight.l4-0"] == (100, 0)
    weights = {(h.cluster, h.hostname): (h.weight, h.draining) for h in admin.hosts()}
    assert weights[("all", "h100-0")] == (200, False)
    assert weights[("all", "l4-0")][1] is True  # weight 0: draining, no new requests
    assert weights[("model_llama-3.1-8b-instruct", "l4-0")][1] is True
    assert served_by(envoy, M8, 5) == {"h100-0": 5}
    assert envoy.proc.poll() is None and envoy.pid == pid
    assert deploy.current_files(envoy.layout, ["cds.json", "rds.json"]) == structural_before
    assert target.read_live()["weight.l4-0"] == 0
    target.apply({"weight.l4-0": 100, "weight.h100-0": 100})
    assert set(served_by(envoy, M8, 6)) == {"h100-0", "l4-0"}


def test_structural_changes_go_through_cds_and_rds_and_read_back(envoy: RunningEnvoy) -> None:
    target = envoy.target()
    admin = EnvoyAdmin(envoy.layout.admin_url)
    pid = envoy.pid
    params = {
        "lb_policy": "LEAST_REQUEST",
        "choice_count": 3,
        "active_request_bias": 0.5,
        "max_connections_per_host": 8,
        "outlier_detection": True,
        "outlier_consecutive_5xx": 3,
        "retries": 2,
        "max_retries": 16,
        "slow_start_s": 5,
    }
    result = target.apply(params)
    assert result.changed and result.reloaded
    live = target.read_live()
    assert {k: live[k] for k in params} == params
    dumped = admin.config_dump("dynamic_active_clusters")
    assert {c["cluster"]["lb_policy"] for c in dumped} == {"LEAST_REQUEST"}
    assert set(served_by(envoy, M8, 4)) <= {"h100-0", "l4-0"}
    hashed = target.apply({"lb_policy": "MAGLEV", "hash_bytes": 64, "hash_balance_factor": 200})
    assert hashed.reloaded
    assert target.read_live()["lb_policy"] == "MAGLEV"
    # One prompt prefix, one replica (the hash key is the prefix the Lua filter extracts).
    seen: collections.Counter[str] = collections.Counter()
    for _ in range(6):
        resp = chat(envoy.layout.url, M8, content="the same system prompt " * 10)
        seen[resp.headers["x-lbtune-replica"]] += 1
    assert len(seen) == 1
    assert envoy.proc.poll() is None and envoy.pid == pid
    assert not target.apply(target.read_live()).changed
    target.apply(target.space().baseline())


def retry_count(envoy: RunningEnvoy) -> int:
    text = EnvoyAdmin(envoy.layout.admin_url).get("/stats?filter=upstream_rq_retry$")
    return sum(int(line.rsplit(": ", 1)[1]) for line in text.splitlines() if ": " in line)


def test_retries_send_a_503_to_another_replica(
    envoy: RunningEnvoy, replicas: tuple[ReplicaAddress, ...]
) -> None:
    target = envoy.target()
    target.apply({**target.space().baseline(), "retries": 2})
    l4 = next(r for r in replicas if r.name == "l4-0")
    before = retry_count(envoy)
    requests.post(l4.url + "/admin/drain", timeout=5).raise_for_status()
    try:
        # Round robin sends every other request to l4-0, which answers 503 now; each is
        # retried on h100-0 (before the health check, 3 s, takes l4-0 out).
        assert served_by(envoy, M8, 6) == {"h100-0": 6}
        assert retry_count(envoy) > before
    finally:
        requests.post(l4.url + "/admin/ready", timeout=5).raise_for_status()
        target.apply(target.space().baseline())
        deadline = time.monotonic() + 15
        while deploy.missing(envoy.layout) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
    assert deploy.missing(envoy.layout) is None


def test_a_session_header_pins_a_session_to_one_replica(envoy: RunningEnvoy) -> None:
    target = envoy.target()
    target.apply({"lb_policy": "RING_HASH", "hash_key": "session"})
    seen: collections.Counter[str] = collections.Counter()
    for i in range(6):
        body: dict[str, Any] = {
            "model": M8,
            "messages": [{"role": "user", "content": f"turn {i}"}],
            "max_tokens": 2,
        }
        resp = requests.post(
            envoy.layout.url + "/v1/chat/completions",
            json=body,
            headers={"x-session-id": "s-1"},
            timeout=30,
        )
        assert resp.status_code == 200
        seen[resp.headers["x-lbtune-replica"]] += 1
    assert len(seen) == 1
    target.apply(target.space().baseline())


def test_check_mode_touches_nothing(envoy: RunningEnvoy) -> None:
    target = envoy.target()
    target.apply(target.space().baseline())
    files = deploy.current_files(envoy.layout, ["cds.json", "rds.json", "eds-all.json"])
    result = target.apply({"lb_policy": "RANDOM", "weight.l4-0": 7}, check=True)
    assert result.check and result.changed and result.reloaded
    assert result.diff == {"lb_policy": ("ROUND_ROBIN", "RANDOM"), "weight.l4-0": (100, 7)}
    assert deploy.current_files(envoy.layout, list(files)) == files
    assert target.read_live() == target.space().baseline()


def test_bad_params_are_refused_and_leave_envoy_untouched(
    envoy: RunningEnvoy, tmp_path: Path
) -> None:
    target = envoy.target()
    target.apply(target.space().baseline())
    before = target.read_live()
    files = deploy.current_files(envoy.layout, ["cds.json", "rds.json", "eds-all.json"])
    with pytest.raises(ConfigError, match="max_requests"):
        target.apply({"max_requests": 0})
    with pytest.raises(ConfigError, match="unknown knob"):
        target.apply({"lb_polcy": "RANDOM"})
    # A space that lets through what Envoy refuses: the target knows Envoy's own limits
    # (issue 29) and refuses before anything is touched ...
    loose = tmp_path / "space.yaml"
    text = target.space_file.read_text().replace(
        "hash_balance_factor:\n    type: int\n    low: 100",
        "hash_balance_factor:\n    type: int\n    low: 10",
    )
    loose.write_text(text)
    wanted: ParamSet = {"lb_policy": "RING_HASH", "hash_balance_factor": 50}
    with pytest.raises(ConfigError, match="envoy does not accept") as refused:
        envoy.target(space_file=loose).apply(wanted)
    assert "\n" not in str(refused.value)
    # ... and Envoy's own validation says no too, in one line.
    with pytest.raises(RejectedBeforeApply, match="Envoy rejects") as exc:
        deploy.validate(envoy.layout, {**target.read_live(), **wanted})
    assert "\n" not in str(exc.value)
    assert deploy.current_files(envoy.layout, list(files)) == files
    assert target.read_live() == before
