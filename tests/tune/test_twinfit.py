"""``lbtune twin fit`` on running clusters: on the simulator it must find the cost model's
own rates; on a server lbtune did not build (processor sharing above a slot count, no
vLLM metrics) it must fit what it can see and validate itself; and a validation scenario
it cannot cover is refused before any load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lbtune.cluster import api
from lbtune.cluster.config import parse_config
from lbtune.errors import ConfigError
from lbtune.records.calibration import read_calibration
from lbtune.sim.costmodel import engine_rates
from lbtune.sim.engine import Engine
from lbtune.sim.profiles import get_gpu, get_model
from lbtune.tune.twinfit import FitOptions, fit_twin
from lbtune.twin.fitted import FIT_METRICS, MAX_ERROR, read_profile
from tests.conftest import running_cluster
from tests.twin.psserver import PsServer

pytestmark = pytest.mark.integration

M8 = "llama-3.1-8b-instruct"
SCALE = 8.0


@pytest.fixture(scope="module")
def mini2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state = tmp_path_factory.mktemp("fit") / "state"
    with running_cluster(state, "mini2", time_scale=SCALE):
        yield state


def test_a_scenario_the_fit_cannot_cover_is_refused_before_any_load(mini2: Path) -> None:
    said: list[str] = []
    with pytest.raises(ConfigError, match=r"--scenario mixed uses llama-3.1-70b.*e\.g\. chat"):
        fit_twin(FitOptions(state_dir=mini2, scenario="mixed"), said.append)
    assert said == []  # not even the load statement: nothing was sent
    assert read_calibration(mini2) is None


def test_the_fit_finds_the_simulators_cost_model(mini2: Path) -> None:
    said: list[str] = []
    opts = FitOptions(state_dir=mini2, runs=1, duration_s=8.0, scenario="chat")
    profile, path = fit_twin(opts, said.append)
    assert said[0].startswith("twin fit: 2 replicas, one at a time, straight at each")
    assert read_profile(path) == profile and path == mini2 / "twin-profile.json"
    cal = read_calibration(mini2)
    assert cal is not None and [r.name for r in cal.replicas] == ["h100-0", "l4-0"]
    m = get_model(M8)
    for f in profile.replicas:
        gpu = get_gpu("h100-80g" if f.name.startswith("h100") else "l4-24g")
        known = engine_rates(gpu, m)
        # wall seconds at time scale 8: the cost model's GPU seconds / 8
        assert f.prefill_tokens_per_s.value / SCALE == pytest.approx(
            known.prefill_tokens_per_s, rel=0.25
        ), f.name
        assert f.step_s.value * SCALE == pytest.approx(known.step_s, rel=0.2), f.name
        kv_blocks = Engine(gpu, [m] if f.name.startswith("l4") else [m, get_model(
            "llama-3.1-70b-instruct-awq"
        )]).kv_capacity_blocks  # fmt: skip
        assert f.kv_tokens == 16 * kv_blocks and f.max_model_len is not None
        assert f.attn_s_per_pair.value > 0  # an 8192-token prompt's later chunks attend back
    v = profile.validation
    assert v is not None and v.runs == 1 and set(v.errors) == set(FIT_METRICS)
    assert all(x is not None for x in v.live.values())


@pytest.fixture(scope="module")
def ps_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    servers = [PsServer(slots=2, token_s=0.004) for _ in range(2)]
    urls = [s.start() for s in servers]
    state = tmp_path_factory.mktemp("ps") / "state"
    cfg = parse_config(
        {
            "name": "ps2",
            "ports": "auto",
            "external": [{"name": f"ps-{i}", "url": u, "models": [M8]} for i, u in enumerate(urls)],
        },
        "<test>",
    )
    try:
        api.up(cfg, state)
        yield state
    finally:
        api.down(state)
        for s in servers:
            s.stop()


def test_a_server_lbtune_did_not_build_is_fitted_and_validated(ps_cluster: Path) -> None:
    """No vLLM metrics (the KV size is unknown, said so); the slot count shows as a batch
    slope; the validation either holds within the bound or the profile says it is not
    trusted, naming the figure: never a silent pass."""
    opts = FitOptions(state_dir=ps_cluster, runs=1, duration_s=10.0, scenario="chat")
    profile, _ = fit_twin(opts, lambda m: None)
    for f in profile.replicas:
        assert f.kv_tokens is None
        # 8 at once on 2 slots: each token 4x slower, a slope of ~3/7 of a token's time
        assert f.step_per_seq_s.value > 0.2 * f.step_s.value, f
    v = profile.validation
    assert v is not None and set(v.errors) == set(FIT_METRICS)
    name, worst = v.worst
    why = profile.trusted()
    if worst <= MAX_ERROR:
        assert why is None
    else:
        assert why is not None and f"missed {name} by" in why


def test_replicas_kept_busy_give_the_step_and_front_end_under_load(ps_cluster: Path) -> None:
    """``--steady``: each replica kept at 8 streams (closed loop). On 2 slots each stream
    gets a token every 4 x 4 ms, so a step of 8 is ~16 ms: the slope is fitted to that,
    and the TTFT left over is the busy front end (never below the idle one)."""
    said: list[str] = []
    opts = FitOptions(state_dir=ps_cluster, validate=False, steady=True, steady_s=4.0)
    profile, _ = fit_twin(opts, said.append)
    assert any("kept busy for 4 s" in m for m in said[:1]), said[:1]  # said before any load
    for f in profile.replicas:
        at_8 = f.step_s.value + 7 * f.step_per_seq_s.value
        assert 0.9 * 0.016 <= at_8 < 0.04, f  # paced by the server; a busy host adds time
        assert f.busy_overhead_s is not None
        assert f.busy_overhead_s.value >= f.overhead_s.value
        assert f.scrape_s is not None  # its /metrics answers: the llm scheduler's scrape
    with pytest.raises(ConfigError, match="steady-state probe: 2 to 120 s"):
        fit_twin(FitOptions(state_dir=ps_cluster, steady=True, steady_s=0.5), said.append)
