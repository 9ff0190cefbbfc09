"""What crosses the hooks of a balancer, and the small rules every balancer shares.

A balancer is one subpackage ``lbtune/targets/<name>/`` and one line in
:data:`lbtune.targets.TARGETS`. It subclasses two bases (:mod:`lbtune.targets.targetbase`),
which are the contract:

* :class:`~lbtune.targets.targetbase.BalancerBase`, the registry entry, exists before a
  cluster does (``lbtune cluster up`` asks it to check the cluster YAML, render and start
  the balancer, and name its Prometheus jobs);
* :class:`~lbtune.targets.targetbase.TargetBase` is one running balancer (made by
  ``BalancerBase.target`` from the running cluster's
  :class:`~lbtune.records.endpoints.Endpoints`): its knobs, validation, apply, read-back
  and rollback.

The core (``lbtune.cluster``, ``lbtune.apply``, ``lbtune.agent``, ``lbtune.tune``) only
ever calls what the bases declare, and never names a balancer. Everything that crosses a
hook is a frozen dataclass defined in this module (or a :data:`ParamSet`); the rules every
balancer shares (:func:`pool_names`, :func:`zero_weight_replicas`, :func:`mismatches`,
:class:`Plan`) live here too.

Checklist for a new balancer ``foo`` (``docs/targets.md`` has a worked example):

1. ``lbtune/targets/foo/space.yaml`` — its knobs (:mod:`lbtune.targets.space`).
2. ``lbtune/targets/foo/target.py`` — a :class:`~lbtune.targets.targetbase.TargetBase`
   subclass: ``replica_names``, ``read_live`` and ``apply`` (with :class:`Plan`); the
   rollback, the feedback agent's ownership of the weights, ``replicas_out`` and the
   read-back come with the base.
3. ``lbtune/targets/foo/balancer.py`` — a
   :class:`~lbtune.targets.targetbase.BalancerBase` subclass, an instance of it named
   ``BALANCER``: ``launch``, ``scrape_jobs``, ``problems``, ``target``; ``weights`` only
   with ``live_weights = True``; ``series`` where its exporter has per-pool queues or
   per-server figures (the run summary's ``balancer`` section).
4. ``"foo": "lbtune.targets.foo.balancer:BALANCER"`` in :data:`lbtune.targets.TARGETS`.
5. ``lbtune/data/playbooks/library/lbtune_foo.py`` — the Ansible module (check mode,
   ``--diff``); the generic ``lbtune/data/playbooks/target-apply.yml`` runs it.
6. ``lbtune/data/clusters/mini2-foo.yaml`` — a tiny cluster with ``balancer: foo`` and
   ``ports: auto``, named by ``BalancerBase.test_preset``: the contract suite
   ``tests/targets/test_contract.py`` then runs against ``foo`` with no edit.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from lbtune.errors import ApplyError
from lbtune.records.endpoints import ReplicaAddress
from lbtune.targets.params import ParamSet, ParamValue

__all__ = [
    "DEFAULT_REPLICA_HEADER",
    "ApplyResult",
    "BalancerLaunch",
    "ClusterShape",
    "Diff",
    "LaunchSpec",
    "LiveWeights",
    "ParamSet",
    "ParamValue",
    "Plan",
    "RejectedBeforeApply",
    "ReplicaAddress",
    "ReplicaRow",
    "ScrapeJob",
    "Supervisor",
    "diff",
    "mismatches",
    "pool_names",
    "zero_weight_replicas",
]

Diff = dict[str, tuple[ParamValue | None, ParamValue | None]]
"""knob -> (before, after)."""

DEFAULT_REPLICA_HEADER = "X-Lbtune-Replica"
"""The response header naming the replica that served a request (the load generator
reads it into ``RequestRecord.replica``)."""


# ---------------------------------------------------------------------------------------
# Tuning: what crosses TargetBase's hooks.


@dataclass(frozen=True)
class ApplyResult:
    """What ``TargetBase.apply`` (and ``rollback``) did, or would do."""

    changed: bool
    """False when the live state already equalled the requested parameters."""
    applied: ParamSet
    """The full parameter set now live (read back, not assumed); in check mode the full
    set that *would* be live."""
    diff: Diff = field(default_factory=dict)
    """knob -> (before, after) for every knob that changed (or would, in check mode)."""
    reloaded: bool = False
    """True when the change was structural: it needed a config reload or a restart
    (or, in check mode, would need one). False when it went through a live API."""
    check: bool = False
    """True in check mode: nothing was touched."""
    seconds: float = 0.0


class RejectedBeforeApply(ApplyError):
    """The balancer refused the new state before anything was touched (e.g. ``haproxy -c``
    rejected the rendered config): the previous state is still live, nothing to roll back."""


def diff(live: Mapping[str, ParamValue], desired: Mapping[str, ParamValue]) -> Diff:
    """knob -> (live, desired) for every knob of ``desired`` that ``live`` does not hold."""
    return {k: (live.get(k), v) for k, v in desired.items() if live.get(k) != v}


def mismatches(
    desired: Mapping[str, ParamValue],
    live: Mapping[str, ParamValue],
    skip: frozenset[str] = frozenset(),
) -> list[str]:
    """One line per knob of ``desired`` (but ``skip``) that ``live`` does not hold: what a
    read-back names."""
    return [
        f"{k}: wanted {v!r}, live {live.get(k)!r}"
        for k, v in desired.items()
        if live.get(k) != v and k not in skip
    ]


@dataclass(frozen=True)
class Plan:
    """An apply worked out before anything is touched: what is live, what will be, how.

    Every ``apply`` ends in one of its two results: :meth:`untouched` (check mode, or
    nothing to change) or :meth:`done` (after the balancer took the change).
    """

    live: ParamSet
    desired: ParamSet
    """The full set to make live (the request completed with what is live)."""
    reload: bool
    """The change is structural: it needs a reload or a restart."""
    began: float
    """``time.perf_counter()`` when the apply began."""
    drift: bool = False
    """Something beside the knobs differs: the balancer's files are not what ``desired``
    renders (a change even with an empty diff)."""

    @property
    def diff(self) -> Diff:
        return diff(self.live, self.desired)

    @property
    def changed(self) -> bool:
        return bool(self.diff) or self.drift

    def untouched(self, *, check: bool) -> ApplyResult:
        """The result when nothing is touched: in check mode, what would change (and the
        full set that would be live); else, with nothing to change, what is live."""
        return ApplyResult(
            changed=self.changed,
            applied=self.desired if check else self.live,
            diff=self.diff,
            reloaded=self.reload and self.changed and check,
            check=check,
            seconds=time.perf_counter() - self.began,
        )

    def done(self, applied: ParamSet) -> ApplyResult:
        """The result once the balancer took the change (``applied``: the read-back)."""
        return ApplyResult(
            changed=True,
            applied=applied,
            diff=self.diff,
            reloaded=self.reload,
            seconds=time.perf_counter() - self.began,
        )


def zero_weight_replicas(params: Mapping[str, object], knob: str = "weight") -> frozenset[str]:
    """Replicas whose per-server ``<knob>.<replica>`` is 0 in ``params`` (what "cannot take
    traffic" means for a balancer whose only such knob is a weight)."""
    prefix = knob + "."
    return frozenset(
        k.removeprefix(prefix)
        for k, v in params.items()
        if k.startswith(prefix) and not isinstance(v, bool) and v == 0
    )


def pool_names(models: Sequence[str]) -> dict[str, str]:
    """Model -> the name of the balancer's pool of its replicas (HAProxy backend, Envoy
    cluster, nginx upstream): ``model_<model>`` with every character but ``A-Za-z0-9_.-``
    replaced by ``_``, and ``_2``, ``_3``... where two models would share a name. Never a
    balancer's catch-all pool (``all``): every name starts with ``model_``."""
    out: dict[str, str] = {}
    for model in models:
        base = "model_" + re.sub(r"[^A-Za-z0-9_.-]", "_", model)
        name, i = base, 1
        while name in out.values():
            i += 1
            name = f"{base}_{i}"
        out[model] = name
    return out


# ---------------------------------------------------------------------------------------
# The embedded cluster: what crosses Balancer's hooks.


@dataclass(frozen=True)
class ClusterShape:
    """What ``BalancerBase.check_cluster`` may object to in a cluster YAML."""

    replica_models: tuple[tuple[str, ...], ...]
    """The models of each replica, in order."""
    agent: bool
    """The YAML enables the feedback agent (it needs ``BalancerBase.live_weights``)."""
    params: Mapping[str, object]
    """The YAML's ``params:`` (initial knob values for this balancer)."""


@dataclass(frozen=True)
class LaunchSpec:
    """Everything the embedded cluster tells a balancer when it launches it."""

    cluster_name: str
    state_dir: Path
    """The cluster's state dir: put config files, sockets and records here (the
    supervisor puts ``<component>.pid`` and ``logs/<component>.log`` there)."""
    host: str
    """The address to listen on (loopback)."""
    port: int
    """The OpenAI-compatible API listener (``/v1/...``, ``/health``)."""
    metrics_port: int
    """The balancer's own stats/metrics/admin page (``ports.stats``)."""
    extra_ports: Mapping[str, int]
    """One free port per name in ``BalancerBase.extra_ports``."""
    replicas: tuple[ReplicaAddress, ...]
    models: tuple[str, ...]
    """Every model served, sorted."""
    params: Mapping[str, object]
    """Initial knob values from the cluster YAML's ``params:`` (unvalidated: check them
    against the space; knobs not given are the space's baseline)."""
    time_scale: float = 1.0
    """The simulated replicas run this many times faster than real time."""
    agent_settings: Path | None = None
    """The feedback agent's settings file when the cluster runs the agent."""


@dataclass(frozen=True)
class BalancerLaunch:
    """What ``BalancerBase.launch`` returns once the balancer is up and healthy.

    Recorded in ``endpoints.json``; ``BalancerBase.target`` gets it back through
    ``Endpoints.balancer_details``.
    """

    components: tuple[str, ...]
    """The supervisor components it started, in start order (``down`` stops them in
    reverse, by PID, identity-checked)."""
    stats_url: str
    """A page a person opens to see the balancer (stats page, admin page)."""
    metrics_url: str
    """The balancer's Prometheus exposition (or its exporter's)."""
    details: Mapping[str, str] = field(default_factory=dict)
    """Balancer-specific facts its Target needs later (socket paths, config files):
    free-form, only this balancer reads them."""


@dataclass(frozen=True)
class ScrapeJob:
    """One Prometheus scrape job for the balancer (``job_name`` is the ``job`` label)."""

    job_name: str
    targets: tuple[str, ...]
    """``host:port`` of each endpoint to scrape."""
    metrics_path: str = "/metrics"


@dataclass(frozen=True)
class ReplicaRow:
    """One replica as the running balancer itself sees it (``lbtune cluster status``)."""

    replica: str
    """:attr:`ReplicaAddress.name`."""
    status: str
    """The balancer's own word for it (HAProxy ``UP``/``DRAIN``, Envoy ``healthy``...)."""
    weight: int | None = None
    """Its live weight (the same in each of the balancer's per-model pools), if any."""
    active: int | None = None
    """Sessions or requests open through the balancer to it now; ``None``: cannot say."""
    down: bool | None = None
    """The balancer sends it nothing because its health checks failed (or an operator put
    it in maintenance); ``None``: this balancer cannot say (stress reports "unknown")."""
    failures: int | None = None
    """Connection and response errors the balancer has counted against it since it
    started; ``None``: cannot say."""


class Supervisor(Protocol):
    """The cluster's process supervisor, as ``BalancerBase.launch`` sees it.

    Processes run in their own session, log to ``<state>/logs/<name>.log`` and have a PID
    file ``<state>/<name>.pid``; they are only ever signalled after an identity check.
    """

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        """Start ``argv`` as component ``name`` (a name used once per cluster)."""
        ...

    def wait_until(self, check: Callable[[], str | None], timeout_s: float, what: str) -> None:
        """Poll ``check`` (``None`` = ready, else what is missing) until ready; a
        ClusterError naming ``what``, the last answer and the log tail on timeout or when
        a process this cluster started dies meanwhile."""
        ...

    def stop(self, name: str) -> None:
        """Stop component ``name`` if it runs (no error when it does not)."""
        ...


class LiveWeights(Protocol):
    """Per-replica weights set without a reload (what the feedback agent drives)."""

    max_weight: int
    """The largest weight the balancer accepts (the smallest is 0: no new requests)."""

    def weights(self) -> dict[str, int]:
        """Replica name -> its live weight."""
        ...

    def set_weights(self, weights: Mapping[str, int]) -> None:
        """Set these replicas' weights now (others keep theirs); TargetError when the
        balancer refuses."""
        ...
