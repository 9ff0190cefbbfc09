"""The target contract: every hook lbtune's core calls on a balancer, and nothing else.

A balancer is one subpackage ``lbtune/targets/<name>/`` and one line in
:data:`lbtune.targets.TARGETS`. The registry entry is a :class:`Balancer`: what the
embedded cluster needs to launch, watch and scrape the balancer, and a factory of
:class:`Target` — what the optimizer, ``lbtune apply`` and the agent need to tune it.
The core (``lbtune.cluster``, ``lbtune.apply``, ``lbtune.agent``, ``lbtune.tune.optimize``)
only ever calls what is declared here, and never names a balancer.

Two protocols, because they live at different times:

* :class:`Balancer` exists before a cluster does (``lbtune cluster up`` asks it to check
  the cluster YAML, render and start the balancer, and name its Prometheus jobs);
* :class:`Target` is one running balancer (made by :meth:`Balancer.target` from the
  running cluster's :class:`~lbtune.records.statedir.Endpoints`): its knobs, validation,
  apply, read-back and rollback.

Everything that crosses a hook is a frozen dataclass defined in this module (or a
:data:`ParamSet`), so a new balancer needs nothing but this file to be written.

Checklist for a new balancer ``foo`` (``docs/targets.md`` has a worked example):

1. ``lbtune/targets/foo/space.yaml`` — its knobs (:mod:`lbtune.targets.space`).
2. ``lbtune/targets/foo/balancer.py`` — a class implementing :class:`Balancer`, an
   instance of it named ``BALANCER``; its :meth:`Balancer.target` returns an object
   implementing :class:`Target`.
3. ``"foo": "lbtune.targets.foo.balancer:BALANCER"`` in :data:`lbtune.targets.TARGETS`.
4. ``lbtune/data/playbooks/library/lbtune_foo.py`` — the Ansible module (check mode, ``--diff``);
   the generic ``lbtune/data/playbooks/target-apply.yml`` runs it (see ``docs/targets.md``).
5. ``lbtune/data/clusters/mini2-foo.yaml`` — a tiny cluster with ``balancer: foo`` and
   ``ports: auto``, named by :attr:`Balancer.test_preset`: the contract suite
   ``tests/targets/test_contract.py`` then runs against ``foo`` with no edit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from lbtune.errors import ApplyError
from lbtune.records.endpoints import ReplicaAddress
from lbtune.targets.params import ParamSet, ParamValue

if TYPE_CHECKING:
    from lbtune.records.endpoints import Endpoints
    from lbtune.targets.space import ParameterSpace

__all__ = [
    "DEFAULT_REPLICA_HEADER",
    "ApplyResult",
    "Balancer",
    "BalancerLaunch",
    "ClusterShape",
    "Diff",
    "LaunchSpec",
    "LiveWeights",
    "ParamSet",
    "ParamValue",
    "RejectedBeforeApply",
    "ReplicaAddress",
    "ReplicaRow",
    "ScrapeJob",
    "Supervisor",
    "Target",
    "zero_weight_replicas",
]

Diff = dict[str, tuple[ParamValue | None, ParamValue | None]]
"""knob -> (before, after)."""

DEFAULT_REPLICA_HEADER = "X-Lbtune-Replica"
"""The response header naming the replica that served a request (the load generator
reads it into ``RequestRecord.replica``)."""


# ---------------------------------------------------------------------------------------
# Tuning: what crosses Target's hooks.


@dataclass(frozen=True)
class ApplyResult:
    """What :meth:`Target.apply` (and :meth:`Target.rollback`) did, or would do."""

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


@runtime_checkable
class Target(Protocol):
    """One running balancer, as something lbtune can tune.

    Made by :meth:`Balancer.target`. Every method may be called from any process (the
    optimizer, ``lbtune apply``, the Ansible module on the balancer's host): whatever a
    method needs to know lives in the Endpoints it was made from or in ``state_dir``.

    Errors: a value the user can fix (unknown knob, out of range) is a
    :class:`~lbtune.errors.ConfigError`; a balancer that refused a new state before
    anything changed is :class:`RejectedBeforeApply`; a failure after the balancer was
    touched is :class:`~lbtune.errors.ApplyError` (``lbtune.apply`` then calls
    :meth:`rollback`); an unreachable balancer is :class:`~lbtune.errors.TargetError`.
    """

    name: str
    """The registry name (``TARGETS`` key)."""
    state_dir: Path
    """Where the target keeps its files; ``lbtune.apply`` puts the lock, the last known
    good (``lkg/<name>.json``) and its logs there."""

    def space(self) -> ParameterSpace:
        """The knobs, their ranges, conditions and untuned baseline values (for this
        cluster's replicas: ``per_server`` knobs are expanded)."""
        ...

    def validate(self, params: Mapping[str, object]) -> ParamSet:
        """Check ``params`` against the space and the balancer's own rules, touching
        nothing; return them typed. Out-of-range or unknown knobs: ConfigError; a set the
        balancer would refuse (e.g. knobs another controller owns): RejectedBeforeApply.
        :meth:`apply` calls it first; ``lbtune apply`` calls it before taking the lock."""
        ...

    def read_live(self) -> ParamSet:
        """Every knob of the space as it is live now (read from the balancer itself where
        it can say, else from the target's record of what it last applied), in the format
        :meth:`apply` accepts. ``apply(read_live())`` is a no-op."""
        ...

    def apply(self, params: Mapping[str, object], *, check: bool = False) -> ApplyResult:
        """Make ``params`` live (knobs not given keep their live value) and verify by
        read-back; raise ApplyError when the read-back differs.

        Validates first (:meth:`validate`): a refused set touches nothing. Knobs the
        balancer can change live go through its live API; structural ones reload or
        restart it without dropping requests where the balancer allows
        (``ApplyResult.reloaded``). With nothing to change it touches nothing and returns
        ``changed=False``. With ``check=True`` it touches nothing and returns the diff it
        would apply (``check=True``, ``reloaded`` = would reload).
        """
        ...

    def rollback(self, *, check: bool = False) -> ApplyResult:
        """Re-apply the last known good (:class:`lbtune.targets.lkg.LkgStore` in
        ``state_dir`` under :attr:`name`); ApplyError when none was recorded.
        ``lbtune rollback`` and the failed-apply path of ``lbtune.apply`` call this."""
        ...

    def owned_elsewhere(self) -> frozenset[str]:
        """Knobs another controller sets right now (e.g. the weights while the feedback
        agent runs): their live value may move under lbtune, so ``lbtune.apply`` does not
        hold them to a value in its read-back. Usually ``frozenset()``."""
        ...

    def replicas_out(self, params: ParamSet) -> frozenset[str]:
        """The replicas that the full parameter set ``params`` leaves unable to take a new
        request (weight 0, drained, ...), by :attr:`ReplicaAddress.name`. ``lbtune.apply``
        refuses a set that leaves a served model with none (:mod:`lbtune.apply.serving`);
        :func:`zero_weight_replicas` is the usual answer."""
        ...


def zero_weight_replicas(params: Mapping[str, object], knob: str = "weight") -> frozenset[str]:
    """Replicas whose per-server ``<knob>.<replica>`` is 0 in ``params`` (what "cannot take
    traffic" means for a balancer whose only such knob is a weight)."""
    prefix = knob + "."
    return frozenset(
        k.removeprefix(prefix)
        for k, v in params.items()
        if k.startswith(prefix) and not isinstance(v, bool) and v == 0
    )


# ---------------------------------------------------------------------------------------
# The embedded cluster: what crosses Balancer's hooks.


@dataclass(frozen=True)
class ClusterShape:
    """What :meth:`Balancer.check_cluster` may object to in a cluster YAML."""

    replica_models: tuple[tuple[str, ...], ...]
    """The models of each replica, in order."""
    agent: bool
    """The YAML enables the feedback agent (it needs :attr:`Balancer.live_weights`)."""
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
    """One free port per name in :attr:`Balancer.extra_ports`."""
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
    """What :meth:`Balancer.launch` returns once the balancer is up and healthy.

    Recorded in ``endpoints.json``; :meth:`Balancer.target` gets it back through
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
    """The cluster's process supervisor, as :meth:`Balancer.launch` sees it.

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


@runtime_checkable
class Balancer(Protocol):
    """A registry entry (:data:`lbtune.targets.TARGETS`): a balancer lbtune knows.

    Cheap to construct and stateless: every hook gets what it needs as arguments.
    """

    name: str
    """The registry name, also the cluster YAML's ``balancer:`` value."""
    replica_header: str | None
    """The response header that names the replica which served a request (usually
    :data:`DEFAULT_REPLICA_HEADER`), set by the balancer on every proxied response;
    ``None`` when this balancer cannot set one."""
    live_weights: bool
    """Whether :meth:`weights` works: the balancer takes per-replica weights live (the
    feedback agent needs this; ``agent.enabled`` is refused otherwise)."""
    ansible_module: str
    """The Ansible module in ``lbtune/data/playbooks/library/`` that applies this target on a host
    (``lbtune_<name>``, underscores); ``lbtune/data/playbooks/target-apply.yml`` runs it."""
    extra_ports: tuple[str, ...]
    """Names of loopback ports it needs besides ``port`` and ``metrics_port`` (an admin
    API, an exporter); the cluster picks free ones (:attr:`LaunchSpec.extra_ports`)."""
    test_preset: str
    """A cluster preset (``lbtune/data/clusters/<preset>.yaml``, ``ports: auto``, two replicas) with
    this balancer: what the contract suite starts."""

    def check_cluster(self, shape: ClusterShape) -> str | None:
        """Why this balancer cannot front that cluster (e.g. it does not route by model
        and the replicas serve different models), or ``None``. Called while the cluster
        YAML is validated: the message is shown with the file's name."""
        ...

    def launch(self, spec: LaunchSpec, supervisor: Supervisor) -> BalancerLaunch:
        """Render the balancer's config from ``spec.replicas`` (with the space's
        baseline overlaid by ``spec.params``), check it with the balancer's own
        validator, start it (and any sidecar such as an exporter) through
        ``supervisor``, and wait until it is healthy: every replica reachable through it
        and its ``/health`` (proxied to a replica) answering 200. Raise ClusterError
        (or DependencyError for a missing binary) otherwise; the cluster then stops
        whatever was started."""
        ...

    def scrape_jobs(self, spec: LaunchSpec) -> tuple[ScrapeJob, ...]:
        """The Prometheus jobs that scrape the balancer (the cluster adds the replicas',
        lbtune's and the agent's). The cluster waits until each is up."""
        ...

    def problems(self, endpoints: Endpoints) -> list[str]:
        """What is wrong with the running balancer, one short line each (empty when
        healthy): ``lbtune cluster status`` and ``up`` (on an already running cluster)
        show these. Never raises."""
        ...

    def replica_rows(self, endpoints: Endpoints) -> list[ReplicaRow]:
        """Each replica as the running balancer sees it (status, weight, open requests),
        for ``lbtune cluster status``; empty when the balancer cannot be asked. Never
        raises."""
        ...

    def target(self, endpoints: Endpoints, *, space_file: Path | None = None) -> Target:
        """The running balancer of ``endpoints`` as a :class:`Target` (``space_file``: the
        user's own space instead of the packaged one)."""
        ...

    def weights(self, endpoints: Endpoints) -> LiveWeights:
        """The live-weights interface of the running balancer (the feedback agent's
        actuator); TargetError when :attr:`live_weights` is False."""
        ...
