"""The apply lock and the last-known-good store (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtune.apply.lock import apply_lock
from lbtune.errors import ApplyError
from lbtune.targets.lkg import LkgStore, params_hash


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
