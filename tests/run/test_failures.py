"""A replica dies and Prometheus disappears in the middle of a stress run.

Its own cluster, because both failures are permanent for that cluster.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import running_cluster

pytestmark = pytest.mark.integration


def test_replica_crash_and_prometheus_loss_mid_run(tmp_path: Path) -> None:
    from lbtune.loadgen.recordio import read_records
    from lbtune.run.stress import StressOptions, run_stress

    with running_cluster(tmp_path / "state", time_scale=8.0) as ep:
        l4 = next(r for r in ep.replicas if r.name == "l4-0")
        prom_pid = json.loads((Path(ep.state_dir) / "prometheus.pid").read_text())["pid"]
        out = tmp_path / "report"
        opts = StressOptions(
            scenario="chat", duration_s=16, users=8, state_dir=Path(ep.state_dir), out_dir=out
        )
        done = threading.Event()

        def sabotage() -> None:
            # Wait until l4-0 is serving streams, then kill it; later kill Prometheus.
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not done.is_set():
                state = requests.get(f"{l4.url}/admin/state", timeout=2).json()
                if state["in_flight"] > 0:
                    break
                time.sleep(0.1)
            requests.post(f"{l4.url}/admin/crash", json={}, timeout=2)
            time.sleep(4)
            os.kill(prom_pid, signal.SIGKILL)

        saboteur = threading.Thread(target=sabotage)
        saboteur.start()
        try:
            result = run_stress(opts)
        finally:
            done.set()
            saboteur.join(timeout=30)

        records = read_records(result.records_path)
        failed_on_l4 = [r for r in records if r.replica == "l4-0" and r.outcome == "broken_stream"]
        assert failed_on_l4, "the streams cut by the crash must be counted against l4-0"
        later_ok = [
            r
            for r in records
            if r.outcome == "ok"
            and r.replica == "h100-0"
            and r.sent_at > min(x.ended_at for x in failed_on_l4)
        ]
        assert later_ok, "the run must go on on the surviving replica"
        summary = result.summary
        assert summary.all_outcomes.sent == len(records)
        per_replica = {r.replica: r for r in summary.replicas}
        if "l4-0" in per_replica:
            assert per_replica["l4-0"].errors >= 1
        assert summary.incomplete is True
        assert any("Prometheus" in n for n in summary.notes), summary.notes
        assert (out / "summary.json").exists() and (out / "report.html").exists()
