"""One HAProxy backend in the twin: its servers, its algorithm, ``maxconn`` and the queues.

As ``haproxy.cfg.j2`` renders it, each model has its own backend (and, with
``long_request_bytes``, a ``long_`` one over the long-context servers); a replica is a
separate server object in each backend that lists it, with its own ``served`` count and
``maxconn``. How a request is placed (``assign_server_and_queue`` in HAProxy 2.6):

* a *forced* server (``use-server``, the LLM scheduler's pick) or a hash pick that is
  saturated queues in that server's own queue;
* roundrobin with requests already in the backend's queue (and some served) queues behind
  them; an algorithm that finds every server saturated (``maxconn``) queues in the backend;
* a server whose request ends takes the oldest request of its own queue or the backend's
  while it is under its ``maxconn``; a request queued longer than ``timeout queue``
  gets a 503 (the twin's :class:`~lbtune.twin.routing.Queue` timeout);
* every server at weight 0: 503 at once (no server available).
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from dataclasses import dataclass, field

from lbtune.targets.haproxy.twin.lb import Fwlc, Fwrr, Ring, Server, full_hash, sdbm
from lbtune.twin.routing import Decision, Queue, Refuse, RequestView, Send

__all__ = ["Backend", "BackendSettings"]

_order = itertools.count()
"""Arrival order of queued requests (the oldest is dequeued first)."""


@dataclass(frozen=True)
class BackendSettings:
    algorithm: str = "roundrobin"
    """``roundrobin``, ``leastconn``, ``random`` or ``hash`` (``llm`` uses ``leastconn``)."""
    random_draws: int = 2
    hash_bytes: int = 256
    hash_balance_factor: int = 0
    queue_timeout_s: float = 60.0
    seed: int = 0


@dataclass(eq=False)
class Backend:
    """A backend's servers and the requests it holds."""

    name: str
    servers: dict[str, Server]
    settings: BackendSettings
    served: int = 0
    queue: deque[tuple[int, RequestView]] = field(default_factory=deque)
    server_queues: dict[str, deque[tuple[int, RequestView]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        listed = list(self.servers.values())
        st = self.settings
        self.rr = Fwrr(listed) if st.algorithm == "roundrobin" else None
        self.lc = Fwlc(listed) if st.algorithm == "leastconn" else None
        self.ring = None
        if st.algorithm in ("random", "hash"):
            factor = st.hash_balance_factor if st.algorithm == "hash" else 0
            rng = random.Random(f"{st.seed}:{self.name}")
            self.ring = Ring(listed, factor, rng)
        self.server_queues = {n: deque() for n in self.servers}
        self.tot_weight = sum(s.eweight for s in listed)

    # -- placing a request -----------------------------------------------------------

    def assign(self, req: RequestView, forced: str | None = None) -> Decision:
        """Where ``req`` goes in this backend (``forced``: a ``use-server`` pick)."""
        if forced is not None:
            return self._to(self.servers[forced], req)
        if self.tot_weight == 0:
            return Refuse(503, f"backend {self.name}: no server available")
        st = self.settings
        if st.algorithm == "roundrobin" and self.queue and self.served:
            return self._enqueue(req, None)
        srv: Server | None
        if self.rr is not None:
            srv = self.rr.pick()
        elif self.lc is not None:
            srv = self.lc.pick()
        elif self.ring is not None and st.algorithm == "random":
            srv = self.ring.random_pick(st.random_draws)
        elif self.ring is not None:
            key = req.prompt_text.encode("utf-8", "surrogatepass")[: st.hash_bytes]
            srv = self.ring.lookup(full_hash(sdbm(key)), self.served)
        else:  # pragma: no cover - every algorithm is handled above
            raise AssertionError(st.algorithm)
        if srv is None:
            return self._enqueue(req, None)
        return self._to(srv, req)

    def _to(self, srv: Server, req: RequestView) -> Decision:
        if srv.saturated:
            return self._enqueue(req, srv)
        self._take(srv)
        return Send(srv.name)

    def _take(self, srv: Server) -> None:
        srv.served += 1
        self.served += 1
        if self.lc is not None:
            self.lc.reposition(srv)

    def _enqueue(self, req: RequestView, srv: Server | None) -> Queue:
        entry = (next(_order), req)
        if srv is None:
            self.queue.append(entry)
        else:
            self.server_queues[srv.name].append(entry)
            srv.nbpend += 1
        return Queue(self.settings.queue_timeout_s)

    # -- a request ends ----------------------------------------------------------------

    def release(self, name: str) -> list[tuple[RequestView, str]]:
        """A request served by ``name`` ended: the queued requests it takes now."""
        srv = self.servers[name]
        srv.served -= 1
        self.served -= 1
        if self.lc is not None:
            self.lc.reposition(srv)
        out: list[tuple[RequestView, str]] = []
        own = self.server_queues[name]
        while srv.maxconn and srv.served < srv.maxconn and (own or self.queue):
            if own and (not self.queue or own[0][0] < self.queue[0][0]):
                _, req = own.popleft()
                srv.nbpend -= 1
            else:
                _, req = self.queue.popleft()
            self._take(srv)
            out.append((req, name))
        return out

    def cancel(self, req: RequestView) -> bool:
        """Drop ``req`` from a queue (timeout, client gone); whether it was queued."""
        for name, q in (*self.server_queues.items(), ("", self.queue)):
            for entry in q:
                if entry[1] is req:
                    q.remove(entry)
                    if name:
                        self.servers[name].nbpend -= 1
                    return True
        return False
