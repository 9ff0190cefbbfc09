"""The agent loop against a real HAProxy (through the HAProxy target's live weights):
pushes, resilience (log once), reload, exporter."""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lbtune.agent.config import AgentConfig
from lbtune.agent.exporter import AgentMetrics
from lbtune.agent.loop import Agent, AgentThread, StepResult, run
from lbtune.agent.scoring import ReplicaInputs
from lbtune.metrics.prom import PrometheusUnreachable
from lbtune.targets.haproxy.balancer import HaproxyWeights
from lbtune.targets.haproxy.runtime import HaproxyRuntime
from tests.targets.haproxy_fixture import free_port, needs_haproxy, running_haproxy

pytestmark = [pytest.mark.integration, needs_haproxy, pytest.mark.timeout(60)]

BACKENDS = {"all": ["fast", "slow"], "model_8b": ["fast", "slow"], "model_70b": ["fast"]}
IDLE = ReplicaInputs(kv_usage=0.0, waiting=0, running=0)
SLOW = ReplicaInputs(kv_usage=0.6, waiting=8, running=4, ttft_p50_s=1.0)  # score 0.3


class FakeSource:
    """Inputs from a list; a PrometheusUnreachable while ``down`` is set."""

    def __init__(self, inputs: dict[str, ReplicaInputs]) -> None:
        self.inputs = inputs
        self.down = False
        self.calls = 0

    def read(self) -> dict[str, ReplicaInputs]:
        self.calls += 1
        if self.down:
            raise PrometheusUnreachable("Prometheus at http://127.0.0.1:1 is unreachable (fake)")
        return dict(self.inputs)


@pytest.fixture()
def sock(tmp_path: Path) -> Iterator[str]:
    with running_haproxy(tmp_path, BACKENDS) as s:
        yield str(s)


def hap(sock: str) -> HaproxyWeights:
    return HaproxyWeights(HaproxyRuntime(sock, timeout_s=1.0))


def cfg(**kw: object) -> AgentConfig:
    base: dict[str, object] = {
        "prometheus_url": f"http://127.0.0.1:{free_port()}",  # closed port
        "interval_s": 0.05,
        "metrics_port": None,
        "query_timeout_s": 1.0,
    }
    return AgentConfig.model_validate({**base, **kw})


def weights(sock: str) -> dict[tuple[str, str], int]:
    return {(s.backend, s.server): s.weight for s in HaproxyRuntime(sock).servers_state()}


def agent_records(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("lbtune.agent") and text in r.message]


def test_prometheus_down_holds_weights_and_logs_once(
    sock: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="lbtune.agent")
    before = weights(sock)
    metrics = AgentMetrics()
    results: list[StepResult] = []
    run(cfg(), max_iterations=4, weights=hap(sock), metrics=metrics, on_step=results.append)
    assert [r.ok for r in results] == [False] * 4
    assert weights(sock) == before
    unreachable = agent_records(caplog, "unreachable")
    assert len(unreachable) == 1 and unreachable[0].levelno == logging.WARNING
    assert "holding the last weights" in unreachable[0].message
    assert metrics.value("lbtune_agent_errors_total", kind="prometheus") == 4
    assert metrics.value("lbtune_agent_last_success_timestamp_seconds") is None


