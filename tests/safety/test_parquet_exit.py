"""A command that read a Parquet file exits with its own status, not SIGABRT.

Arrow's thread pools, once a read has started them, abort CPython at exit in some runs
("terminate called without an active exception", exit -6): a stress run against a dead
target exited -6 instead of 3 in CI. :func:`lbtune.safety.files.read_parquet` reads
without starting any Arrow thread. The abort is a race (2 of 300 loaded exits with
``read_table(use_threads=False)``), so what is checked is its cause, which is certain:
the number of the process's threads before and after the read, in a fresh interpreter;
and that those interpreters exit 0.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from lbtune.loadgen.recordio import write_parquet
from lbtune.records.requests import RequestRecord
from tests.metrics.records import rec

PROCESSES = 4

COUNT = "import os, pyarrow.parquet; n = lambda: len(os.listdir('/proc/self/task')); "
"""A thread counter, after pyarrow's import (which starts its allocator's own thread)."""


def _records(n: int) -> list[RequestRecord]:
    """Records a trace replay accepts too (it needs each prompt's length)."""
    return [replace(rec(i, sent=float(i), ttft=0.1, e2e=0.5), prompt_tokens=8) for i in range(n)]


@pytest.mark.parametrize(
    "reader",
    [
        "from lbtune.loadgen.recordio import read_records as r; "
        "before = n(); assert len(r(p)) == 200",
        "from pathlib import Path; from lbtune.scenario.traces.lbtune_run import read as r; "
        "before = n(); assert len(r(Path(p), 'x')) == 200",
    ],
)
def test_reading_records_starts_no_thread_that_aborts_the_exit(tmp_path: Path, reader: str) -> None:
    path = write_parquet(_records(200), tmp_path / "requests.parquet")
    code = f"import sys; p = sys.argv[1]; {COUNT}{reader}; print(n() - before)"
    outcomes = [
        subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120
        )
        for _ in range(PROCESSES)
    ]
    bad = [(r.returncode, r.stderr.strip()[-200:]) for r in outcomes if r.returncode != 0]
    assert not bad, f"{len(bad)} of {PROCESSES} exits failed: {bad[:2]}"
    started = {int(r.stdout.strip()) for r in outcomes}
    assert started == {0}, f"the read started {max(started)} threads"
