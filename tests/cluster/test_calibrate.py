"""``lbtune cluster calibrate`` (:mod:`lbtune.cluster.calibrate`): the fit, a simulated
replica whose rates are known (the cost model's), the record, the scheduler's facts from
it, and the command's errors. The real vLLM's calibration is in
tests/conformance/test_calibrate.py and tests/conformance/test_vllm_cluster.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lbtune.cluster.calibrate import calibrate, fit_prefill, measure_replica
from lbtune.cluster.probing import (
    ProbePlan,
    decode_step_at,
    kv_cache_size,
    least_ttft,
)
from lbtune.cluster.resolve import free_port
from lbtune.errors import ClusterError, ConfigError
from lbtune.records.calibration import Calibration, ReplicaRates, read_calibration
from lbtune.records.endpoints import Endpoints, ReplicaAddress, ReplicaEndpoint
from lbtune.sim.costmodel import engine_rates
from lbtune.sim.engine import Engine
from lbtune.sim.profiles import GPU_PROFILES, MODEL_PROFILES
from lbtune.targets.base import pool_names
from lbtune.targets.haproxy.files import Site
from lbtune.targets.haproxy.llm import rate_facts
from tests.cluster.conftest import M8
from tests.cluster.conftest import SIM_SCALE as SCALE


def test_the_fit_recovers_a_replica_of_the_schedulers_model() -> None:
    rate, overhead, step = 5000.0, 0.012, 0.03
    points = [(n, overhead + math.sqrt(step**2 + (n / rate) ** 2)) for n in (16, 300, 1200)]
    got_rate, got_overhead, err = fit_prefill(points, step)
    assert got_rate == pytest.approx(rate, rel=1e-3)
    assert got_overhead == pytest.approx(overhead, rel=1e-3)
    assert err < 1e-4
    # a replica measured 20 % slow at the longest prompt: the fit says how far off it is
    skewed = [*points[:2], (1200, points[2][1] * 1.2)]
    assert fit_prefill(skewed, step)[2] > 0.02
    with pytest.raises(ValueError, match="two prompt lengths"):
        fit_prefill([(100, 0.1), (100, 0.11)], step)


@pytest.mark.integration
def test_a_simulated_l4_is_calibrated_to_its_cost_model(l4_replica: ReplicaEndpoint) -> None:
    """The simulator's engine rates are known: the measurement, through HTTP and the wall
    clock, must find them (in GPU seconds: wall × the time scale)."""
    said: list[str] = []
    got = measure_replica(l4_replica, ProbePlan(), progress=said.append)
    known = engine_rates(GPU_PROFILES["l4-24g"], MODEL_PROFILES[M8])
    assert got.prefill_tokens_per_s / SCALE == pytest.approx(known.prefill_tokens_per_s, rel=0.2)
    assert got.step_s * SCALE == pytest.approx(known.step_s, rel=0.15)
    assert 0 <= got.step_per_seq_s * SCALE < known.step_s / 4
    assert got.fit_error < 0.25 and got.probes >= 25
    assert any("prefill of" in m for m in said)


def _endpoints(state: Path, replicas: list[ReplicaEndpoint], scale: float = SCALE) -> Endpoints:
    """What calibrate reads of a cluster: its replicas, state dir and time scale."""
    url = "http://127.0.0.1:9"
    return Endpoints(
        config_name="t", config_path="<test>", state_dir=str(state), balancer="haproxy",
        balancer_url=url, stats_url=url, balancer_metrics_url=url, balancer_components=[],
        balancer_jobs=[], balancer_details={}, replica_header="X-Lbtune-Replica",
        prometheus_url=url, exporter_port=1, exporter_url=url, prometheus_yml="-",
        replicas=replicas, time_scale=scale, ground_truth_path=None,
    )  # fmt: skip


@pytest.mark.integration
def test_calibrate_writes_the_record_and_keeps_other_replicas(
    l4_replica: ReplicaEndpoint, tmp_path: Path
) -> None:
    other = ReplicaRates(
        name="gone-1", model=M8, url="http://127.0.0.1:9", prefill_tokens_per_s=1000.0,
        step_s=0.05, step_per_seq_s=0.0, overhead_s=0.0, probes=1, fit_error=0.0,
    )  # fmt: skip
    Calibration(measured_at="x", time_scale=SCALE, replicas=[other]).write(tmp_path)
    ep = _endpoints(tmp_path, [l4_replica])
    cal = calibrate(ep, plan=ProbePlan(repeats=1, decode_tokens=8))
    assert read_calibration(tmp_path) == cal
    assert [r.name for r in cal.replicas] == ["gone-1", "l4-0"]
    with pytest.raises(ConfigError, match="--replica nope: no such replica"):
        calibrate(ep, ["nope"])
    # a replica that does not answer: a one-line error naming it, and nothing written
    dead = ReplicaEndpoint(name="dead-0", url=f"http://127.0.0.1:{free_port()}", models=[M8])
    with pytest.raises(ClusterError, match="calibrating replica dead-0"):
        calibrate(_endpoints(tmp_path, [dead]))
    assert read_calibration(tmp_path) == cal


def test_the_scheduler_takes_measured_rates_only_where_it_has_no_profile(tmp_path: Path) -> None:
    def rates(name: str, tps: float) -> ReplicaRates:
        return ReplicaRates(
            name=name, model=M8, url="http://127.0.0.1:9", prefill_tokens_per_s=tps,
            step_s=0.01, step_per_seq_s=0.001, overhead_s=0.002, probes=23, fit_error=0.05,
        )  # fmt: skip

    site = Site(
        state_dir=str(tmp_path), host="127.0.0.1", port=1, stats_port=2, time_scale=2.0,
        replicas=(
            ReplicaAddress("cpu-0", "127.0.0.1", 3, (M8,), gpu="cpu"),
            ReplicaAddress("h100-0", "127.0.0.1", 4, (M8,), gpu="h100-80g"),
            ReplicaAddress("new-0", "127.0.0.1", 5, (M8,), gpu=None),
        ),
    )  # fmt: skip
    before = rate_facts(site)
    assert not any(k.endswith(".cpu-0") for k in before)  # no profile, no calibration yet
    Calibration(
        measured_at="x", time_scale=2.0,
        replicas=[rates("cpu-0", 8000.0), rates("h100-0", 1.0)],
    ).write(tmp_path)  # fmt: skip
    facts = rate_facts(site)
    be = pool_names(site.models)[M8]
    # measured in wall seconds at time scale 2 (wall = GPU / 2): GPU rates are half, steps twice
    assert facts[f"tps.{be}.cpu-0"] == "4000"
    assert facts[f"step.{be}.cpu-0"] == "0.02" and facts[f"stepk.{be}.cpu-0"] == "0.002"
    assert facts["ovh.cpu-0"] == "0.004"
    # the profile wins where lbtune has one; a replica never measured has no rates
    assert {k: v for k, v in facts.items() if "h100-0" in k} == {
        k: v for k, v in before.items() if "h100-0" in k
    }
    assert not any(k.endswith(".new-0") for k in facts)


def test_a_damaged_record_is_one_line_that_says_how_to_redo_it(tmp_path: Path) -> None:
    (tmp_path / "calibration.json").write_text('{"measured_at": 3')
    with pytest.raises(ConfigError, match="lbtune cluster calibrate --state-dir"):
        read_calibration(tmp_path)


@pytest.mark.integration
def test_a_second_measurement_is_not_served_from_the_prefix_cache(
    l4_replica: ReplicaEndpoint,
) -> None:
    """Each measurement's texts are fresh: with the same texts every time, a second
    calibration's prompts hit the replica's prefix cache (a prefill rate 16x too high)."""
    plan = ProbePlan(repeats=1)
    _, first = least_ttft(l4_replica, 1500, plan)
    _, second = least_ttft(l4_replica, 1500, plan)
    assert second > 0.7 * first
    pinned = ProbePlan(repeats=1, seed=11)  # the same texts twice: the cache answers
    least_ttft(l4_replica, 1500, pinned)
    assert least_ttft(l4_replica, 1500, pinned)[1] < 0.5 * first


@pytest.mark.integration
def test_the_kv_size_and_the_batch_decode_are_read_from_outside(
    l4_replica: ReplicaEndpoint,
) -> None:
    """vLLM's ``cache_config_info`` as the simulator exports it gives the engine's own KV
    pool; a batch with long prompts decodes slower than with short ones (the KV reads)."""
    gpu, m = GPU_PROFILES["l4-24g"], MODEL_PROFILES[M8]
    assert kv_cache_size(l4_replica) == (16, Engine(gpu, [m]).kv_capacity_blocks)
    plan = ProbePlan(repeats=1, decode_tokens=16)
    short = decode_step_at(l4_replica, 4, 16, plan)
    long = decode_step_at(l4_replica, 4, 2000, plan)
    assert short * SCALE == pytest.approx(engine_rates(gpu, m).step_s, rel=0.2)
    assert long > short
    counted, ttft = least_ttft(l4_replica, 600, plan)
    assert counted >= 600 and ttft > short
