"""nginx's routing in the virtual-time twin (:mod:`lbtune.twin`): ``routing_model``.

As ``nginx.conf.j2`` renders it (one worker process): the body's model picks the model's
upstream (404 when no replica serves it); each upstream lists its replicas with
``weight=max(w, 1)`` (``down`` at weight 0) and ``max_conns``; open-source nginx has no
queue: when every server is down or at ``max_conns`` the request gets a 502. The
methods follow nginx's sources (``ngx_http_upstream_round_robin.c``, ``_least_conn``,
``_random``, ``_hash``):

* ``round_robin`` — smooth weighted round robin: each pick adds every available peer's
  weight to its ``current_weight``, takes the highest (the first on ties) and subtracts the
  total from it;
* ``least_conn`` — the fewest ``conns / weight``; several equal ones share by the same
  smooth round robin;
* ``random_two_least_conn`` — two weighted random draws (distinct, available), the one with
  fewer ``conns / weight`` (the second on ties);
* ``hash`` — ketama over ``weight x 160`` points per server (CRC32 chained as nginx does,
  over the server's name: the live points hash ``host:port``, which changes with every
  ``ports: auto`` cluster, so only the distribution is the same), the key being the first
  ``hash_bytes`` characters of the first ``"content"`` or ``"prompt"`` of the body as the
  config's regex reads them; an unavailable server moves the key to the next point, 20
  times, then round robin.

Not modeled (named in :attr:`NginxModel.unmodeled`): ``max_fails``, ``fail_timeout_s``,
``retry_on_overload``, ``next_upstream_tries``, ``next_upstream_timeout_s`` (the twin's
replicas do not fail, so failure accounting and retries never act) and ``keepalive``
(upstream connection reuse: no effect on where a request goes).
"""

from __future__ import annotations

import bisect
import random
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from lbtune.twin.replica import TwinReplica
from lbtune.twin.routing import (
    ClusterView,
    Decision,
    Knobs,
    Refuse,
    RequestView,
    RoutingModel,
    Send,
)

__all__ = ["UNMODELED", "NginxModel", "routing_model"]

UNMODELED = (
    "fail_timeout_s",
    "keepalive",
    "max_fails",
    "next_upstream_timeout_s",
    "next_upstream_tries",
    "retry_on_overload",
)
_TRIES = 20


@dataclass(eq=False)
class Peer:
    name: str
    weight: int
    max_conns: int = 0
    down: bool = False
    conns: int = 0
    current_weight: int = 0

    @property
    def available(self) -> bool:
        return not self.down and not (self.max_conns and self.conns >= self.max_conns)


class Upstream:
    """One upstream block and its method."""

    def __init__(self, peers: list[Peer], method: str, hash_bytes: int, rng: random.Random):
        self.peers = peers
        self.method = method
        self.hash_bytes = hash_bytes
        self.rng = rng
        self._key_re = re.compile(
            rb'"(?:content|prompt)"\s*:\s*"((?:[^"\\]|\\.){0,%d})' % hash_bytes
        )
        points: list[tuple[int, Peer]] = []
        for p in peers:
            base = p.name.encode() + b"\0"
            prev = 0
            for _ in range(p.weight * 160):
                h = zlib.crc32(base + prev.to_bytes(4, "little"))
                points.append((h, p))
                prev = h
        points.sort(key=lambda x: x[0])
        self.point_hashes = [h for h, _ in points]
        self.point_peers = [p for _, p in points]

    def pick(self, req: RequestView) -> Peer | None:
        if self.method == "least_conn":
            return self._least_conn()
        if self.method == "random_two_least_conn":
            return self._random_two()
        if self.method == "hash":
            return self._hash(req)
        return self._smooth(self.peers)

    @staticmethod
    def _smooth(peers: Sequence[Peer]) -> Peer | None:
        best: Peer | None = None
        total = 0
        for p in peers:
            if not p.available:
                continue
            p.current_weight += p.weight
            total += p.weight
            if best is None or p.current_weight > best.current_weight:
                best = p
        if best is not None:
            best.current_weight -= total
        return best

    def _least_conn(self) -> Peer | None:
        best: Peer | None = None
        many = False
        for p in self.peers:
            if not p.available:
                continue
            if best is None or p.conns * best.weight < best.conns * p.weight:
                best, many = p, False
            elif p.conns * best.weight == best.conns * p.weight:
                many = True
        if best is None or not many:
            return best
        first = best
        ties = [
            p
            for p in self.peers[self.peers.index(first) :]
            if p.available and p.conns * first.weight == first.conns * p.weight
        ]
        return self._smooth(ties)

    def _random_two(self) -> Peer | None:
        total = sum(p.weight for p in self.peers)
        chosen: list[Peer] = []
        for _ in range(_TRIES):
            x = self.rng.randrange(total)
            for p in self.peers:
                x -= p.weight
                if x < 0:
                    break
            if p.available and p not in chosen:
                chosen.append(p)
                if len(chosen) == 2:
                    break
        if len(chosen) < 2:
            return chosen[0] if chosen else self._smooth(self.peers)
        a, b = chosen
        return a if a.conns * b.weight < b.conns * a.weight else b

    def _hash(self, req: RequestView) -> Peer | None:
        m = self._key_re.search(req.body)
        key = m.group(1) if m else b""
        n = len(self.point_hashes)
        i = bisect.bisect_left(self.point_hashes, zlib.crc32(key))
        for k in range(_TRIES):
            p = self.point_peers[(i + k) % n]
            if p.available:
                return self._smooth([p])
        return self._smooth(self.peers)


class NginxModel(RoutingModel):
    """nginx with the knobs of one parameter set, over one cluster's replicas."""

    def __init__(self, params: Knobs, replicas: Sequence[TwinReplica], seed: int = 0) -> None:
        known = {"algorithm", "hash_bytes", *UNMODELED}
        self.unmodeled = tuple(
            sorted(
                k
                for k in params
                if k in UNMODELED
                or (k not in known and not k.startswith(("weight.", "max_conns.")))
            )
        )
        method = str(params.get("algorithm", "round_robin"))
        rng = random.Random(seed)
        models = sorted({m for r in replicas for m in r.models})
        self.upstreams: dict[str, Upstream] = {}
        for model in models:
            peers = []
            for r in replicas:
                if model in r.models:
                    w = int(params.get(f"weight.{r.name}", 10))
                    mc = int(params.get(f"max_conns.{r.name}", 0))
                    peers.append(Peer(r.name, max(w, 1), mc, down=w == 0))
            self.upstreams[model] = Upstream(peers, method, int(params.get("hash_bytes", 256)), rng)
        self.assigned: dict[int, Peer] = {}

    def route(self, req: RequestView, now: float, cluster: ClusterView) -> Decision:
        up = self.upstreams.get(req.model)
        if up is None:
            served = ", ".join(self.upstreams)
            return Refuse(404, f"The model is not served by this cluster. Served models: {served}")
        peer = up.pick(req)
        if peer is None:
            return Refuse(502, "no live upstreams")
        peer.conns += 1
        self.assigned[req.index] = peer
        return Send(peer.name)

    def on_end(
        self, req: RequestView, replica: str, now: float
    ) -> Sequence[tuple[RequestView, str]]:
        peer = self.assigned.pop(req.index, None)
        if peer is not None:
            peer.conns -= 1
        return ()


def routing_model(params: Knobs, replicas: Sequence[TwinReplica], seed: int = 0) -> NginxModel:
    """The nginx model of ``params`` (a full nginx parameter set) over ``replicas``."""
    return NginxModel(params, replicas, seed)
