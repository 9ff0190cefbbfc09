"""HAProxy 2.6's load-balancing algorithms, re-implemented for the twin (pure, no I/O).

Each works on one backend's :class:`Server` objects (a server of ``haproxy.cfg`` is one
object *per backend*: its own ``served`` count, queue and weight state) and follows the
behaviour of HAProxy's sources (``src/lb_fwrr.c``, ``lb_fwlc.c``, ``lb_chash.c``,
``backend.c``), including how ties fall:

* effective weights are ``weight x 16`` (``BE_WEIGHT_SCALE``); a server of weight 0 takes
  no request from any algorithm;
* HAProxy's trees (ebtree) return equal keys in insertion order: :class:`Tree` keeps an
  insertion counter beside each key;
* :class:`Fwrr` (``roundrobin``): the "fast weighted round robin" — servers hold a next
  position ``npos`` advanced by ``total weight / eweight`` (remainders carried in
  ``rweight``) in a *current* tree, with *init* and *next* trees swapped when a round
  ends; saturated servers (``maxconn``) are skipped and requeued;
* :class:`Fwlc` (``leastconn``): servers keyed by ``(in flight + 1) x 4096 / eweight``
  (0 when idle), repositioned only when their key changes; the first one not saturated;
* :class:`Ring` (``hash``, ``random``): every server owns ``eweight`` points at
  ``full_hash(id x 4096 + i)`` on a 32-bit circle; a key hashes to ``full_hash(sdbm(key))``
  (HAProxy 2.6 applies the avalanche with ``hash-type consistent``: checked against a real
  HAProxy, ``tests/targets/haproxy/test_twin_live.py``) and picks the closest point
  (ties to the one before), and with a balance factor walks on to the next server whose
  ``served`` is under its bounded-load share; ``random(N)`` draws N random points and
  keeps the least ``served / weight``.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field

__all__ = [
    "EWGHT_MAX",
    "WEIGHT_SCALE",
    "Fwlc",
    "Fwrr",
    "Ring",
    "Server",
    "Tree",
    "full_hash",
    "sdbm",
]

WEIGHT_SCALE = 16
"""``BE_WEIGHT_SCALE``: effective weight = user weight x 16."""
UWGHT_RANGE = 256
EWGHT_MAX = UWGHT_RANGE * WEIGHT_SCALE
"""``SRV_EWGHT_MAX`` (= ``SRV_EWGHT_RANGE``)."""
_M32 = 0xFFFFFFFF


def full_hash(a: int) -> int:
    """HAProxy's ``full_hash``: Bob Jenkins' 32-bit integer avalanche hash, times a prime."""
    a &= _M32
    a = (a + 0x7ED55D16 + (a << 12)) & _M32
    a = (a ^ 0xC761C23C ^ (a >> 19)) & _M32
    a = (a + 0x165667B1 + (a << 5)) & _M32
    a = ((a + 0xD3A2646C) ^ (a << 9)) & _M32
    a = (a + 0xFD7046C5 + (a << 3)) & _M32
    a = (a ^ 0xB55A4F09 ^ (a >> 16)) & _M32
    return (a * 3221225473) & _M32


def sdbm(key: bytes) -> int:
    """HAProxy's default hash function (``hash-type consistent sdbm``)."""
    h = 0
    for c in key:
        h = (c + (h << 6) + (h << 16) - h) & _M32
    return h


@dataclass(eq=False)
class Server:
    """One server line of one backend."""

    name: str
    puid: int
    """Its id in the backend (1, 2, ... in the order of the config's lines)."""
    weight: int = 100
    maxconn: int = 0
    """0: no limit."""
    served: int = 0
    """Requests it serves now (assigned, not queued)."""
    nbpend: int = 0
    """Requests in its own queue (a forced server that was full)."""
    cumulative_weight: int = 0
    """Sum of the eweights of the usable servers before it."""
    # roundrobin state
    npos: int = 0
    lpos: int = 0
    rweight: int = 0
    tree: Tree | None = None
    # leastconn state
    key: int = 0

    @property
    def eweight(self) -> int:
        return self.weight * WEIGHT_SCALE

    @property
    def saturated(self) -> bool:
        """``maxconn`` reached, or requests already queued for it."""
        return self.maxconn > 0 and (self.nbpend > 0 or self.served >= self.maxconn)


class Tree:
    """An ebtree of servers: sorted by key, equal keys in insertion order."""

    _counter = 0

    def __init__(self) -> None:
        self._items: list[tuple[int, int, Server]] = []

    def __bool__(self) -> bool:
        return bool(self._items)

    def insert(self, key: int, s: Server) -> None:
        Tree._counter += 1
        bisect.insort(self._items, (key, Tree._counter, s), key=lambda it: (it[0], it[1]))
        s.tree = self

    def delete(self, s: Server) -> None:
        for i, it in enumerate(self._items):
            if it[2] is s:
                del self._items[i]
                return

    def first(self) -> Server | None:
        return self._items[0][2] if self._items else None

    def servers(self) -> list[Server]:
        return [it[2] for it in self._items]


