"""Envoy's routing in the virtual-time twin (:mod:`lbtune.twin`): ``routing_model``.

As :mod:`lbtune.targets.envoy.config` renders it (``--concurrency 1``: one load balancer):
the body's model picks the model's cluster (404 when no replica serves it); endpoints have
``load_balancing_weight = max(w, 1)``, weight 0 draining (no new requests). The policies,
as Envoy documents them:

* ``ROUND_ROBIN`` — plain rotation with equal weights, else an earliest-deadline-first
  schedule (each pick advances the host's deadline by ``1 / weight``);
* ``LEAST_REQUEST`` — equal weights: ``choice_count`` random hosts, the fewest active
  requests (the first drawn on ties); unequal weights: the EDF schedule over
  ``weight / (active + 1) ^ active_request_bias``;
* ``RANDOM`` — uniform, weights ignored;
* ``RING_HASH`` / ``MAGLEV`` — a consistent hash of the request's key (the first
  ``hash_bytes`` of the first ``"prompt"`` or ``"content"``, non-word characters made
  ``_``, as the config's Lua filter writes ``x-lbtune-prefix``; ``hash_key: session`` falls
  back to it, lbtune's client sending no ``x-session-id``) on a ring of at least 1024
  points spread by weight; with ``hash_balance_factor`` a host already above
  ``factor/100`` of its weighted share of the active requests passes the key on to the
  next host of the ring. Maglev's table is modeled by the same ring: the same spread, not
  the same key-to-host map (nor is the ring's: Envoy hashes host addresses with xxHash).

Circuit breakers: above ``max_requests`` active requests in a cluster a request gets a
503 (overflow); with ``max_connections_per_host`` a host at its limit keeps new requests
pending on its own connection pool (at most ``max_pending_requests`` in the cluster, else
503) until a request of it ends.

Not modeled (named in :attr:`EnvoyModel.unmodeled`): ``outlier_detection`` and its
``outlier_*`` knobs, ``retries`` and ``max_retries`` (the twin's replicas do not fail) and
``slow_start_s`` (it ramps hosts that join; the twin's hosts are there from the start).
"""

from __future__ import annotations

import bisect
import hashlib
import random
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from lbtune.twin.replica import TwinReplica
from lbtune.twin.routing import (
    ClusterView,
    Decision,
    Knobs,
    Queue,
    Refuse,
    RequestView,
    RoutingModel,
    Send,
)

__all__ = ["UNMODELED_PREFIXES", "EnvoyModel", "routing_model"]

UNMODELED_PREFIXES = ("outlier_", "retries", "max_retries", "slow_start_s")
MIN_RING = 1024
_MODELED = {
    "lb_policy",
    "choice_count",
    "active_request_bias",
    "hash_key",
    "hash_bytes",
    "hash_balance_factor",
    "max_requests",
    "max_pending_requests",
    "max_connections_per_host",
}


def _h64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


@dataclass(eq=False)
class Host:
    name: str
    weight: int
    draining: bool = False
    active: int = 0
    deadline: float = 0.0
    pending: deque[RequestView] = field(default_factory=deque)


