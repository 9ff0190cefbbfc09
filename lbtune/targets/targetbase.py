"""The two bases a balancer subclasses: :class:`TargetBase` and :class:`BalancerBase`.

Like Optuna's ``BaseSampler``, each is the contract itself: what every balancer must say
is abstract, and the usual answers are defaults, so that a policy the balancers share is
written once, here:

* **what the balancer accepts** — :meth:`TargetBase.limits`, the balancer's own knobs and
  ranges whatever space file the target was made with: every apply is checked against
  it before anything is touched, and every state the target reads or records is a full
  set of its knobs, so a recorded state is restorable whatever space recorded it;
* **rollback** — re-apply the last known good (:class:`~lbtune.targets.lkg.LkgStore`);
* **who owns the weights** — while the cluster's feedback agent pushes weights
  (:func:`lbtune.agent.config.owns_weights` on the target's :attr:`~TargetBase.agent_settings`),
  the ``weight.*`` knobs are fixed in the space, refused alone, dropped from a larger set
  and not held to a value by any read-back;
* **who is out** — a replica whose ``weight.*`` is 0 takes no new request
  (:func:`~lbtune.targets.base.zero_weight_replicas`);
* **read-back** — every knob compared with what was applied, one line per difference;
* **no live weights** — :meth:`BalancerBase.weights` refuses, for a balancer that has none.

Everything that crosses these hooks is a record of :mod:`lbtune.targets.base`.
"""

from __future__ import annotations

import importlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from lbtune.agent.config import owns_weights
from lbtune.errors import ApplyError, ConfigError, TargetError
from lbtune.metrics.promql import BalancerSeries
from lbtune.targets.base import (
    DEFAULT_REPLICA_HEADER,
    ApplyResult,
    BalancerLaunch,
    ClusterShape,
    LaunchSpec,
    LiveWeights,
    ParamSet,
    RejectedBeforeApply,
    ReplicaRow,
    ScrapeJob,
    Supervisor,
    mismatches,
    zero_weight_replicas,
)
from lbtune.targets.lkg import LkgStore
from lbtune.targets.space import ParameterSpace

if TYPE_CHECKING:
    from lbtune.records.endpoints import Endpoints
    from lbtune.twin.replica import TwinReplica
    from lbtune.twin.routing import Knobs, RoutingModel

__all__ = ["WEIGHT_PREFIX", "BalancerBase", "TargetBase"]

log = logging.getLogger(__name__)

WEIGHT_PREFIX = "weight."
"""The per-replica weight knobs (``weight.<replica>``): what the feedback agent drives."""


