"""HAProxy's routing model in the twin, against hand-made cases with known picks."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from lbtune.targets.haproxy.twin import HaproxyModel, routing_model
from lbtune.targets.haproxy.twin.backend import Backend, BackendSettings
from lbtune.targets.haproxy.twin.lb import Fwlc, Fwrr, Ring, Server, full_hash, sdbm
from lbtune.targets.haproxy.twin.llm import SCRAPE_S, lua_defaults
from lbtune.targets.space import ParameterSpace
from lbtune.twin.fitted import Measured, ReplicaFit
from lbtune.twin.options import TwinOptions
from lbtune.twin.replica import TwinReplica
from lbtune.twin.routing import ClusterView, Queue, Refuse, Retry, Send
from lbtune.twin.run import simulate
from tests.twin.helpers import M8, M70, Req, cluster_replicas, plan, scenario_file

SPACE = Path(__file__).parents[3] / "lbtune" / "targets" / "haproxy" / "space.yaml"


def servers(*weights: int, maxconn: int = 0) -> list[Server]:
    return [Server("abcdefgh"[i], i + 1, w, maxconn) for i, w in enumerate(weights)]


# -- the algorithms --------------------------------------------------------------------


def test_hash_functions_are_haproxys() -> None:
    # sdbm by hand: h = c + (h << 6) + (h << 16) - h
    h = 0
    for c in b"ab":
        h = (c + (h << 6) + (h << 16) - h) & 0xFFFFFFFF
    assert sdbm(b"ab") == h == 6363201
    assert sdbm(b"") == 0
    assert full_hash(0) != full_hash(1) and 0 <= full_hash(12345) < 2**32


def test_roundrobin_2_to_1_follows_the_fwrr_positions() -> None:
    # Traced by hand through lb_fwrr.c (eweights 32 and 16, total 48): a takes positions
    # 48 and 49 (rweight carry), b position 50, then again.
    rr = Fwrr(servers(2, 1))
    assert "".join(rr.pick().name for _ in range(9)) == "aabaabaab"  # type: ignore[union-attr]


def test_roundrobin_5_3_1_is_smooth_and_exact_per_round() -> None:
    rr = Fwrr(servers(5, 3, 1))
    seq = "".join(rr.pick().name for _ in range(90))  # type: ignore[union-attr]
    for k in range(0, 90, 9):
        assert Counter(seq[k : k + 9]) == {"a": 5, "b": 3, "c": 1}, seq[k : k + 9]
    assert "aaa" not in seq and "bb" not in seq  # interleaved, not blocks


def test_roundrobin_skips_saturated_servers_and_zero_weights() -> None:
    ss = servers(1, 1, 0, maxconn=1)
    rr = Fwrr(ss)
    a = rr.pick()
    assert a is not None and a.name == "a"
    a.served = 1  # a is at its maxconn
    picks = [rr.pick() for _ in range(3)]
    assert [p.name for p in picks if p is not None] == ["b", "b", "b"]
    ss[1].served = 1
    assert rr.pick() is None  # everyone saturated: the request queues


def test_leastconn_ties_go_in_tree_order_and_weights_scale_the_load() -> None:
    ss = servers(1, 1, 1)
    lc = Fwlc(ss)
    order = []
    for _ in range(3):
        s = lc.pick()
        assert s is not None
        s.served += 1
        lc.reposition(s)
        order.append(s.name)
    assert order == ["a", "b", "c"]  # idle ones first, then the least recently moved
    ss[1].served -= 1
    lc.reposition(ss[1])
    assert lc.pick() is ss[1]
    # weights 2:1 — key (n + 1) x 4096 / (16 w): a with 2 in flight ties b with 1... a goes
    # first when its key is lower: (2+1)*4096//32 = 384 < (1+1)*4096//16 = 512.
    w = servers(2, 1)
    lcw = Fwlc(w)
    w[0].served, w[1].served = 2, 1
    lcw.reposition(w[0])
    lcw.reposition(w[1])
    assert lcw.pick() is w[0]


def test_hash_balance_factor_caps_a_hot_key() -> None:
    # The field note: one hot key, 24 requests held, three servers:
    # hash-balance-factor 150 spreads 12/12/0; no factor sends all 24 to one.
    for factor, expected in ((150, [0, 12, 12]), (0, [0, 0, 24])):
        ss = servers(1, 1, 1)
        ring = Ring(ss, factor)
        for served in range(24):
            s = ring.lookup(sdbm(b"the same system prompt"), served)
            assert s is not None
            s.served += 1
        assert sorted(x.served for x in ss) == expected


def test_random_draws_keep_the_least_loaded() -> None:
    ss = servers(1, 1)
    ring = Ring(ss)
    ss[0].served = 5
    picks = Counter(ring.random_pick(5).name for _ in range(200))  # type: ignore[union-attr]
    assert picks["b"] >= 190  # only five draws all on a keep a
    one = Counter(ring.random_pick(1).name for _ in range(400))  # type: ignore[union-attr]
    assert 150 < one["a"] < 250  # one draw: weight only


def test_maxconn_queue_then_dequeue_oldest_and_timeout_refusal() -> None:
    be = Backend("b", {s.name: s for s in servers(1, 1, maxconn=1)}, BackendSettings("roundrobin"))
    r = [Req(i) for i in range(4)]
    assert be.assign(r[0]) == Send("a")
    assert be.assign(r[1]) == Send("b")
    assert be.assign(r[2]) == Queue(60.0)
    assert be.assign(r[3]) == Queue(60.0)
    assert be.release("b") == [(r[2], "b")]  # the oldest queued, on the freed server
    assert be.cancel(r[3]) and not be.cancel(r[3])
    assert be.release("a") == []


def test_every_weight_zero_is_a_503() -> None:
    be = Backend("b", {s.name: s for s in servers(0, 0)}, BackendSettings("leastconn"))
    d = be.assign(Req(0))
    assert isinstance(d, Refuse) and d.status == 503


# -- the whole model in the twin ------------------------------------------------------


def test_queue_timeout_answers_503_at_the_right_virtual_time(tmp_path: Path) -> None:
    # One replica, maxconn 1, 400-token answers at time scale 0.1 (~10 s each): the
    # second and third users queue and get a 503 exactly queue_timeout_s after sending.
    sc = scenario_file(tmp_path, output_tokens={"type": "fixed", "value": 400})
    p = plan(sc)
    reps = [TwinReplica("h100-0", "h100-80g", (M8,))]
    params: dict[str, int | str] = {"algorithm": "roundrobin", "maxconn.h100-0": 1}
    params["queue_timeout_s"] = 2
    opts = TwinOptions(time_scale=0.1)
    run = simulate(p, reps, routing_model(params, reps), opts)
    refused = [r for r in run.records if r.status_code == 503]
    assert len(refused) >= 2
    for r in refused:
        assert r.ended_at == pytest.approx(r.sent_at + 2.0 + opts.to_client_s)
        assert r.replica is None and r.outcome == "http_error"


def test_model_affinity_and_long_request_routing() -> None:
    reps = cluster_replicas("hetero4")
    model = routing_model({"long_request_bytes": 1000}, reps)
    view = ClusterView({})
    seen70 = {model.route(Req(i, M70), 0.0, view) for i in range(8)}
    assert seen70 == {Send("h100-0"), Send("h100-1")}
    long_body = b"{" + b"x" * 2000 + b"}"
    seen_long = {model.route(Req(100 + i, body=long_body), 0.0, view) for i in range(12)}
    assert seen_long == {Send("h100-0"), Send("h100-1"), Send("a100-0")}  # never the L4
    short = {model.route(Req(200 + i), 0.0, view) for i in range(12)}
    assert Send("l4-0") in short
    d = model.route(Req(300, "no-such-model"), 0.0, view)
    assert isinstance(d, Refuse) and d.status == 404


def test_per_backend_servers_count_their_own_requests() -> None:
    # h100-0 in the 70B backend does not see the 8B backend's requests (leastconn).
    reps = cluster_replicas("mini2")
    model = routing_model({"algorithm": "leastconn"}, reps)
    view = ClusterView({})
    assert model.route(Req(0, M8), 0.0, view) == Send("h100-0")
    assert model.route(Req(1, M8), 0.0, view) == Send("l4-0")
    assert model.route(Req(2, M70), 0.0, view) == Send("h100-0")


@dataclass
class Rep:
    """A replica as the scheduler's scrape sees it."""

    name: str
    num_waiting: int = 0
    kv_usage: float = 0.0
    ttft_sum_s: float = 0.0
    ttft_count: int = 0
    num_running: int = 0
    gpu: str = "h100-80g"
    models: tuple[str, ...] = (M8,)
    kv_capacity_bytes: int = 0
    in_flight: int = 0
    itl_sum_s: float = 0.0
    itl_count: int = 0
    prompt_tokens_total: int = 0
    queue_sum_s: float = 0.0


