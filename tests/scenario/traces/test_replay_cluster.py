"""A Mooncake trace replayed on the embedded mini2 cluster: the replicas' prefix caches
see the shared blocks, the records hold the trace's lengths, send times follow the trace."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from lbtune.scenario.loader import trace_ref
from tests.conftest import running_cluster

pytestmark = pytest.mark.integration

N = 24


def _hits(cluster: Any) -> float:
    total = 0.0
    for r in cluster.replicas:
        for line in requests.get(f"{r.url}/metrics", timeout=5).text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def _trace(path: Path, shared: bool) -> Path:
    rows = []
    for i in range(N):
        lead = [7, 8] if shared else [10_000 + 3 * i, 10_001 + 3 * i]
        rows.append(
            {
                "timestamp": i * 80,
                "input_length": 1024 + 64,
                "output_length": 4,
                "hash_ids": [*lead, 20_000 + i],
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with running_cluster(tmp_path_factory.mktemp("trace-cluster"), time_scale=8.0) as ep:
        yield ep


def _replay(cluster: Any, trace: Path, out: Path) -> tuple[float, Any]:
    from lbtune.run.stress import StressOptions, run_stress

    before = _hits(cluster)
    result = run_stress(
        StressOptions(
            scenario=trace_ref(trace, "mooncake", 2.0),
            state_dir=Path(cluster.state_dir),
            out_dir=out,
            write_report=False,
        )
    )
    return _hits(cluster) - before, result


def test_shared_blocks_hit_the_replicas_prefix_caches(cluster: Any, tmp_path: Path) -> None:
    from lbtune.loadgen.recordio import read_records

    shared_hits, shared = _replay(cluster, _trace(tmp_path / "shared.jsonl", True), tmp_path / "a")
    own_hits, _ = _replay(cluster, _trace(tmp_path / "own.jsonl", False), tmp_path / "b")
    replicas = len(cluster.replicas)
    # Every request after the first on each replica finds the two shared 512-token blocks.
    assert shared_hits >= (N - replicas) * 1024 * 0.9, (shared_hits, own_hits)
    assert own_hits < shared_hits / 10, (shared_hits, own_hits)
    recs = read_records(shared.records_path)
    assert len(recs) == N and all(r.outcome == "ok" for r in recs)
    assert {r.output_tokens for r in recs} == {4}
    # The server counts the trace's 1088 prompt tokens plus its chat template's few.
    (served,) = {r.prompt_tokens for r in recs}
    assert served is not None and 1088 <= served <= 1088 + 16
    # Send times: 80 ms apart at 2x speed, i.e. 40 ms.
    ok = sorted(recs, key=lambda r: r.index)
    first = ok[0].scheduled_at
    assert first is not None
    for r in ok:
        assert r.scheduled_at == pytest.approx(first + r.index * 0.040, abs=1e-3)
    assert shared.plan.scenario.source is not None
    assert "x2 speed" in shared.plan.scenario_name


def test_stress_trace_shortcut_runs_the_trace_and_names_it(cluster: Any, tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.scenario.traces.conftest import azure_text

    trace = tmp_path / "azure.csv"
    trace.write_text(azure_text(16, gap=0.2))
    out = tmp_path / "report"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lbtune",
            "stress",
            "--trace",
            str(trace),
            "--speedup",
            "2",
            "--state-dir",
            str(cluster.state_dir),
            "--out",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["scenario"] == "trace azure.csv (azure, from 0 s, all requests, x2 speed)"
    assert "trace azure.csv" in (out / "report.md").read_text()
    from lbtune.loadgen.recordio import read_records

    recs = read_records(out / "requests.parquet")
    assert len(recs) == 16
    assert sorted(r.prompt_tokens or 0 for r in recs)[0] >= 40  # the trace's lengths (+template)
