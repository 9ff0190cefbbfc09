"""Envoy's routing model in the twin, against hand-made cases."""

from __future__ import annotations

from collections import Counter

from lbtune.targets.envoy.twin import routing_model
from lbtune.twin.replica import TwinReplica
from lbtune.twin.routing import ClusterView, Queue, Refuse, Send
from tests.twin.helpers import M8, Req, chat_body

VIEW = ClusterView({})
ABC = [TwinReplica(n, "h100-80g", (M8,)) for n in "abc"]


def test_round_robin_rotates_and_weights_follow_an_edf_schedule() -> None:
    m = routing_model({}, ABC)
    seq = [m.route(Req(i), 0.0, VIEW) for i in range(6)]
    assert seq == [Send(x) for x in "abcabc"]
    w = routing_model({"weight.a": 200, "weight.b": 100, "weight.c": 100}, ABC)
    got = Counter(w.route(Req(i), 0.0, VIEW) for i in range(400))
    assert got[Send("a")] == 200 and got[Send("b")] == got[Send("c")] == 100


def test_least_request_and_draining_weight_zero() -> None:
    m = routing_model({"lb_policy": "LEAST_REQUEST", "choice_count": 8, "weight.c": 0}, ABC)
    first = m.route(Req(0), 0.0, VIEW)
    assert first in (Send("a"), Send("b"))
    second = m.route(Req(1), 0.0, VIEW)
    assert second != first and second != Send("c")  # 8 draws: the idle one, never c


def test_ring_hash_keeps_a_key_and_bounded_load_spills() -> None:
    body = chat_body("a shared prefix " * 8)
    m = routing_model({"lb_policy": "RING_HASH", "hash_balance_factor": 0}, ABC)
    assert len({m.route(Req(i, body=body), 0.0, VIEW) for i in range(12)}) == 1
    b = routing_model({"lb_policy": "RING_HASH", "hash_balance_factor": 150}, ABC)
    held = Counter(b.route(Req(i, body=body), 0.0, VIEW) for i in range(12))
    assert len(held) >= 2 and max(held.values()) <= 6


def test_circuit_breakers_overflow_and_pending_per_host() -> None:
    m = routing_model({"max_requests": 2}, ABC)
    m.route(Req(0), 0.0, VIEW)
    m.route(Req(1), 0.0, VIEW)
    d = m.route(Req(2), 0.0, VIEW)
    assert isinstance(d, Refuse) and d.status == 503
    one = [ABC[0]]
    p = routing_model({"max_connections_per_host": 1}, one)
    assert p.route(Req(0), 0.0, VIEW) == Send("a")
    assert p.route(Req(1), 0.0, VIEW) == Queue(None)
    assert list(p.on_end(Req(0), "a", 1.0)) == [(Req(1), "a")]


def test_unmodeled_knobs_are_named() -> None:
    m = routing_model({"retries": 2, "outlier_detection": True, "lb_policy": "RANDOM"}, ABC)
    assert m.unmodeled == ("outlier_detection", "retries")