def _llm(**knobs: float | str) -> tuple[HaproxyModel, ClusterView, dict[str, Rep]]:
    reps = [TwinReplica("h100-0", "h100-80g", (M8,)), TwinReplica("h100-1", "h100-80g", (M8,))]
    params: dict[str, float | str] = {"algorithm": "llm"}
    params.update({f"llm.{k}": v for k, v in knobs.items()})
    model = routing_model(params, reps)
    state = {r.name: Rep(r.name) for r in reps}
    return model, ClusterView(state), state


def test_llm_prefers_the_replica_holding_the_prefix_and_the_emptier_queue() -> None:
    model, view, state = _llm(w_load=0.0, w_ttft=0.0, w_kv=0.0)
    model.tick(0.0, view)
    prompt = b'{"model":"m","max_tokens":8,"messages":[{"role":"system","content":"' + b"s" * 3000
    first = model.route(Req(0, body=prompt + b'"}]}'), 0.0, view)
    assert isinstance(first, Send)
    model.on_headers(Req(0), first.replica, 0.0)
    again = model.route(Req(1, body=prompt + b'more"}]}'), 0.01, view)
    assert again == first  # the prefix's blocks are remembered there
    other = "h100-1" if first.replica == "h100-0" else "h100-0"
    state[first.replica].num_waiting = 16  # its queue full (queue score 0), the other idle
    model.tick(0.02, view)
    assert model.route(Req(2, body=b'{"messages":[{"content":"new"}]}'), 0.03, view) == Send(other)