def test_recovery_is_logged_once_and_weights_follow_the_scores(
    sock: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lbtune.agent")
    source = FakeSource({"fast": IDLE, "slow": SLOW})
    source.down = True
    agent = Agent(cfg(), source=source, weights=hap(sock))
    assert not agent.step().ok and not agent.step().ok
    source.down = False
    first = agent.step()
    assert first.ok
    # the slow replica's target is 30, the step limit takes it 100 → 68, in every backend
    assert first.pushed == {"slow": 68}
    assert weights(sock)[("all", "slow")] == weights(sock)[("model_8b", "slow")] == 68
    assert weights(sock)[("model_70b", "fast")] == 100
    assert agent.step().pushed == {"slow": 36}
    assert agent.step().pushed == {"slow": 30}
    assert agent.step().pushed == {}  # only changed weights are pushed
    assert len(agent_records(caplog, "unreachable")) == 1
    assert len(agent_records(caplog, "answers again")) == 1
    changes = agent_records(caplog, "slow: weight")
    assert [r.levelno for r in changes] == [logging.INFO] * 3
    assert "100 → 68" in changes[0].message and "max_step" in changes[0].message


def test_a_balancer_that_does_not_answer_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lbtune.agent")
    source = FakeSource({"fast": IDLE})
    results: list[StepResult] = []
    run(
        cfg(),
        max_iterations=3,
        source=source,
        weights=hap(str(tmp_path / "gone.sock")),
        on_step=results.append,
    )
    assert [r.error for r in results] == ["balancer"] * 3
    assert len(agent_records(caplog, "does not exist")) == 1


def test_a_replica_without_series_keeps_its_weight_logged_once(
    sock: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lbtune.agent")
    HaproxyRuntime(sock).set_weights({("all", "slow"): 40, ("model_8b", "slow"): 40})
    source = FakeSource({"fast": IDLE})
    agent = Agent(cfg(), source=source, weights=hap(sock))
    for _ in range(3):
        result = agent.step()
        assert result.ok and result.pushed == {}
    assert weights(sock)[("all", "slow")] == 40
    assert len(agent_records(caplog, "replica slow has no")) == 1
    assert agent.metrics.value("lbtune_agent_errors_total", kind="series") == 3
    source.inputs["slow"] = IDLE
    assert agent.step().pushed == {"slow": 72}
    assert len(agent_records(caplog, "replica slow has metrics")) == 1


def test_a_refused_push_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="lbtune.agent")
    with running_haproxy(tmp_path, {"all": ["fast", "slow"]}, static={"fixed": ["slow"]}) as s:
        agent = Agent(cfg(), source=FakeSource({"fast": IDLE, "slow": SLOW}), weights=hap(str(s)))
        results = [agent.step() for _ in range(3)]
    assert [r.error for r in results] == ["balancer"] * 3
    refused = agent_records(caplog, "static LB algorithm")
    assert len(refused) == 1 and "fixed/slow" in refused[0].message
    assert not agent_records(caplog, "answers again")
    assert agent.metrics.value("lbtune_agent_errors_total", kind="balancer") == 3


def test_observe_only_and_dry_run_push_nothing(sock: str) -> None:
    source = FakeSource({"fast": IDLE, "slow": SLOW})
    for agent in (
        Agent(cfg(enabled=False), source=source, weights=hap(sock)),
        Agent(cfg(), source=source, weights=hap(sock), dry_run=True),
    ):
        result = agent.step()
        assert result.ok and result.pushed == {}
        assert {d.replica: d.weight for d in result.decisions} == {"fast": 100, "slow": 68}
    assert set(weights(sock).values()) == {100}


def test_sighup_style_reload(sock: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="lbtune.agent")
    path = tmp_path / "agent.yaml"
    path.write_text("max_step: 10\ninterval_s: 0.05\n")
    source = FakeSource({"fast": IDLE, "slow": SLOW})
    base = cfg(max_step=10)
    agent = Agent(
        base, config_path=path, overrides={"interval_s": 0.05}, source=source, weights=hap(sock)
    )
    assert agent.step().pushed["slow"] == 90
    path.write_text("max_step: 50\ninterval_s: 5\n")
    assert agent.reload()
    assert agent.config.max_step == 50 and agent.config.interval_s == 0.05  # flag pinned
    assert agent.step().pushed["slow"] == 40
    path.write_text("max_stepp: 5\n")
    assert not agent.reload()
    assert agent.config.max_step == 50
    assert len(agent_records(caplog, "max_stepp: unknown field")) == 1
    assert len(agent_records(caplog, "pinned by flags: interval_s")) == 1


def test_exporter_serves_the_agent_metrics(sock: str) -> None:
    source = FakeSource({"fast": IDLE, "slow": SLOW})
    with AgentThread(cfg(metrics_port=0), source=source, weights=hap(sock)) as t:
        assert t.wait_steps(2)
        url = t.agent.metrics_url
        assert url is not None and url.startswith("http://127.0.0.1:")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = resp.read().decode()
    assert t.error is None
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    names = {name for name, _ in samples}
    assert ("lbtune_agent_weight", frozenset({("server", "slow")})) in samples
    assert samples[("lbtune_agent_score", frozenset({("replica", "slow")}))] == pytest.approx(0.3)
    slow_input = frozenset({("replica", "slow"), ("input", "kv_usage")})
    assert samples[("lbtune_agent_input", slow_input)] == pytest.approx(0.6)
    slow_latency = frozenset({("replica", "slow"), ("input", "latency_norm")})
    assert samples[("lbtune_agent_input", slow_latency)] == 1
    slow_max_step = frozenset({("replica", "slow"), ("reason", "max_step")})
    assert samples[("lbtune_agent_decisions_total", slow_max_step)] >= 1
    assert "lbtune_agent_last_success_timestamp_seconds" in names
    assert "lbtune_agent_errors_total" not in names  # no error yet
    assert t.agent.metrics_url is None  # stopped with the loop
