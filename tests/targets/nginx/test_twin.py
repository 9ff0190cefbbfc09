"""nginx's routing model in the twin, against nginx's documented picks."""

from __future__ import annotations

from collections import Counter

from lbtune.targets.nginx.twin import routing_model
from lbtune.twin.replica import TwinReplica
from lbtune.twin.routing import ClusterView, Refuse, Send
from tests.twin.helpers import M8, M70, Req, chat_body

VIEW = ClusterView({})
ABC = [TwinReplica(n, "h100-80g", (M8,)) for n in "abc"]


def picks(model: object, n: int, start: int = 0) -> str:
    out = []
    for i in range(start, start + n):
        d = model.route(Req(i), 0.0, VIEW)  # type: ignore[attr-defined]
        assert isinstance(d, Send)
        out.append(d.replica)
        model.on_end(Req(i), d.replica, 0.0)  # type: ignore[attr-defined]
    return "".join(out)


def test_smooth_weighted_round_robin_is_nginxs_5_1_1_sequence() -> None:
    # ngx_http_upstream_round_robin.c: weights { 5, 1, 1 } give { a, a, b, a, c, a, a }.
    m = routing_model({"weight.a": 5, "weight.b": 1, "weight.c": 1}, ABC)
    assert picks(m, 14) == "aabacaa" * 2


def test_least_conn_prefers_fewer_and_shares_ties_by_weight() -> None:
    m = routing_model({"algorithm": "least_conn"}, ABC)
    held = [m.route(Req(i), 0.0, VIEW) for i in range(3)]
    assert held == [Send("a"), Send("b"), Send("c")]
    m.on_end(Req(1), "b", 0.0)
    assert m.route(Req(9), 0.0, VIEW) == Send("b")


def test_max_conns_everywhere_is_a_502_and_weight_0_is_down() -> None:
    m = routing_model({"max_conns.a": 1, "max_conns.b": 1, "weight.c": 0}, ABC)
    assert {m.route(Req(i), 0.0, VIEW) for i in range(2)} == {Send("a"), Send("b")}
    d = m.route(Req(3), 0.0, VIEW)
    assert isinstance(d, Refuse) and d.status == 502


def test_hash_keeps_a_key_on_one_server_and_skips_a_full_one() -> None:
    m = routing_model({"algorithm": "hash", "hash_bytes": 64}, ABC)
    body = chat_body("the same system prompt " * 4)
    first = m.route(Req(0, body=body), 0.0, VIEW)
    assert all(m.route(Req(i, body=body), 0.0, VIEW) == first for i in range(1, 6))
    full = routing_model(
        {"algorithm": "hash", "max_conns.a": 1, "max_conns.b": 1, "max_conns.c": 1}, ABC
    )
    got = Counter(full.route(Req(i, body=body), 0.0, VIEW) for i in range(3))
    assert len(got) == 3  # each server once: the key moved on past the full ones


def test_random_two_takes_the_less_loaded() -> None:
    m = routing_model({"algorithm": "random_two_least_conn"}, ABC[:2])
    for i in range(5):
        assert m.route(Req(i), 0.0, VIEW) in (Send("a"), Send("b"))
    loads = Counter(m.route(Req(10 + i), 0.0, VIEW) for i in range(10))
    assert abs(loads[Send("a")] - loads[Send("b")]) <= 2


def test_model_affinity_and_unmodeled_knobs() -> None:
    reps = [TwinReplica("h", "h100-80g", (M8, M70)), TwinReplica("l", "l4-24g", (M8,))]
    m = routing_model({"max_fails": 1, "keepalive": 32, "algorithm": "round_robin"}, reps)
    assert {m.route(Req(i, M70), 0.0, VIEW) for i in range(4)} == {Send("h")}
    assert isinstance(m.route(Req(9, "other"), 0.0, VIEW), Refuse)
    assert m.unmodeled == ("keepalive", "max_fails")