def test_llm_admission_reject_and_hold() -> None:
    model, view, state = _llm(admission="reject")
    for s in state.values():
        s.kv_usage = 0.99  # no room anywhere (headroom 5 %)
    model.tick(0.0, view)
    d = model.route(Req(0), 0.0, view)
    assert isinstance(d, Refuse) and d.status == 429
    held, view2, state2 = _llm(admission="hold", queue_timeout_ms=1000, refresh_ms=250)
    for s in state2.values():
        s.kv_usage = 0.99
    held.tick(0.0, view2)
    assert held.route(Req(1), 0.0, view2) == Retry(0.125)
    late = held.route(Req(1), 1.0, view2)
    assert isinstance(late, Refuse) and late.status == 429


def test_llm_scrape_round_lasts_as_long_as_the_fitted_replicas_answer() -> None:
    """A replica fitted kept busy (``scrape_s``) makes the scheduler's scrape round that
    much longer; the others take the default's time."""
    fit = ReplicaFit(
        name="h100-0", model=M8, url="http://127.0.0.1:9",
        prefill_tokens_per_s=Measured(value=10_000.0, rel_uncertainty=0),
        step_s=Measured(value=0.02, rel_uncertainty=0),
        step_per_seq_s=Measured(value=0.001, rel_uncertainty=0),
        overhead_s=Measured(value=0.005, rel_uncertainty=0),
        scrape_s=Measured(value=0.04, rel_uncertainty=0),
    )  # fmt: skip
    plain = [TwinReplica("h100-0", "h100-80g", (M8,)), TwinReplica("h100-1", "h100-80g", (M8,))]
    slow = [dataclasses.replace(plain[0], fit=fit), plain[1]]
    periods = []
    for reps in (plain, slow):
        llm = routing_model({"algorithm": "llm", "llm.refresh_ms": 100}, reps).llm
        assert llm is not None
        periods.append(llm.period_s())
    assert periods[0] == pytest.approx(0.1 + 2 * SCRAPE_S)
    assert periods[1] == pytest.approx(0.1 + 0.04 + SCRAPE_S)


def test_llm_defaults_are_the_luas_and_the_spaces() -> None:
    lua = lua_defaults()
    space = ParameterSpace.load(SPACE, ["x"])
    for name, spec in space.params.items():
        if name.startswith("llm."):
            key = name.removeprefix("llm.")
            expected = spec.baseline if isinstance(spec.baseline, str) else float(spec.baseline)
            assert lua[key] == expected, name
    assert lua["bytes_per_token"] == 4 and lua["max_blocks"] == 16


def test_every_haproxy_knob_is_modeled_but_the_agents() -> None:
    reps = cluster_replicas("hetero4")
    space = ParameterSpace.load(SPACE, [r.name for r in reps])
    model = routing_model(space.baseline(), reps)
    assert model.unmodeled and all(k.startswith("agent.") for k in model.unmodeled)
