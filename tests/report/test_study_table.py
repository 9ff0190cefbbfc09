"""The before/after table's round-robin column when the live config already is round robin."""

from __future__ import annotations

from lbtune.report.study_frame import is_plain_round_robin


def test_plain_round_robin_is_recognised() -> None:
    rr = {"algorithm": "roundrobin", "weight.a": 100, "weight.b": 100, "maxconn.a": 0}
    assert is_plain_round_robin(rr)
    assert not is_plain_round_robin({**rr, "weight.b": 50})
    assert not is_plain_round_robin({**rr, "algorithm": "leastconn"})
    assert not is_plain_round_robin({**rr, "maxconn.a": 8})
    assert not is_plain_round_robin({**rr, "long_request_bytes": 4096})
