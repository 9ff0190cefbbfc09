"""``api.check_balancer`` on a real HAProxy whose worker crashes.

What a study saw: HAProxy 2.6's worker segfaulted and its master, on exit-on-failure,
stopped everything; the study then failed every remaining trial. Here a mini2 cluster's
HAProxy worker gets SIGSEGV (the same exit) and the check must name the dead balancer,
its exit and its log, while it stays silent as long as HAProxy runs. ~10 s.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from lbtune.cluster import api
from lbtune.errors import BalancerDown
from lbtune.process import supervisor
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import StatePaths
from tests.cluster.conftest import mini_config, needs_binaries

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120), needs_binaries]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Endpoints]:
    try:
        yield api.up(mini_config(), tmp_path / "state")
    finally:
        api.down(tmp_path / "state")


def test_a_crashed_haproxy_is_named_and_a_running_one_is_not(cluster: Endpoints) -> None:
    api.check_balancer(cluster)  # running: silent
    (rec,) = [
        r for r in supervisor.records(StatePaths(Path(cluster.state_dir))) if r.name == "haproxy"
    ]
    workers = psutil.Process(rec.pid).children()
    assert workers, "HAProxy's master has a worker"
    for w in workers:
        os.kill(w.pid, signal.SIGSEGV)
    deadline = time.monotonic() + 20
    while supervisor.alive(rec) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not supervisor.alive(rec), "the master exits once its worker crashed"
    with pytest.raises(BalancerDown) as err:
        api.check_balancer(cluster)
    text = str(err.value)
    assert "haproxy" in text and "no longer running" in text and str(rec.pid) in text
    assert rec.log in text and "lbtune optimize --resume" in text
