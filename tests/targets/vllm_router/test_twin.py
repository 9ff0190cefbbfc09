"""vllm-router's routing model in the twin, against hand-made cases."""

from __future__ import annotations

from dataclasses import dataclass

from lbtune.targets.vllm_router.twin import routing_model
from lbtune.twin.replica import TwinReplica
from lbtune.twin.routing import ClusterView, Send
from tests.twin.helpers import M8, Req

AB = [TwinReplica(n, "h100-80g", (M8,)) for n in "ab"]


@dataclass
class Load:
    name: str
    num_running: int = 0
    num_waiting: int = 0


def test_round_robin() -> None:
    m = routing_model({"policy": "round_robin"}, AB)
    view = ClusterView({})
    assert [m.route(Req(i), 0.0, view) for i in range(4)] == [Send(x) for x in "abab"]


def test_cache_aware_follows_the_prefix_until_the_load_is_imbalanced() -> None:
    m = routing_model({"policy": "cache_aware", "balance_abs_threshold": 2}, AB)
    view = ClusterView({})
    shared = tuple(range(320))
    first = m.route(Req(0, prompt_ids=(*shared, 1)), 0.0, view)
    assert isinstance(first, Send)
    # the prefix is held there: the same worker while the load stays balanced
    assert m.route(Req(1, prompt_ids=(*shared, 2)), 0.0, view) == first
    assert m.route(Req(2, prompt_ids=(*shared, 3)), 0.0, view) == first
    # three in flight there, none on the other: imbalanced (3 - 0 > 2): the idle one
    other = "b" if first.replica == "a" else "a"
    assert m.route(Req(3, prompt_ids=(*shared[:160], 4)), 0.0, view) == Send(other)
    # a new prefix, balanced load: the smaller tree (10 blocks there, 20 on the first)
    m.on_end(Req(0), first.replica, 0.0)
    m.on_end(Req(1), first.replica, 0.0)
    fresh = m.route(Req(4, prompt_ids=tuple(range(1000, 1100))), 0.0, view)
    assert fresh == Send(other)


def test_power_of_two_reads_the_polled_load() -> None:
    m = routing_model({"policy": "power_of_two"}, AB)
    view = ClusterView({"a": Load("a", 5, 3), "b": Load("b", 1, 0)})  # type: ignore[dict-item]
    assert m.next_tick() == 0.0
    m.tick(0.0, view)
    assert all(m.route(Req(i), 0.1, view) == Send("b") for i in range(5))
