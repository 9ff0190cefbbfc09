"""vllm-router's routing in the virtual-time twin (:mod:`lbtune.twin`): ``routing_model``.

vllm-router 0.1.17 sends every request to one of its workers (it does not route by model:
the embedded clusters behind it serve one model) and counts its own in-flight requests
per worker. The policies, as its documentation and source comments describe them:

* ``round_robin`` — the workers in turn; ``random`` — uniform;
* ``power_of_two`` — two distinct random workers, the one with the lower load, the load
  being what the workers' ``GET /get_load`` said (running + waiting), polled every
  :data:`LOAD_POLL_S` (an assumption: the poll interval is not documented);
* ``consistent_hash`` — a hash of the first routing key present (``x-session-id`` and other
  headers first, then ``x-request-id``, which lbtune's client sends, unique per request):
  for lbtune's traffic a uniform spread by request id;
* ``cache_aware`` — an approximate prefix tree per worker over the token ids the worker
  renders (kept here at the engine's 16-token block granularity): when the load (the
  router's own in-flight counts) is imbalanced — ``max - min > balance_abs_threshold`` and
  ``max > balance_rel_threshold x min`` — the least loaded worker; otherwise the worker
  with the longest match if ``match / prompt > cache_threshold``, else the worker with
  the smallest tree; the request's blocks join the chosen worker's tree; every
  ``eviction_interval_secs`` each tree is cut to ``max_tree_size`` tokens, least recently
  used first.

Not modeled: nothing of the space (all five thresholds act as above).
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Sequence

from lbtune.twin.replica import TwinReplica
from lbtune.twin.routing import ClusterView, Decision, Knobs, RequestView, RoutingModel, Send

__all__ = ["LOAD_POLL_S", "VllmRouterModel", "routing_model"]

LOAD_POLL_S = 1.0
BLOCK = 16
_MODELED = {
    "policy",
    "cache_threshold",
    "balance_abs_threshold",
    "balance_rel_threshold",
    "eviction_interval_secs",
    "max_tree_size",
}


def _blocks(ids: Sequence[int]) -> list[bytes]:
    """Chained hashes of the full 16-token blocks of ``ids``."""
    out: list[bytes] = []
    h = b""
    for i in range(len(ids) // BLOCK):
        chunk = b"".join(t.to_bytes(4, "little") for t in ids[i * BLOCK : (i + 1) * BLOCK])
        h = hashlib.blake2b(h + chunk, digest_size=12).digest()
        out.append(h)
    return out


class VllmRouterModel(RoutingModel):
    """vllm-router with one parameter set, over one cluster's replicas."""

    def __init__(self, params: Knobs, replicas: Sequence[TwinReplica], seed: int = 0) -> None:
        self.unmodeled = tuple(sorted(k for k in params if k not in _MODELED))
        self.policy = str(params.get("policy", "cache_aware"))
        self.threshold = float(params.get("cache_threshold", 0.3))
        self.abs = int(params.get("balance_abs_threshold", 64))
        self.rel = float(params.get("balance_rel_threshold", 1.5))
        self.evict_every = float(params.get("eviction_interval_secs", 120))
        self.max_tree = int(params.get("max_tree_size", 33554432))
        self.names = [r.name for r in replicas]
        self.rng = random.Random(seed)
        self.rr = 0
        self.load = dict.fromkeys(self.names, 0)
        self.polled = dict.fromkeys(self.names, 0)
        self.trees: dict[str, OrderedDict[bytes, None]] = {n: OrderedDict() for n in self.names}
        self.assigned: dict[int, str] = {}
        self.next_poll = 0.0 if self.policy == "power_of_two" else None
        self.next_evict = self.evict_every if self.policy == "cache_aware" else None

    def route(self, req: RequestView, now: float, cluster: ClusterView) -> Decision:
        name = self._choose(req)
        self.load[name] += 1
        self.assigned[req.index] = name
        return Send(name)

    def _choose(self, req: RequestView) -> str:
        n = len(self.names)
        if self.policy == "round_robin":
            self.rr += 1
            return self.names[(self.rr - 1) % n]
        if self.policy == "random" or n == 1:
            return self.names[self.rng.randrange(n)]
        if self.policy == "power_of_two":
            a, b = self.rng.sample(self.names, 2)
            return b if self.polled[b] < self.polled[a] else a
        if self.policy == "consistent_hash":
            key = f"twin-{req.index}".encode()
            return self.names[int.from_bytes(hashlib.blake2b(key).digest()[:8], "big") % n]
        return self._cache_aware(req)

    def _cache_aware(self, req: RequestView) -> str:
        loads = self.load
        hi, lo = max(loads.values()), min(loads.values())
        ids = req.prompt_ids
        blocks = _blocks(ids)
        if hi - lo > self.abs and hi > self.rel * lo:
            name = min(self.names, key=lambda x: loads[x])
        else:
            best, match = self.names[0], -1
            for w in self.names:
                tree = self.trees[w]
                m = 0
                for h in blocks:
                    if h not in tree:
                        break
                    m += 1
                if m > match:
                    best, match = w, m
            ratio = match * BLOCK / max(1, len(ids))
            if ratio > self.threshold:
                name = best
            else:
                name = min(self.names, key=lambda x: len(self.trees[x]))
        tree = self.trees[name]
        for h in blocks:
            tree[h] = None
            tree.move_to_end(h)
        return name

    def on_end(
        self, req: RequestView, replica: str, now: float
    ) -> Sequence[tuple[RequestView, str]]:
        name = self.assigned.pop(req.index, None)
        if name is not None:
            self.load[name] -= 1
        return ()

    def next_tick(self) -> float | None:
        times = [t for t in (self.next_poll, self.next_evict) if t is not None]
        return min(times) if times else None

    def tick(self, now: float, cluster: ClusterView) -> None:
        if self.next_poll is not None and now >= self.next_poll:
            for n in self.names:
                rep = cluster.replicas.get(n)
                if rep is not None:
                    self.polled[n] = rep.num_running + rep.num_waiting
            self.next_poll = now + LOAD_POLL_S
        if self.next_evict is not None and now >= self.next_evict:
            cap = max(0, self.max_tree // BLOCK)
            for tree in self.trees.values():
                while len(tree) > cap:
                    tree.popitem(last=False)
            self.next_evict = now + self.evict_every


def routing_model(params: Knobs, replicas: Sequence[TwinReplica], seed: int = 0) -> VllmRouterModel:
    """The vllm-router model of ``params`` over ``replicas``."""
    return VllmRouterModel(params, replicas, seed)