class Cluster:
    """One model's cluster: its hosts, policy and circuit breakers."""

    def __init__(self, hosts: list[Host], params: Knobs, rng: random.Random) -> None:
        self.hosts = hosts
        self.live = [h for h in hosts if not h.draining]
        self.policy = str(params.get("lb_policy", "ROUND_ROBIN"))
        self.choice_count = int(params.get("choice_count", 2))
        self.bias = float(params.get("active_request_bias", 1.0))
        self.hash_bytes = int(params.get("hash_bytes", 256))
        self.factor = int(params.get("hash_balance_factor", 150))
        self.max_requests = int(params.get("max_requests", 1024))
        self.max_pending = int(params.get("max_pending_requests", 1024))
        self.per_host = int(params.get("max_connections_per_host", 0))
        self.rng = rng
        self.rr = 0
        self.equal = len({h.weight for h in self.live}) <= 1
        for h in self.live:
            h.deadline = 1.0 / h.weight
        self.active = 0
        self.pending = 0
        total = sum(h.weight for h in self.live) or 1
        points: list[tuple[int, Host]] = []
        for h in self.live:
            n = max(1, -(-MIN_RING * h.weight // total))
            points += [(_h64(f"{h.name}_{i}".encode()), h) for i in range(n)]
        points.sort(key=lambda p: p[0])
        self.keys = [p[0] for p in points]
        self.owners = [p[1] for p in points]

    def pick(self, req: RequestView) -> Host | None:
        if not self.live:
            return None
        if self.policy in ("RING_HASH", "MAGLEV"):
            return self._hash(req)
        if self.policy == "RANDOM":
            return self.live[self.rng.randrange(len(self.live))]
        if self.policy == "LEAST_REQUEST" and self.equal:
            best: Host | None = None
            for _ in range(self.choice_count):
                h = self.live[self.rng.randrange(len(self.live))]
                if best is None or h.active < best.active:
                    best = h
            return best
        if self.equal:
            h = self.live[self.rr % len(self.live)]
            self.rr += 1
            return h
        return self._edf()

    def _edf(self) -> Host:
        h = min(self.live, key=lambda x: x.deadline)
        w = float(h.weight)
        if self.policy == "LEAST_REQUEST":
            w = h.weight / (h.active + 1) ** self.bias
        h.deadline += 1.0 / max(w, 1e-9)
        return h

    def _key(self, req: RequestView) -> bytes:
        m = None
        if req.api == "completions":
            m = re.search(rb'"prompt"\s*:\s*"(.*?)"', req.body, re.S)
        if m is None:
            m = re.search(rb'"content"\s*:\s*"(.*?)"', req.body, re.S)
        if m is None:
            return b""
        return re.sub(rb"[^0-9A-Za-z]", b"_", m.group(1)[: self.hash_bytes])

    def _hash(self, req: RequestView) -> Host:
        n = len(self.keys)
        i = bisect.bisect_left(self.keys, _h64(self._key(req))) % n
        if not self.factor:
            return self.owners[i]
        total_w = sum(h.weight for h in self.live)
        for k in range(n):
            h = self.owners[(i + k) % n]
            cap = -(-(self.active + 1) * self.factor * h.weight // (100 * total_w))
            if h.active < max(1, cap):
                return h
        return self.owners[i]


class EnvoyModel(RoutingModel):
    """Envoy with the knobs of one parameter set, over one cluster's replicas."""

    def __init__(self, params: Knobs, replicas: Sequence[TwinReplica], seed: int = 0) -> None:
        self.unmodeled = tuple(
            sorted(
                k
                for k in params
                if k.startswith(UNMODELED_PREFIXES)
                or (k not in _MODELED and not k.startswith("weight."))
            )
        )
        rng = random.Random(seed)
        self.clusters: dict[str, Cluster] = {}
        for model in sorted({m for r in replicas for m in r.models}):
            hosts = []
            for r in replicas:
                if model in r.models:
                    w = int(params.get(f"weight.{r.name}", 100))
                    hosts.append(Host(r.name, max(w, 1), draining=w == 0))
            self.clusters[model] = Cluster(hosts, params, rng)
        self.assigned: dict[int, tuple[Cluster, Host]] = {}

    def route(self, req: RequestView, now: float, cluster: ClusterView) -> Decision:
        c = self.clusters.get(req.model)
        if c is None:
            return Refuse(404, "route not found: the model is not served by this cluster")
        if c.active >= c.max_requests:
            return Refuse(503, "upstream overflow (max_requests)")
        host = c.pick(req)
        if host is None:
            return Refuse(503, "no healthy upstream")
        c.active += 1
        host.active += 1
        self.assigned[req.index] = (c, host)
        if c.per_host and host.active - len(host.pending) > c.per_host:
            if c.pending >= c.max_pending:
                c.active -= 1
                host.active -= 1
                del self.assigned[req.index]
                return Refuse(503, "upstream overflow (max_pending_requests)")
            host.pending.append(req)
            c.pending += 1
            return Queue(None)
        return Send(host.name)

    def on_end(
        self, req: RequestView, replica: str, now: float
    ) -> Sequence[tuple[RequestView, str]]:
        got = self.assigned.pop(req.index, None)
        if got is None:
            return ()
        c, host = got
        c.active -= 1
        host.active -= 1
        if host.pending:
            nxt = host.pending.popleft()
            c.pending -= 1
            return [(nxt, host.name)]
        return ()

    def cancel(self, req: RequestView, now: float) -> bool:
        got = self.assigned.pop(req.index, None)
        if got is None:
            return False
        c, host = got
        if req in host.pending:
            host.pending.remove(req)
            c.pending -= 1
            c.active -= 1
            host.active -= 1
            return True
        return False


def routing_model(params: Knobs, replicas: Sequence[TwinReplica], seed: int = 0) -> EnvoyModel:
    """The Envoy model of ``params`` (a full Envoy parameter set) over ``replicas``."""
    return EnvoyModel(params, replicas, seed)
