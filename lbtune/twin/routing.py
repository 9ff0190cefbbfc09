"""The contract between the twin and a balancer's routing model.

The twin (:mod:`lbtune.twin.run`) owns the clock, the requests and the replicas; a
balancer's routing model owns its own state (counters, queues, rings, scores) and is
asked, in virtual time:

* :meth:`RoutingModel.route` once per request as it reaches the balancer: the answer is a
  :class:`Send` (forward to a replica now), a :class:`Queue` (the model keeps it until a
  slot frees, at most ``timeout_s``, then the balancer answers 503), a :class:`Refuse`
  (the balancer answers itself, e.g. 429 or 503) or a :class:`Retry` (ask again later:
  a scheduler that holds a request);
* :meth:`RoutingModel.on_headers` when a replica's response headers pass the balancer
  (a streamed response starts; HAProxy's ``http-response`` rules run here);
* :meth:`RoutingModel.on_end` when a request forwarded to a replica ends (completed,
  refused by the replica, timed out or cut off): the model frees its slot and returns the
  queued requests that may now go, each with its replica;
* :meth:`RoutingModel.cancel` when a queued request gives up (the client's timeout, the
  end of the run);
* :meth:`RoutingModel.tick` at the times :meth:`RoutingModel.next_tick` asks for
  (a scheduler scraping its replicas' metrics every ``refresh_ms``).

A model sees the replicas through :class:`ReplicaView` (read-only: the engine's queue, KV
usage and the server-side TTFT counters a ``/metrics`` scrape would show) and a request
through :class:`RequestView` (what a balancer can read of it: model, body bytes, prompt).

Each balancer's model lives in that balancer's target subpackage
(``lbtune/targets/<name>/twin.py``) as ``routing_model(params, replicas, seed=0)``;
the knobs it does not model are listed in :attr:`RoutingModel.unmodeled`, so the twin can
say so instead of ignoring them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from lbtune.twin.replica import TwinReplica

Knobs = Mapping[str, int | float | str | bool]
"""A balancer's parameter values (a target's ``ParamSet``, read only)."""

__all__ = [
    "ClusterView",
    "Decision",
    "Knobs",
    "Queue",
    "Refuse",
    "ReplicaView",
    "RequestView",
    "Retry",
    "RoutingFactory",
    "RoutingModel",
    "Send",
]


@dataclass(frozen=True, slots=True)
class Send:
    """Forward the request to ``replica`` now."""

    replica: str


@dataclass(frozen=True, slots=True)
class Queue:
    """The model keeps the request in its queue; it hands it out from :meth:`RoutingModel.
    on_end`. Not handed out after ``timeout_s`` (``None``: never), the balancer answers 503."""

    timeout_s: float | None


@dataclass(frozen=True, slots=True)
class Refuse:
    """The balancer answers the request itself with ``status`` (no replica sees it)."""

    status: int
    message: str


@dataclass(frozen=True, slots=True)
class Retry:
    """Ask :meth:`RoutingModel.route` again for this request ``after_s`` seconds later."""

    after_s: float


Decision = Send | Queue | Refuse | Retry


class RequestView(Protocol):
    """What a balancer can read of a request."""

    @property
    def index(self) -> int:
        """The request's position in the scenario's sequence (unique in a run)."""

    @property
    def model(self) -> str: ...

    @property
    def api(self) -> str:
        """``chat`` or ``completions``."""

    @property
    def stream(self) -> bool: ...

    @property
    def body(self) -> bytes:
        """The JSON body exactly as the load generator sends it."""

    @property
    def prompt_text(self) -> str:
        """The first chat message's content, or the completion's prompt."""

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens as the replica counts them (chat template included)."""

    @property
    def prompt_ids(self) -> Sequence[int]:
        """The prompt's token ids as the replica renders them (what a router gets from a
        worker's ``/tokenize``); empty when the replica would refuse the request."""

    @property
    def session_id(self) -> str | None:
        """An ``x-session-id`` header, if the client sends one (lbtune's does not)."""


class ReplicaView(Protocol):
    """A replica as a balancer may observe it (its ``/metrics`` and its load)."""

    @property
    def name(self) -> str: ...

    @property
    def gpu(self) -> str: ...

    @property
    def models(self) -> tuple[str, ...]: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def kv_usage(self) -> float:
        """``vllm:kv_cache_usage_perc`` (0..1)."""

    @property
    def kv_capacity_bytes(self) -> int: ...

    @property
    def in_flight(self) -> int:
        """Requests that reached the replica and have not ended."""

    @property
    def ttft_sum_s(self) -> float:
        """``vllm:time_to_first_token_seconds_sum`` (arrival at the replica to first token)."""

    @property
    def ttft_count(self) -> int: ...

    @property
    def itl_sum_s(self) -> float:
        """``vllm:inter_token_latency_seconds_sum``."""

    @property
    def itl_count(self) -> int: ...

    @property
    def prompt_tokens_total(self) -> int:
        """``vllm:prompt_tokens_total`` (counted at a request's first token)."""

    @property
    def queue_sum_s(self) -> float:
        """``vllm:request_queue_time_seconds_sum`` (admission to first scheduling)."""


@dataclass(frozen=True)
class ClusterView:
    """Every replica, by name, in the cluster's order."""

    replicas: Mapping[str, ReplicaView]
    time_scale: float = 1.0
    """The simulated replicas run this many times faster than real time (what a
    balancer that knows the GPUs' rates divides them by)."""


class RoutingModel(ABC):
    """A balancer's routing, in virtual time (see the module docstring).

    Subclasses implement :meth:`route`; the hooks default to a balancer without queues or
    timers."""

    unmodeled: tuple[str, ...] = ()
    """Knobs set in the params this model does not reproduce (named in every result)."""

    @abstractmethod
    def route(self, req: RequestView, now: float, cluster: ClusterView) -> Decision:
        """Where ``req`` goes (see :data:`Decision`)."""

    def on_headers(self, req: RequestView, replica: str, now: float) -> None:
        """A response of ``replica`` to ``req`` starts passing the balancer."""
        del req, replica, now

    def on_end(
        self, req: RequestView, replica: str, now: float
    ) -> Sequence[tuple[RequestView, str]]:
        """``req`` forwarded to ``replica`` ended; the queued requests that go now."""
        del req, replica, now
        return ()

    def cancel(self, req: RequestView, now: float) -> bool:
        """Drop ``req`` from the model's queue; whether it was queued."""
        del req, now
        return False

    def next_tick(self) -> float | None:
        """When :meth:`tick` wants to run next (virtual seconds), ``None`` for never."""
        return None

    def tick(self, now: float, cluster: ClusterView) -> None:
        """A timer of the model (e.g. a metrics scrape)."""
        del now, cluster


class RoutingFactory(Protocol):
    """``routing_model`` of a target's twin module: the model of ``params`` (a full
    parameter set of that target) over ``replicas``; ``seed`` seeds its random draws."""

    def __call__(
        self, params: Knobs, replicas: Sequence[TwinReplica], seed: int = 0
    ) -> RoutingModel: ...
