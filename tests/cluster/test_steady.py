"""A replica kept busy (lbtune/cluster/steady.py), against a processor-sharing server."""

from __future__ import annotations

import pytest

from lbtune.cluster.probing import ProbePlan
from lbtune.cluster.resolve import free_port
from lbtune.cluster.steady import steady_state
from lbtune.errors import ClusterError
from lbtune.records.endpoints import ReplicaEndpoint
from tests.twin.psserver import PsServer

M8 = "llama-3.1-8b-instruct"


@pytest.mark.integration
def test_a_replica_kept_busy_shows_its_step_under_load() -> None:
    """Processor sharing above 2 slots (tests/twin/psserver.py): at 6 streams each gets a
    token every 3 x 4 ms; a lone stream every 4 ms. Requests of the warm-up are left out,
    and a replica that answers nothing is one line naming it."""
    ps = PsServer(slots=2, token_s=0.004)
    rep = ReplicaEndpoint(name="ps-0", url=ps.start(), models=[M8])
    try:
        plan = ProbePlan(decode_tokens=16, timeout_s=10.0)
        busy = steady_state(rep, 6, 64, plan, duration_s=2.5, warmup_s=0.5)
        lone = steady_state(rep, 1, 64, plan, duration_s=1.5, warmup_s=0.3)
    finally:
        ps.stop()
    # the server paces its tokens; a busy host only adds time (the test runs beside others)
    assert 0.9 * 0.012 <= busy.step_s < 0.04
    assert 0.9 * 0.004 <= lone.step_s < 0.6 * busy.step_s
    assert busy.ttft_s > lone.ttft_s and busy.prompt_tokens > 32  # the server's count
    assert 6 <= busy.requests < busy.sent
    assert busy.scrape_s is not None and 0 < busy.scrape_s < 1  # its /metrics, timed meanwhile
    gone = ReplicaEndpoint(name="gone", url=f"http://127.0.0.1:{free_port()}", models=[M8])
    with pytest.raises(ClusterError, match="gone"):
        steady_state(gone, 2, 16, ProbePlan(timeout_s=2.0), duration_s=1.0, warmup_s=0.0)
