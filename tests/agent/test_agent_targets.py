"""The agent against every registered balancer that takes live weights, through the registry.

Each entry's own test cluster (``test_preset``) runs; the agent gets its actuator from
``BalancerBase.weights(endpoints)`` — exactly what ``lbtune agent run`` does — and a fake
input source that makes one replica look overloaded. A new balancer with ``live_weights``
is covered without an edit here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lbtune.agent.config import AgentConfig
from lbtune.agent.loop import Agent
from lbtune.agent.scoring import ReplicaInputs
from lbtune.cluster import api
from lbtune.errors import DependencyError, TargetError
from lbtune.records.endpoints import Endpoints
from lbtune.targets import balancer, names
from lbtune.targets.targetbase import BalancerBase

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

IDLE = ReplicaInputs(kv_usage=0.0, waiting=0, running=0)
SLOW = ReplicaInputs(kv_usage=0.6, waiting=8, running=4, ttft_p50_s=1.0)  # score 0.3
LIVE = [n for n in names() if balancer(n).live_weights]
STATIC = [n for n in names() if not balancer(n).live_weights]


class FixedSource:
    def __init__(self, inputs: dict[str, ReplicaInputs]) -> None:
        self.inputs = inputs

    def read(self) -> dict[str, ReplicaInputs]:
        return dict(self.inputs)


@pytest.fixture(scope="module", params=LIVE)
def deployed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[BalancerBase, Endpoints]]:
    entry = balancer(request.param)
    state = tmp_path_factory.mktemp(request.param)
    try:
        try:
            ep = api.up(entry.test_preset, state)
        except DependencyError as exc:
            pytest.skip(f"{request.param}: {exc}")
        yield entry, ep
    finally:
        api.down(state)


def test_the_agent_moves_an_overloaded_replicas_weight_on_every_live_balancer(
    deployed: tuple[BalancerBase, Endpoints],
) -> None:
    entry, ep = deployed
    weights = entry.weights(ep)
    before = weights.weights()
    assert set(before) == {r.name for r in ep.replicas}
    slow, fast = ep.replicas[-1].name, ep.replicas[0].name
    cfg = AgentConfig(prometheus_url=ep.prometheus_url, state_dir=ep.state_dir, metrics_port=None)
    agent = Agent(cfg, source=FixedSource({fast: IDLE, slow: SLOW}), weights=weights)
    first = agent.step()
    assert first.ok, agent.down
    assert first.pushed == {slow: before[slow] - cfg.max_step}  # 100 → 68: one max_step
    assert weights.weights()[slow] == first.pushed[slow]  # read back from the balancer
    assert weights.weights()[fast] == before[fast]
    second = agent.step()
    assert second.ok and second.pushed[slow] < first.pushed[slow]
    weights.set_weights(before)
    assert weights.weights() == before


@pytest.mark.parametrize("name", STATIC)
def test_a_balancer_without_live_weights_says_so(name: str) -> None:
    entry = balancer(name)
    with pytest.raises(TargetError):
        entry.weights(None)  # type: ignore[arg-type]  # refused before looking at endpoints
