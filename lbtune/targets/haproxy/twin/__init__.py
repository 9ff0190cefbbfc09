"""HAProxy's routing in the virtual-time twin (:mod:`lbtune.twin`): ``routing_model``.

The model is the config ``haproxy.cfg.j2`` renders for the knobs (see
:func:`lbtune.targets.haproxy.config.template_context`), played in virtual time:

* the frontend picks the request's model backend (404 when no replica serves the model),
  or its ``long_`` backend when ``long_request_bytes`` is set, the body is longer and the
  model has long-context servers (:func:`~lbtune.targets.haproxy.config.long_context_servers`);
* each backend balances with ``algorithm`` (``roundrobin``, ``leastconn``,
  ``random(random_draws)``, ``hash`` on the first ``hash_bytes`` of the prompt with
  ``hash-type consistent`` and ``hash_balance_factor``), per-server ``weight.*`` and
  ``maxconn.*`` with its queue and ``queue_timeout_s`` (:mod:`.backend`, :mod:`.lb`);
* ``algorithm: llm`` runs the Lua scheduler's decisions (:mod:`.llm`) and forces its pick
  (``use-server``, still bounded by ``maxconn``); without a pick the backend's
  ``leastconn`` places the request, as in HAProxy.

Not modeled (named in :attr:`HaproxyModel.unmodeled`): the feedback agent's ``agent.*``
knobs (it changes weights from Prometheus over time) and any knob this module does not
know. Health checks, retries and reloads are not simulated: every replica stays up.
"""

from __future__ import annotations

from collections.abc import Sequence

from lbtune.records.endpoints import ReplicaAddress
from lbtune.targets.base import pool_names
from lbtune.targets.haproxy import llm as lua
from lbtune.targets.haproxy.config import long_context_servers, per_server
from lbtune.targets.haproxy.files import Site
from lbtune.targets.haproxy.twin.backend import Backend, BackendSettings
from lbtune.targets.haproxy.twin.lb import Server
from lbtune.targets.haproxy.twin.llm import LlmScheduler
from lbtune.twin.replica import TwinReplica
from lbtune.twin.routing import (
    ClusterView,
    Decision,
    Knobs,
    Refuse,
    RequestView,
    RoutingModel,
)

__all__ = ["MODELED", "HaproxyModel", "routing_model"]

MODELED = frozenset(
    {
        "algorithm",
        "random_draws",
        "hash_bytes",
        "hash_balance_factor",
        "queue_timeout_s",
        "long_request_bytes",
    }
)
"""Knobs the model reproduces, besides the ``weight.*``, ``maxconn.*`` and ``llm.*`` families."""
_FAMILIES = ("weight.", "maxconn.", lua.KNOB_PREFIX)


def routing_model(params: Knobs, replicas: Sequence[TwinReplica], seed: int = 0) -> HaproxyModel:
    """The HAProxy model of ``params`` (a full HAProxy parameter set) over ``replicas``."""
    return HaproxyModel(params, replicas, seed)


def unmodeled(params: Knobs) -> tuple[str, ...]:
    """The knobs of ``params`` the model does not reproduce."""
    return tuple(sorted(k for k in params if k not in MODELED and not k.startswith(_FAMILIES)))


def _site(replicas: Sequence[TwinReplica]) -> Site:
    addrs = tuple(ReplicaAddress(r.name, "twin", 0, r.models, r.gpu) for r in replicas)
    return Site(state_dir="", host="twin", port=0, stats_port=0, replicas=addrs)


def _fitted_rates(site: Site, replicas: Sequence[TwinReplica]) -> dict[str, str]:
    """``mode predict``'s rates of the replicas simulated from a fit: the fit's own, as
    ``lbtune twin fit`` hands them to the live scheduler (``calibration.json``)."""
    backends = pool_names(site.models)
    out: dict[str, str] = {}
    for r in replicas:
        f = r.fit
        if f is None:
            continue
        out[f"ovh.{r.name}"] = f"{f.overhead_s.value:.6g}"
        out |= lua.rate_entries(
            backends[f.model],
            r.name,
            f.prefill_tokens_per_s.value,
            f.step_s.value,
            f.step_per_seq_s.value,
        )
    return out


