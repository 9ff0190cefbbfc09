"""A command that read a Parquet file exits with its own status, not SIGABRT.

Arrow's thread pool, once a read has started it, aborts CPython at exit in most runs
("terminate called without an active exception", exit -6): a stress run against a dead
target exited -6 instead of 3 in CI. :func:`lbtune.safety.files.read_parquet` decodes on
the calling thread. The race is per process, so the check is several fresh interpreters
(with Arrow's threads, about half of them abort here).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lbtune.loadgen.recordio import write_parquet
from lbtune.records.requests import RequestRecord

PROCESSES = 8


def _records(n: int) -> list[RequestRecord]:
    return [
        RequestRecord(
            request_id=f"r{i}",
            index=i,
            model="m",
            api="chat",
            stream=True,
            sent_at=float(i),
            ended_at=i + 0.5,
            outcome="ok",
            chunk_times=(i + 0.1, i + 0.2),
            prompt_tokens=8,
            output_tokens=2,
        )
        for i in range(n)
    ]


@pytest.mark.parametrize(
    "reader",
    [
        "from lbtune.loadgen.recordio import read_records as r; assert len(r(p)) == 200",
        "from pathlib import Path; from lbtune.scenario.traces.lbtune_run import read as r; "
        "assert len(r(Path(p), 'x')) == 200",
    ],
)
def test_reading_records_leaves_no_thread_that_aborts_the_exit(tmp_path: Path, reader: str) -> None:
    path = write_parquet(_records(200), tmp_path / "requests.parquet")
    code = f"import sys; p = sys.argv[1]; {reader}"
    outcomes = [  # one after another: started together, they rarely race at exit
        subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120
        )
        for _ in range(PROCESSES)
    ]
    bad = [(r.returncode, r.stderr.strip()[-200:]) for r in outcomes if r.returncode != 0]
    assert not bad, f"{len(bad)} of {PROCESSES} exits failed: {bad[:2]}"
