"""The endpoints record (``endpoints.json``): the CPUs a cluster reserves for its servers
round-trip, and a record written before that field still loads (nothing reserved)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import StatePaths, read_endpoints, write_endpoints


def old_record(state_dir: Path) -> dict[str, Any]:
    """An ``endpoints.json`` as lbtune wrote it before ``reserved_cpus``."""
    url = "http://127.0.0.1:9"
    return {
        "config_name": "t",
        "config_path": "-",
        "state_dir": str(state_dir),
        "balancer": "haproxy",
        "balancer_url": url,
        "stats_url": url,
        "balancer_metrics_url": url,
        "balancer_components": ["haproxy"],
        "balancer_jobs": ["haproxy"],
        "balancer_details": {},
        "replica_header": None,
        "prometheus_url": url,
        "exporter_port": 9,
        "exporter_url": url,
        "prometheus_yml": "-",
        "replicas": [],
        "time_scale": 1.0,
        "ground_truth_path": None,
        "agent_config": None,
        "agent_metrics_url": None,
    }


def test_the_reserved_cpus_round_trip(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    paths.create()
    ep = Endpoints.model_validate({**old_record(tmp_path), "reserved_cpus": [1, 3]})
    write_endpoints(paths, ep)
    assert json.loads(paths.endpoints.read_text())["reserved_cpus"] == [1, 3]
    back = read_endpoints(paths)
    assert back == ep and back is not None and back.reserved_cpus == [1, 3]


def test_a_record_written_before_the_field_loads_with_nothing_reserved(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    paths.create()
    paths.endpoints.write_text(json.dumps(old_record(tmp_path)))
    ep = read_endpoints(paths)
    assert ep is not None and ep.reserved_cpus == []