class TargetBase(ABC):
    """One running balancer, as something lbtune can tune (made by
    :meth:`BalancerBase.target`).

    Required: :meth:`replica_names`, :meth:`read_live` and :meth:`apply`; and the
    attributes :attr:`name`, :attr:`state_dir`, :attr:`space_file` (set in ``__init__``;
    :attr:`agent_settings` too where the balancer takes live weights). The rest are the
    usual answers; override one only where the balancer differs.

    Every method may be called from any process (the optimizer, ``lbtune apply``, the
    Ansible module on the balancer's host): whatever a method needs to know lives in what
    the target was made from or in ``state_dir``.

    Errors: a value the user can fix (unknown knob, out of range) is a
    :class:`~lbtune.errors.ConfigError`; a balancer that refused a new state before
    anything changed is :class:`~lbtune.targets.base.RejectedBeforeApply`; a failure after
    the balancer was touched is :class:`~lbtune.errors.ApplyError` (``lbtune.apply`` then
    calls :meth:`rollback`); an unreachable balancer is :class:`~lbtune.errors.TargetError`.
    """

    name: ClassVar[str]
    """The registry name (``TARGETS`` key)."""
    state_dir: Path
    """Where the target keeps its files; ``lbtune.apply`` puts the lock, the last known
    good (``lkg/<name>.json``) and its logs there."""
    space_file: Path
    """The space this target loads (its packaged ``space.yaml`` or the user's own): what
    a study searches and what a request (``lbtune apply``) may ask for."""
    packaged_space: ClassVar[Path | None] = None
    """The balancer's own space file (``lbtune/targets/<name>/space.yaml``): its knobs and
    the values it accepts (:meth:`limits`). ``None`` only for a test fake, whose
    :meth:`space` is then all it knows."""
    agent_settings: Path | None = None
    """The feedback agent's settings file when the cluster runs the agent
    (``Endpoints.agent_config``); ``None``: no agent, lbtune owns every knob."""

    _space: ParameterSpace | None = None
    _limits: ParameterSpace | None = None
    _warned_owned: bool = False

    # -- required -----------------------------------------------------------------------

    @abstractmethod
    def replica_names(self) -> list[str] | None:
        """The replicas ``per_server`` knobs expand over (:attr:`ReplicaAddress.name`), or
        ``None`` when the balancer has no per-replica knob."""

    @abstractmethod
    def read_live(self) -> ParamSet:
        """Every knob of the balancer (:meth:`limits`, not only the space's) as it is live
        now (read from the balancer itself where it can say, else from the target's record
        of what it last applied), in the format :meth:`apply` accepts.
        ``apply(read_live())`` is a no-op."""

    @abstractmethod
    def apply(self, params: Mapping[str, object], *, check: bool = False) -> ApplyResult:
        """Make ``params`` live (knobs not given keep their live value) and verify by
        read-back; raise ApplyError when the read-back differs.

        Validates first (:meth:`validate`, against :meth:`limits`: any state the balancer
        accepts, whatever the space): a refused set touches nothing. Knobs the
        balancer can change live go through its live API; structural ones reload or
        restart it without dropping requests where the balancer allows
        (``ApplyResult.reloaded``). With nothing to change it touches nothing and returns
        ``changed=False``. With ``check=True`` it touches nothing and returns the diff it
        would apply (``check=True``, ``reloaded`` = would reload).
        :class:`~lbtune.targets.base.Plan` builds both results.
        """

    # -- the space ----------------------------------------------------------------------

    def space(self) -> ParameterSpace:
        """The knobs, their ranges, conditions and untuned baseline values, for this
        cluster's replicas; knobs nobody acts on now (:meth:`idle_knobs`) are fixed and
        idle (inactive: :meth:`ParameterSpace.is_active`), so a study does not search
        noise nor show it. Loaded once per target."""
        if self._space is None:
            space = ParameterSpace.load(self.space_file, replicas=self.replica_names())
            idle = self.idle_knobs()
            if idle:
                fixed = {
                    n: s.model_copy(update={"fixed": True}) if n.startswith(idle) else s
                    for n, s in space.params.items()
                }
                names = [n for n in space.params if n.startswith(idle)]
                space = ParameterSpace(space.target, fixed, space.source, idle=names)
            self._space = space
        return self._space

    def idle_knobs(self) -> tuple[str, ...]:
        """Prefixes of the knobs to fix in the space: the weights while the agent owns them."""
        return (WEIGHT_PREFIX,) if self.agent_owns_weights() else ()

    def limits(self) -> ParameterSpace:
        """Every knob this balancer has and the values it accepts, for this cluster's
        replicas: its packaged space (:attr:`packaged_space`), whatever space file the
        target was made with. A user's space may search less, never more: an apply is
        checked against this before anything is touched, and :meth:`read_live` and every
        recorded state (the last known good) hold a full set of these knobs. Loaded once."""
        if self._limits is None:
            if self.packaged_space is None:
                return self.space()
            self._limits = ParameterSpace.load(self.packaged_space, self.replica_names())
        return self._limits

    def validate(self, params: Mapping[str, object]) -> ParamSet:
        """Check ``params`` against what the balancer accepts (:meth:`limits`), touching
        nothing; return them typed.

        Unknown knobs or values the balancer does not accept: ConfigError (also when the
        space file allows them). Knobs another controller owns (:meth:`owned_elsewhere`):
        a set of nothing else is refused (RejectedBeforeApply); in a larger set they are
        dropped, with a warning. :meth:`apply` calls it first; ``lbtune apply`` calls it
        before taking the lock. The user's space (:meth:`space`) bounds what a *request*
        may ask (``lbtune.apply.apply_params`` and the study check that); a recorded state
        (a last known good, the state before a failed apply) is checked here only, so it
        can always be put back.
        """
        try:
            checked = self.limits().validate(params)
        except ConfigError as exc:
            raise ConfigError(
                f"{self.name} does not accept this (nothing was touched): {exc}"
            ) from None
        owned = self.owned_elsewhere()
        given = [k for k in checked if k in owned]
        if not given:
            return checked
        if len(given) == len(checked):
            raise RejectedBeforeApply(
                f"{', '.join(given)}: the feedback agent owns the per-server weights of this "
                f"cluster (agent.enabled in its cluster YAML; settings {self.agent_settings}); "
                "tune the other knobs instead, or run the cluster without the agent"
            )
        if not self._warned_owned:
            self._warned_owned = True
            log.warning(
                "ignoring %s: the feedback agent owns the per-server weights of this cluster",
                ", ".join(given),
            )
        return {k: v for k, v in checked.items() if k not in owned}

    # -- who owns what ------------------------------------------------------------------

    def agent_owns_weights(self) -> bool:
        """The cluster's feedback agent pushes the per-replica weights now (it runs and is
        not observe-only): the one rule every target with live weights follows."""
        return owns_weights(self.agent_settings)

    def owned_elsewhere(self) -> frozenset[str]:
        """Knobs another controller sets right now (the weights while the feedback agent
        runs): their live value may move under lbtune, so no read-back holds them to a
        value and :meth:`validate` drops them."""
        if not self.agent_owns_weights():
            return frozenset()
        return frozenset(n for n in self.limits().params if n.startswith(WEIGHT_PREFIX))

    def replicas_out(self, params: ParamSet) -> frozenset[str]:
        """The replicas that the full parameter set ``params`` leaves unable to take a new
        request, by :attr:`ReplicaAddress.name`: weight 0 (none while the agent owns the
        weights: they are its to set). ``lbtune.apply`` refuses a set that leaves a served
        model with none (:mod:`lbtune.apply.serving`)."""
        return frozenset() if self.agent_owns_weights() else zero_weight_replicas(params)

    # -- read-back and rollback ---------------------------------------------------------

    def mismatches(self, desired: ParamSet, live: ParamSet) -> list[str]:
        """One line per knob of ``desired`` that ``live`` does not hold, owned knobs
        (:meth:`owned_elsewhere`) left out."""
        return mismatches(desired, live, skip=self.owned_elsewhere())

    def read_back(self, desired: ParamSet, also: Callable[[], list[str]] | None = None) -> ParamSet:
        """What is live now; ApplyError naming the knobs that are not what was applied
        (and what ``also`` finds amiss beyond the knobs, one line each)."""
        live = self.read_live()
        bad = self.mismatches(desired, live) + (also() if also is not None else [])
        if bad:
            raise ApplyError("Read-back does not match what was applied: " + "; ".join(bad[:5]))
        return live

    def rollback(self, *, check: bool = False) -> ApplyResult:
        """Re-apply the last known good (:class:`~lbtune.targets.lkg.LkgStore` in
        :attr:`state_dir` under :attr:`name`); ApplyError when none was recorded.
        ``lbtune rollback`` and the failed-apply path of ``lbtune.apply`` call this."""
        lkg = LkgStore(self.state_dir, self.name).get()
        if lkg is None:
            raise ApplyError(f"No last known good recorded for {self.name} in {self.state_dir}")
        return self.apply(lkg.params, check=check)


