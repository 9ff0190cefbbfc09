"""What a replica says of itself (lbtune/cluster/probing.py); the probes' requests are
measured against simulated replicas in tests/cluster/test_calibrate.py."""

from __future__ import annotations

import time
from typing import ClassVar

import pytest

from lbtune.cluster import probing
from lbtune.cluster.probing import ProbePlan, Prober, histogram_totals, parse_cache_info
from lbtune.records.endpoints import ReplicaEndpoint
from lbtune.records.requests import RequestRecord
from lbtune.scenario.request import RequestSpec
from tests.cluster.conftest import M8


def test_cache_info_is_parsed_from_an_exposition_or_said_absent() -> None:
    text = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="40",cache_dtype="auto"} 1.0\n'
    )
    assert parse_cache_info(text) == (16, 40)
    assert parse_cache_info("# TYPE ps_running gauge\nps_running 0\n") is None
    assert parse_cache_info("not an exposition {") is None


def test_vllms_histograms_are_summed_over_their_label_sets() -> None:
    text = (
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        'vllm:time_to_first_token_seconds_bucket{model_name="a",le="+Inf"} 3.0\n'
        'vllm:time_to_first_token_seconds_sum{model_name="a"} 0.3\n'
        'vllm:time_to_first_token_seconds_count{model_name="a"} 3.0\n'
        'vllm:time_to_first_token_seconds_bucket{model_name="b",le="+Inf"} 1.0\n'
        'vllm:time_to_first_token_seconds_sum{model_name="b"} 0.5\n'
        'vllm:time_to_first_token_seconds_count{model_name="b"} 1.0\n'
        "# TYPE ps_running gauge\nps_running 2\n"
    )
    got = histogram_totals(text)
    assert set(got) == {"ttft"}  # no queue or token-interval histogram: left out
    assert got["ttft"] == pytest.approx((0.8, 4.0))
    assert histogram_totals("not an exposition {") == {}


class _Client:
    """Stands in for StreamClient: the test is about the requests a loop sends, not the
    wire. Each answer takes 1 ms and carries a token a millisecond."""

    sent: ClassVar[list[RequestSpec]] = []

    def __init__(self, *args: object, **kw: object) -> None:
        pass

    def send(self, spec: RequestSpec) -> RequestRecord:
        _Client.sent.append(spec)
        t = time.time()
        times = tuple(t + 0.001 * (k + 1) for k in range(spec.max_tokens))
        return RequestRecord(
            request_id=str(spec.index),
            index=spec.index,
            model=spec.model,
            api=spec.api,
            stream=True,
            sent_at=t,
            ended_at=times[-1],
            outcome="ok",
            first_token_at=times[0],
            chunk_times=times,
            prompt_tokens=spec.prompt_tokens,
            output_tokens=spec.max_tokens,
        )

    def close(self) -> None:
        pass


def test_loops_side_by_side_draw_their_outputs_so_they_drift_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kept-busy streams with equal outputs stay in lockstep (every prompt arriving with
    all the others'); with ``spread`` each request's output is drawn within ±spread of the
    asked one, its mean kept, and no two loops draw the same sequence."""
    monkeypatch.setattr(probing, "StreamClient", _Client)
    rep = ReplicaEndpoint(name="r", url="http://127.0.0.1:9", models=[M8])
    p = Prober(rep, M8, ProbePlan(seed=3), None)
    outs = []
    for _ in range(2):
        _Client.sent = []
        got = p.loop(64, 40, time.monotonic() + 0.3, spread=0.5)
        assert len(got) == len(_Client.sent) >= 5
        outs.append([s.max_tokens for s in _Client.sent])
    for o in outs:
        assert all(20 <= n <= 60 for n in o) and len(set(o)) > 1
        assert all(
            s.extra_body == {"ignore_eos": True, "min_tokens": s.max_tokens} for s in _Client.sent
        )
    assert outs[0][:5] != outs[1][:5]
    _Client.sent = []
    p.loop(64, 40, time.monotonic() + 0.1)
    assert {s.max_tokens for s in _Client.sent} == {40}  # no spread: as asked
