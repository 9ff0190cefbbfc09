"""LLMUser from a plain locustfile, driven by Locust's own command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lbtune.cluster.resolve import free_port as _free_port
from lbtune.sim.host import run_in_thread
from lbtune.sim.spec import HostSpec, ReplicaSpec

ROOT = Path(__file__).resolve().parents[2]


def test_plain_locust_run_records_every_request(tmp_path: Path) -> None:
    spec = HostSpec(
        time_scale=20.0,
        replicas=[
            ReplicaSpec(
                name="r0", port=_free_port(), gpu="h100-80g", models=["llama-3.1-8b-instruct"]
            )
        ],
    )
    locust = Path(sys.executable).with_name("locust")
    with run_in_thread(spec) as host:
        proc = subprocess.run(
            [
                str(locust),
                "-f",
                str(ROOT / "examples" / "locustfile.py"),
                "--headless",
                "-u",
                "2",
                "-r",
                "2",
                "-t",
                "10s",  # Locust's clock starts before its users do: seconds on a busy machine
                "--host",
                host.urls["r0"],
                "--lbtune-scenario",
                "chat",
                "--lbtune-records-dir",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ},
        )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # 1: Locust saw failures
    from lbtune.loadgen.recordio import finalize, read_records

    records = read_records(finalize(tmp_path))
    assert records, proc.stderr[-2000:]
    ok = [r for r in records if r.outcome == "ok"]
    assert ok and all(r.ttft is not None and r.ttft > 0 for r in ok)
    stats = [line for line in (proc.stderr + proc.stdout).splitlines() if "SSE" in line]
    assert any("/chat" in line for line in stats), "Locust's own stats table lists the requests"