class BalancerBase(ABC):
    """A registry entry (:data:`lbtune.targets.TARGETS`): a balancer lbtune knows.

    Cheap to construct and stateless: every hook gets what it needs as arguments.
    Required: :meth:`launch`, :meth:`scrape_jobs`, :meth:`problems`, :meth:`target`, and
    the attributes :attr:`name`, :attr:`ansible_module`, :attr:`test_preset`.
    """

    name: ClassVar[str]
    """The registry name, also the cluster YAML's ``balancer:`` value."""
    ansible_module: ClassVar[str]
    """The Ansible module in ``lbtune/data/playbooks/library/`` that applies this target on
    a host (``lbtune_<name>``, underscores); ``lbtune/data/playbooks/target-apply.yml``
    runs it."""
    test_preset: ClassVar[str]
    """A cluster preset (``lbtune/data/clusters/<preset>.yaml``, ``ports: auto``, two
    replicas) with this balancer: what the contract suite starts."""
    replica_header: ClassVar[str | None] = DEFAULT_REPLICA_HEADER
    """The response header that names the replica which served a request, set by the
    balancer on every proxied response; ``None`` when this balancer cannot set one."""
    live_weights: ClassVar[bool] = False
    """Whether :meth:`weights` works: the balancer takes per-replica weights live (the
    feedback agent needs this; ``agent.enabled`` is refused otherwise)."""
    extra_ports: ClassVar[tuple[str, ...]] = ()
    """Names of loopback ports it needs besides ``port`` and ``metrics_port`` (an admin
    API, an exporter); the cluster picks free ones (:attr:`LaunchSpec.extra_ports`)."""

    @abstractmethod
    def launch(self, spec: LaunchSpec, supervisor: Supervisor) -> BalancerLaunch:
        """Render the balancer's config from ``spec.replicas`` (with the space's
        baseline overlaid by ``spec.params``), check it with the balancer's own
        validator, start it (and any sidecar such as an exporter) through
        ``supervisor``, and wait until it is healthy: every replica reachable through it
        and its ``/health`` (proxied to a replica) answering 200. Raise ClusterError
        (or DependencyError for a missing binary) otherwise; the cluster then stops
        whatever was started."""

    @abstractmethod
    def scrape_jobs(self, spec: LaunchSpec) -> tuple[ScrapeJob, ...]:
        """The Prometheus jobs that scrape the balancer (the cluster adds the replicas',
        lbtune's and the agent's). The cluster waits until each is up."""

    @abstractmethod
    def problems(self, endpoints: Endpoints) -> list[str]:
        """What is wrong with the running balancer, one short line each (empty when
        healthy): ``lbtune cluster status`` and ``up`` (on an already running cluster)
        show these. Never raises."""

    @abstractmethod
    def target(self, endpoints: Endpoints, *, space_file: Path | None = None) -> TargetBase:
        """The running balancer of ``endpoints`` as a :class:`TargetBase` (``space_file``:
        the user's own space instead of the packaged one)."""

    def check_cluster(self, shape: ClusterShape) -> str | None:
        """Why this balancer cannot front that cluster (e.g. it does not route by model
        and the replicas serve different models), or ``None`` (the default: any cluster).
        Called while the cluster YAML is validated: the message is shown with the file's
        name."""
        return None

    def replica_rows(self, endpoints: Endpoints) -> list[ReplicaRow]:
        """Each replica as the running balancer sees it (status, weight, open requests),
        for ``lbtune cluster status``; empty (the default) when the balancer cannot be
        asked. Never raises."""
        return []

    def series(self, endpoints: Endpoints) -> BalancerSeries:
        """Which of the balancer's own Prometheus series give the run summary's
        ``balancer`` section (per-pool queue, per-server open requests and responses);
        the default names none (the section is then empty, but there)."""
        return BalancerSeries(self.name)

    def weights(self, endpoints: Endpoints) -> LiveWeights:
        """The live-weights interface of the running balancer (the feedback agent's
        actuator); the default, for a balancer without :attr:`live_weights`, refuses."""
        raise TargetError(
            f"{self.name} takes no per-replica weights live (no live weights API): the "
            "feedback agent needs a balancer that does"
        )

    def routing_model(
        self, params: Knobs, replicas: Sequence[TwinReplica], seed: int = 0
    ) -> RoutingModel:
        """This balancer's routing in the virtual-time twin (:mod:`lbtune.twin`) for the full
        parameter set ``params`` over ``replicas``. The default calls ``routing_model`` of
        the ``twin`` module of the balancer's own package (``lbtune/targets/<name>/twin.py``),
        so a new balancer brings its model with it; ConfigError when it has none."""
        package = type(self).__module__.rpartition(".")[0]
        try:
            module = importlib.import_module(package + ".twin")
        except ModuleNotFoundError as exc:
            if exc.name != package + ".twin":
                raise
            module = None
        factory = getattr(module, "routing_model", None)
        if factory is None:
            raise ConfigError(f"the twin has no model of {self.name}")
        model: RoutingModel = factory(params, replicas, seed=seed)
        return model
