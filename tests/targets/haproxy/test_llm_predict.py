"""The ``llm`` scheduler's ``mode predict`` (v2), through the twin's model of it (the Lua
makes the same decisions: ``test_llm_conformance.py``): its predictions against the
simulator's own engine on hand-made states, and its picks, SLO cap and hold."""

from __future__ import annotations

import itertools

import pytest

from lbtune.records.endpoints import ReplicaAddress
from lbtune.sim.engine import Engine, SimRequest
from lbtune.sim.profiles import GPU_PROFILES, MODEL_PROFILES
from lbtune.targets.base import pool_names
from lbtune.targets.haproxy import llm as lua
from lbtune.targets.haproxy.files import Site
from lbtune.targets.haproxy.twin import routing_model
from lbtune.targets.haproxy.twin.llm import LlmScheduler
from lbtune.targets.haproxy.twin.predict import Ask
from lbtune.twin.replica import TwinReplica
from lbtune.twin.routing import ClusterView, Retry, Send
from tests.targets.haproxy.test_twin import Rep
from tests.twin.helpers import M8, Req

BE = pool_names([M8])[M8]
_ids = itertools.count(10**6)


def _req(rid: str, prompt: int, out: int) -> SimRequest:
    return SimRequest(rid, M8, [next(_ids) for _ in range(prompt)], out)


def _scheduler(gpu: str, **knobs: str) -> LlmScheduler:
    site = Site("", "x", 0, 0, (ReplicaAddress("s", "x", 0, (M8,), gpu),))
    return LlmScheduler({"mode": "predict", **knobs}, lua.facts(site, []), ["s"])


