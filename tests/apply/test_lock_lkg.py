"""The apply lock and the last-known-good store (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtune.apply.claim import ClusterBusy, load_claim, refuse_if_busy
from lbtune.apply.lock import apply_lock
from lbtune.errors import ApplyError
from lbtune.targets.lkg import LkgStore, params_hash
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
