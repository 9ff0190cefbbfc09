"""The apply lock and the last-known-good store (no cluster needed)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lbtune.apply import apply_params, rollback
from lbtune.apply.claim import (
    ClusterBusy,
    holder,
    lease_path,
    load_claim,
    refuse_if_busy,
    refuse_if_leased,
    start_time,
)
from lbtune.apply.lease import hold
from lbtune.apply.lock import apply_lock
from lbtune.errors import ApplyError
from lbtune.targets.lkg import LkgStore, params_hash
from tests.apply.test_host import FakeTarget
from tests.targets.test_haproxy_target import fake_endpoints


def test_a_second_apply_is_refused_while_the_first_holds_the_lock(tmp_path: Path) -> None:
    busy = pytest.raises(ApplyError, match=r"Another apply is running on .* \(pid \d+\)")
    with apply_lock(tmp_path), busy, apply_lock(tmp_path):
        pass
    with apply_lock(tmp_path):  # released
        pass


def test_lkg_records_time_source_and_a_canonical_hash(tmp_path: Path) -> None:
    store = LkgStore(tmp_path, "haproxy")
    assert store.get() is None and store.history() == []
    a = store.record({"b": 1, "a": 2.5}, "baseline")
    b = store.record({"a": 2.5, "b": 1}, "file:x.yaml")
    assert a.sha256 == b.sha256 == params_hash({"a": 2.5, "b": 1})
    assert store.get() == b and b.source == "file:x.yaml" and b.time.endswith("+00:00")
    assert [x.source for x in store.history()] == ["baseline", "file:x.yaml"]
    assert (tmp_path / "lkg" / "haproxy.json").exists()


def test_one_load_test_at_a_time_per_cluster(tmp_path: Path) -> None:
    """Two load tests on one cluster share its exporter port: the second is refused in one
    line (exit 3), not killed by ``Address already in use``."""
    ep = fake_endpoints(tmp_path)
    busy = pytest.raises(ClusterBusy, match=r"another load test \(pid \d+\) is running")
    with load_claim(ep):
        with busy as exc:
            refuse_if_busy(ep, "stress")
        assert exc.value.exit_code == 3 and "\n" not in str(exc.value)
    refuse_if_busy(ep, "stress")  # released
    refuse_if_busy(None, "stress")  # an external target: nothing to claim


@pytest.fixture
def study(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Another live process holding the cluster's lease on haproxy (only the claim: no
    guard runs)."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        path = lease_path(tmp_path, "haproxy")
        path.parent.mkdir(parents=True)
        doc = {
            "holder": proc.pid,
            "holder_start": start_time(proc.pid),
            "renewed_at": time.time(),
            "ttl_s": 60.0,
        }
        path.write_text(json.dumps(doc))
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_while_a_study_holds_the_cluster_apply_and_rollback_refuse_touching_nothing(
    tmp_path: Path, study: subprocess.Popen[bytes]
) -> None:
    """Issue 29 (item 1): before, ``apply`` went through and became the last known good
    the study then "restored"."""
    t = FakeTarget(tmp_path)
    calls: list[Callable[[], object]] = [
        lambda: apply_params(t, {"algorithm": "leastconn"}, via="direct", source="file:p"),
        lambda: rollback(t, via="direct"),
    ]
    for call in calls:
        with pytest.raises(ClusterBusy, match=rf"study \(lbtune optimize, pid {study.pid}\)") as e:
            call()
        assert e.value.exit_code == 3 and "\n" not in str(e.value)
    assert t.calls == [] and LkgStore(tmp_path, "haproxy").get() is None
    study.kill()
    study.wait()
    assert holder(tmp_path, "haproxy") is None  # its holder died: the guard restores
    refuse_if_leased(tmp_path, "haproxy", "apply")


def test_a_second_study_does_not_take_the_lease(
    tmp_path: Path, study: subprocess.Popen[bytes]
) -> None:
    path = lease_path(tmp_path, "haproxy")
    before = path.read_text()
    with pytest.raises(ClusterBusy, match="two studies never share a cluster") as e:
        hold(tmp_path, "haproxy")
    assert e.value.exit_code == 3 and "\n" not in str(e.value)
    assert path.read_text() == before
    assert not (tmp_path / "logs" / "lease-guard-haproxy.log").exists()  # no guard started


def test_the_holder_itself_and_a_recycled_pid_are_not_refused(tmp_path: Path) -> None:
    path = lease_path(tmp_path, "haproxy")
    path.parent.mkdir(parents=True)
    me = {"holder": os.getpid(), "holder_start": start_time(os.getpid())}
    path.write_text(json.dumps({**me, "renewed_at": time.time(), "ttl_s": 60.0}))
    refuse_if_leased(tmp_path, "haproxy", "apply")  # the study's own trials and rollout
    assert holder(tmp_path, "haproxy") == os.getpid()
    path.write_text(json.dumps({**me, "holder_start": "0", "renewed_at": time.time(), "ttl_s": 60}))
    assert holder(tmp_path, "haproxy") is None  # same pid, another process
    path.write_text(json.dumps({**me, "renewed_at": time.time() - 120, "ttl_s": 60.0}))
    assert holder(tmp_path, "haproxy") is None  # stopped renewing
    path.write_text("{not json")
    assert holder(tmp_path, "haproxy") is None