@pytest.mark.parametrize("gpu", ["h100-80g", "a100-80g", "l4-24g"])
@pytest.mark.parametrize(
    ("ahead", "running", "prompt"),
    [(0, 0, 256), (0, 0, 2048), (0, 0, 8192), (4, 0, 1024), (0, 32, 512), (2, 16, 2048)],
)
def test_predictions_match_the_simulators_engine(
    gpu: str, ahead: int, running: int, prompt: int
) -> None:
    """A replica with ``running`` decodes and ``ahead`` 2048-token prompts routed before
    (queued), then one more request: its predicted TTFT and TPOT against the engine's
    own step times for it (within 15 %: the rates are taken at one chunk and 1k tokens of
    context, the engine's attention grows with the prompt)."""
    sched = _scheduler(gpu)
    eng = Engine(GPU_PROFILES[gpu], [MODEL_PROFILES[M8]])
    for j in range(running):
        eng.add_request(_req(f"d{j}", 900, 400))
    for _ in range(running // 2 + 3):  # their prefill done: a decoding batch
        eng.step()
    assert eng.num_running == running and eng.num_waiting == 0
    sched.predictor.rates["s"].running, sched.state["s"].waiting = float(eng.num_running), 0.0
    for j in range(ahead):  # routed by the scheduler: its backlog
        sched.predictor.pick(["s"], Ask([], 2048.0, 64.0, 100.0), BE, 0.0, expired=True)
        eng.add_request(_req(f"a{j}", 2048, 100))
    pred = sched.predictor.predict("s", Ask([], float(prompt), 64.0, 50.0), BE, 0.0)

    eng.add_request(_req("x", prompt, 50))
    t, first = GPU_PROFILES[gpu].request_overhead_s, None
    steps: list[float] = []
    while len(steps) < 20:
        r = eng.step()
        t += r.duration
        if r.tokens.get("x"):
            if first is None:
                first = t
            else:
                steps.append(r.duration)
    assert first is not None
    assert pred.ttft == pytest.approx(first, rel=0.15)
    assert pred.tpot == pytest.approx(sum(steps) / len(steps), rel=0.15)


def _model(**knobs: float | str) -> tuple[object, ClusterView, dict[str, Rep]]:
    reps = [
        TwinReplica("h100-0", "h100-80g", (M8,)),
        TwinReplica("a100-0", "a100-80g", (M8,)),
        TwinReplica("l4-0", "l4-24g", (M8,)),
    ]
    params: dict[str, float | str] = {"algorithm": "llm", "llm.mode": "predict"}
    params.update({f"llm.{k}": v for k, v in knobs.items()})
    model = routing_model(params, reps)
    state = {r.name: Rep(r.name, gpu=r.gpu) for r in reps}
    return model, ClusterView(state), state


def _body(words: int, max_tokens: int, text: str = "w") -> bytes:
    content = " ".join(f"{text}{i}" for i in range(words))
    return b'{"model":"m","max_tokens":%d,"messages":[{"role":"user","content":"%s"}]}' % (
        max_tokens,
        content.encode(),
    )


def test_a_burst_spreads_by_backlog_and_long_answers_stay_off_the_slow_replica() -> None:
    model, view, _ = _model()
    model.tick(0.0, view)  # type: ignore[attr-defined]
    # twelve ~3.5k-token prompts at once, short answers: the H100's backlog grows by
    # ~0.09 s each, so the A100 (~0.26 s to prefill one) takes its share of the burst
    picks = [
        model.route(Req(i, body=_body(1500, 16, f"p{i}-")), 0.0, view)  # type: ignore[attr-defined]
        for i in range(12)
    ]
    names = [p.replica for p in picks if isinstance(p, Send)]
    assert len(names) == 12 and names[0] == "h100-0"
    assert {"h100-0", "a100-0"} <= set(names)
    assert "l4-0" not in names  # ~0.8 s of prefill there: never the faster start
    # a long answer weighs decode: 300 tokens at ~6 ms (H100) against ~67 ms (L4)
    model2, view2, _ = _model()
    model2.tick(0.0, view2)  # type: ignore[attr-defined]
    long = [
        model2.route(Req(i, body=_body(60, 300, f"q{i}-")), 0.0, view2)  # type: ignore[attr-defined]
        for i in range(40)
    ]
    assert Send("l4-0") not in long and len(set(long)) == 1


def test_within_the_slo_is_kept_and_none_within_holds_then_routes() -> None:
    model, view, state = _model(ttft_slo_ms=400, queue_timeout_ms=500, refresh_ms=250)
    state["h100-0"].num_running = 5000  # a batch whose decode step is ~0.3 s: TPOT SLO missed
    model.tick(0.0, view)  # type: ignore[attr-defined]
    assert model.route(Req(0, body=_body(50, 100)), 0.0, view) == Send("a100-0")  # type: ignore[attr-defined]
    # ~13k prompt tokens: ~1 s of prefill on the A100 (TTFT SLO missed), ~0.35 s on the
    # H100 once its batch drains: held for it, then routed to the lowest predicted cost
    long_req = Req(1, body=_body(10000, 16))
    assert model.route(long_req, 0.01, view) == Retry(0.125)  # type: ignore[attr-defined]
    assert model.route(long_req, 0.3, view) == Retry(0.125)  # type: ignore[attr-defined]
    assert isinstance(model.route(long_req, 0.52, view), Send)  # type: ignore[attr-defined]
    # ~45k tokens: over 1 s of prefill even on an idle H100, so waiting cannot help
    huge = model.route(Req(2, body=_body(30000, 16)), 0.6, view)  # type: ignore[attr-defined]
    assert isinstance(huge, Send)


def test_a_replica_holding_the_prefix_is_predicted_faster() -> None:
    model, view, _ = _model(w_decode=0.0)
    model.tick(0.0, view)  # type: ignore[attr-defined]
    prefix = _body(800, 16, "shared")[:-4]
    first = model.route(Req(0, body=prefix + b' one"}]}'), 0.0, view)  # type: ignore[attr-defined]
    assert first == Send("h100-0")
    # a100-0's own queue empty, h100-0's ~1 block of backlog: the cached prefix (16
    # blocks of 64 tokens) still makes h100-0 the faster start
    again = model.route(Req(1, body=prefix + b' two"}]}'), 0.0, view)  # type: ignore[attr-defined]
    assert again == Send("h100-0")


def test_a_replica_without_rates_is_predicted_from_what_its_metrics_showed() -> None:
    """No ``tps``/``step`` facts (a GPU lbtune has no profile of): the scheduler reads the
    replica's prefill rate (prompt tokens over the time between queue and first token)
    and its decode step (its last inter-token latency) from its /metrics, and keeps the
    step while the replica is idle; a fact, where there is one, still wins."""
    sched = LlmScheduler({"mode": "predict"}, {"time_scale": "2"}, ["s"])
    predict = sched.predictor.predict
    ask = Ask([], 2000.0, 64.0, 16.0)
    default = predict("s", ask, BE, 0.0)
    assert default.work == pytest.approx(2000 / 4000)  # prefill_tps 4000
    rep = Rep("s", ttft_sum_s=1.0, ttft_count=10, prompt_tokens_total=5000, queue_sum_s=0.5,
              itl_sum_s=2.0, itl_count=100, num_running=3)  # fmt: skip
    view = ClusterView({"s": rep})
    sched.scrape(0.0, view)
    # four more first tokens: 4000 prompt tokens in 0.4 s of TTFT, 0.1 s of it queued;
    # 50 more tokens decoded in 0.5 s
    rep.ttft_sum_s, rep.ttft_count, rep.prompt_tokens_total, rep.queue_sum_s = 1.4, 14, 9000, 0.6
    rep.itl_sum_s, rep.itl_count = 2.5, 150
    sched.scrape(0.3, view)
    r = sched.predictor.rates["s"]
    assert r.tps_seen == pytest.approx(4000 / 0.3) and r.itl_last == pytest.approx(0.01)
    seen = predict("s", ask, BE, 300.0)
    assert seen.work == pytest.approx(2000 / (4000 / 0.3 / 2))  # wall rate, in GPU seconds
    assert seen.alone_tpot == pytest.approx(0.01 * 2)  # the step it showed, GPU seconds
    # idle now: the inter-token latency of the next scrape is gone, the step it showed stays
    rep.num_running = 0
    sched.scrape(0.6, view)
    assert r.itl == 0.0 and predict("s", ask, BE, 600.0).alone_tpot == pytest.approx(0.02)
    # the map's facts win over what was seen
    sched.facts |= {f"tps.{BE}.s": 20000.0, f"step.{BE}.s": 0.005}
    fact = predict("s", ask, BE, 600.0)
    assert fact.work == pytest.approx(0.1) and fact.alone_tpot == pytest.approx(0.005)