class HaproxyModel(RoutingModel):
    """HAProxy with the knobs of one parameter set, over one cluster's replicas."""

    def __init__(self, params: Knobs, replicas: Sequence[TwinReplica], seed: int = 0) -> None:
        self.unmodeled = unmodeled(params)
        site = _site(replicas)
        algorithm = str(params.get("algorithm", "roundrobin"))
        settings = BackendSettings(
            algorithm="leastconn" if algorithm == lua.ALGORITHM else algorithm,
            random_draws=int(params.get("random_draws", 2)),
            hash_bytes=int(params.get("hash_bytes", 256)),
            hash_balance_factor=int(params.get("hash_balance_factor", 150)),
            queue_timeout_s=float(params.get("queue_timeout_s", 60)),
            seed=seed,
        )
        weights, maxconn = per_server(params, "weight"), per_server(params, "maxconn")
        self.long_bytes = int(params.get("long_request_bytes", 0))
        long_set = long_context_servers(site) if self.long_bytes else []
        self.backend_of: dict[str, tuple[Backend, Backend | None]] = {}
        for model, be_name in pool_names(site.models).items():
            serving = [r for r in replicas if model in r.models]
            normal = self._backend(be_name, serving, weights, maxconn, settings)
            longs = [r for r in serving if r.name in long_set]
            long_be = None
            if longs:
                long_be = self._backend("long_" + be_name, longs, weights, maxconn, settings)
            self.backend_of[model] = (normal, long_be)
        self.llm: LlmScheduler | None = None
        if algorithm == lua.ALGORITHM:
            knobs = lua.knob_values(params)
            facts = {**lua.facts(site, long_set), **_fitted_rates(site, replicas)}
            scrape = {r.name: r.fit.scrape_s.value for r in replicas if r.fit and r.fit.scrape_s}
            self.llm = LlmScheduler(knobs, facts, [r.name for r in replicas], scrape)
            self.llm.rng.seed(seed)
        self.assigned: dict[int, Backend] = {}

    @staticmethod
    def _backend(
        name: str,
        replicas: Sequence[TwinReplica],
        weights: dict[str, int],
        maxconn: dict[str, int],
        settings: BackendSettings,
    ) -> Backend:
        servers = {
            r.name: Server(r.name, i + 1, weights.get(r.name, 100), maxconn.get(r.name, 0))
            for i, r in enumerate(replicas)
        }
        return Backend(name, servers, settings)

    # -- RoutingModel ------------------------------------------------------------------

    def route(self, req: RequestView, now: float, cluster: ClusterView) -> Decision:
        pair = self.backend_of.get(req.model)
        if pair is None:
            served = ", ".join(sorted(self.backend_of))
            return Refuse(404, f"The model is not served by this cluster. Served models: {served}")
        be, long_be = pair
        if long_be is not None and self.long_bytes and len(req.body) > self.long_bytes:
            be = long_be
        forced: str | None = None
        if self.llm is not None:
            self.llm.set_time_scale(cluster.time_scale)
            choice = self.llm.decide(req, be.name, list(be.servers), now)
            if not isinstance(choice, str) and choice is not None:
                return choice
            forced = choice
        decision = be.assign(req, forced)
        if not isinstance(decision, Refuse):
            self.assigned[req.index] = be
        return decision

    def on_headers(self, req: RequestView, replica: str, now: float) -> None:
        if self.llm is not None:
            self.llm.release(req)

    def on_end(
        self, req: RequestView, replica: str, now: float
    ) -> Sequence[tuple[RequestView, str]]:
        be = self.assigned.pop(req.index, None)
        if be is None:
            return ()
        out = be.release(replica)
        for queued, _ in out:
            self.assigned[queued.index] = be
        return out

    def cancel(self, req: RequestView, now: float) -> bool:
        be = self.assigned.pop(req.index, None)
        return be is not None and be.cancel(req)

    def next_tick(self) -> float | None:
        return None if self.llm is None else self.llm.next_scrape

    def tick(self, now: float, cluster: ClusterView) -> None:
        if self.llm is not None:
            self.llm.set_time_scale(cluster.time_scale)
            self.llm.scrape(now, cluster)