@dataclass(eq=False)
class Fwrr:
    """``balance roundrobin`` over one backend's servers."""

    servers: list[Server]
    curr: Tree = field(default_factory=Tree)
    init: Tree = field(default_factory=Tree)
    next: Tree = field(default_factory=Tree)

    def __post_init__(self) -> None:
        usable = [s for s in self.servers if s.eweight > 0]
        total = sum(s.eweight for s in usable)
        self.curr_pos = self.curr_weight = self.next_weight = total
        for s in usable:
            self._queue_by_weight(self.init, s)

    def _queue_by_weight(self, tree: Tree, s: Server) -> None:
        tree.insert(EWGHT_MAX - s.eweight, s)

    def _queue(self, s: Server) -> None:
        if s.eweight <= 0:
            s.tree = None
        elif s.npos >= 2 * self.curr_weight or s.npos >= self.curr_weight + self.next_weight:
            s.npos -= self.curr_weight
            self._queue_by_weight(self.next, s)
        else:
            key = UWGHT_RANGE * s.npos + (EWGHT_MAX + s.rweight - s.eweight) // WEIGHT_SCALE
            self.curr.insert(key, s)

    def _from_group(self) -> Server | None:
        s = self.curr.first()
        if s is None or s.npos > self.curr_pos:
            s2 = self.init.first()
            if s2 is not None:
                s2.npos = s2.rweight = 0
                return s2
        return s

    def _update_position(self, s: Server) -> None:
        if not s.npos:  # first time ever for this server
            s.npos = self.curr_pos
        s.lpos = s.npos
        s.npos += self.next_weight // s.eweight
        s.rweight += self.next_weight % s.eweight
        if s.rweight >= s.eweight:
            s.rweight -= s.eweight
            s.npos += 1

    def _switch(self) -> None:
        self.init, self.next = self.next, self.init
        self.curr_weight = self.next_weight
        self.curr_pos = self.curr_weight

    def pick(self) -> Server | None:
        """The next server not saturated; ``None`` when every one is (the request queues)."""
        switched = False
        full: list[Server] = []
        srv: Server | None = None
        while True:
            if not self.curr_weight:
                self.curr_pos = self.curr_weight = self.next_weight
            while True:
                srv = self._from_group()
                if srv is not None:
                    break
                if switched:
                    break
                switched = True
                self._switch()
            if srv is None:
                break
            self._update_position(srv)
            if srv.tree is not None:
                srv.tree.delete(srv)
                srv.tree = None
            self.curr_pos += 1
            if not srv.saturated:
                break
            full.insert(0, srv)  # HAProxy chains them head first
        if srv is not None:
            self._queue(srv)
        for f in full:
            if switched:
                self._queue_by_weight(self.init, f)
            else:
                self._queue(f)
        return srv


@dataclass(eq=False)
class Fwlc:
    """``balance leastconn`` over one backend's servers."""

    servers: list[Server]
    tree: Tree = field(default_factory=Tree)

    def __post_init__(self) -> None:
        for s in self.servers:
            if s.eweight > 0:
                s.key = self._key(s)
                self.tree.insert(s.key, s)

    @staticmethod
    def _key(s: Server) -> int:
        inflight = s.served + s.nbpend
        return (inflight + 1) * EWGHT_MAX // s.eweight if inflight else 0

    def reposition(self, s: Server) -> None:
        """After ``s`` took or dropped a request."""
        if s.tree is None:
            return
        key = self._key(s)
        if key == s.key:
            return
        self.tree.delete(s)
        s.key = key
        self.tree.insert(key, s)

    def pick(self) -> Server | None:
        for s in self.tree.servers():
            if not s.maxconn or s.served + s.nbpend < s.maxconn:
                return s
        return None


@dataclass(eq=False)
class Ring:
    """The consistent-hash circle of one backend (``hash-type consistent``, ``random``)."""

    servers: list[Server]
    balance_factor: int = 0
    """``hash-balance-factor`` (0: off)."""
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def __post_init__(self) -> None:
        points: list[tuple[int, int, Server]] = []
        order = 0
        cum = 0
        for s in self.servers:
            if s.eweight <= 0:
                continue
            s.cumulative_weight = cum
            cum += s.eweight
            for node in range(s.eweight):
                order += 1
                points.append((full_hash(s.puid * EWGHT_MAX + node), order, s))
        points.sort(key=lambda p: (p[0], p[1]))
        self.keys = [p[0] for p in points]
        self.owners = [p[2] for p in points]
        self.tot_weight = cum

    def _eligible(self, s: Server, backend_served: int) -> bool:
        tot = self.tot_weight
        tot_slots = ((backend_served + 1) * self.balance_factor + 99) // 100
        per_weight, rem = divmod(tot_slots, tot)
        slots = s.eweight * per_weight
        slots += (s.cumulative_weight + s.eweight) * rem // tot - s.cumulative_weight * rem // tot
        return s.served < max(1, slots)

    def lookup(self, h: int, backend_served: int = 0) -> Server | None:
        """The server for hash ``h`` (bounded by the balance factor)."""
        n = len(self.keys)
        if n == 0:
            return None
        i = bisect.bisect_left(self.keys, h)
        nxt = i % n
        prev = (i - 1) % n
        if (h - self.keys[prev]) & _M32 <= (self.keys[nxt] - h) & _M32:
            nxt = prev
        srv = self.owners[nxt]
        if not self.balance_factor:
            return srv
        loops = 0
        while not self._eligible(srv, backend_served):
            nxt += 1
            if nxt == n:
                nxt = 0
                loops += 1
                if loops > 1:
                    break
            srv = self.owners[nxt]
        return srv

    def random_pick(self, draws: int) -> Server | None:
        """``balance random(draws)``: the least loaded (served / weight) of the draws;
        ``None`` when it is saturated (the request queues)."""
        curr: Server | None = None
        for _ in range(max(1, draws)):
            prev = curr
            curr = self.lookup(self.rng.getrandbits(32))
            if curr is None:
                break
            if (
                prev is not None
                and prev is not curr
                and curr.served * prev.eweight > prev.served * curr.eweight
            ):
                curr = prev
        if curr is not None and curr.saturated:
            return None
        return curr
