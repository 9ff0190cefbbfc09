"""The Optuna study: storage, create or resume, reference trials, and the ask/tell loop.

* Storage is any Optuna RDB URL; the default is SQLite (``reports/studies.db``).
* The reference trials are enqueued first (``study.enqueue_trial``) with a ``role``
  user attribute: ``live`` (what the target runs now, read back), ``round-robin``
  (the space's baseline, equal weights, with the knobs' ``references: {round-robin: ...}``
  values) and ``least-conn`` (the same with their ``least-conn`` values: ``leastconn``,
  ``least_conn``, ``LEAST_REQUEST``, whatever the target spells it) when its space
  declares one. Identical parameter sets are enqueued once.
* A failed trial is told ``FAIL`` with a ``fail_reason`` user attribute and the
  loop goes on. Two failures are re-measured once, inside the same trial (same
  number, one budget slot), before the loop goes on: a failed **trial 0** (the live
  baseline: every verdict is against it) and a measurement the generator marked
  **degraded** (its timing-error bound exceeded). Each re-run is said in one progress
  line and recorded in the ``rerun`` user attribute (why the first attempt did not
  count); the re-run reports no intermediate values to Optuna (the first attempt's
  windows hold them) and is not pruned. A second failure is told ``FAIL``. Every
  finished trial (complete, pruned or failed) counts towards the budget.
* ``recover`` marks trials left ``RUNNING`` by a dead process (same host, PID gone,
  or no owner recorded) as ``FAIL`` with reason ``interrupted``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lbtune.errors import BalancerDown, ConfigError, DependencyError, TrialFailed
from lbtune.objective import (
    FIGURES,
    Figures,
    ObjectiveSpec,
    constraints,
    score,
    values,
)
from lbtune.records.addresses import without_userinfo
from lbtune.records.jsonform import json_data
from lbtune.search.pruning import INTERVAL_ATTR, window_interval, window_value
from lbtune.search.trial import GeneratorBehind, Measurement, TrialRunner

if TYPE_CHECKING:
    import optuna

    from lbtune.targets.base import ParamSet
    from lbtune.targets.space import ParameterSpace, ReferenceRole

log = logging.getLogger(__name__)

SAMPLERS = ("tpe", "gp", "nsga2", "random")
DEFAULT_STORAGE = "sqlite:///reports/studies.db"
FINISHED = ("COMPLETE", "PRUNED", "FAIL")
REFERENCE_ROLES = ("live", "round-robin", "least-conn")
"""The roles of the enqueued reference trials (:func:`reference_trials`)."""
PLAN_ATTR = "run_plan"
"""Trial user attribute: the run plan its measurement ran (:class:`RunPlan`, as JSON)."""


@dataclass(frozen=True)
class LoopEvent:
    """What the loop tells its caller (for the progress display)."""

    kind: str
    """``start`` (a trial begins), ``window`` (an intermediate value), ``end`` (told)."""
    number: int
    done: int
    budget: int
    params: ParamSet
    role: str
    value: float | None = None
    state: str | None = None
    reason: str | None = None


def owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _constraints_func(trial: optuna.trial.FrozenTrial) -> list[float]:
    return [float(c) for c in trial.user_attrs.get("constraints", [1.0])]


def _trial_constraints() -> bool:
    """Optuna >= 5 takes constraints per trial (``Trial.set_constraint``)."""
    import optuna

    return hasattr(optuna.trial.Trial, "set_constraint")


def make_sampler(name: str, seed: int | None, n_startup: int) -> optuna.samplers.BaseSampler:
    """TPE (default), GP (needs torch and scipy), NSGA-II or random, with constraints."""
    import optuna

    s = optuna.samplers
    cf: dict[str, Any] = {} if _trial_constraints() else {"constraints_func": _constraints_func}
    if name == "tpe":
        return s.TPESampler(seed=seed, n_startup_trials=n_startup, multivariate=True, **cf)
    if name == "gp":
        try:
            import scipy  # noqa: F401
            import torch  # noqa: F401
        except ImportError:
            raise DependencyError(
                "--sampler gp needs torch and scipy (pip install torch scipy); or use --sampler tpe"
            ) from None
        return s.GPSampler(seed=seed, n_startup_trials=n_startup, **cf)
    if name == "nsga2":
        return s.NSGAIISampler(seed=seed, **cf)
    if name == "random":
        return s.RandomSampler(seed=seed)
    raise ConfigError(f"Unknown sampler {name!r}. Available: {', '.join(SAMPLERS)}")


def sqlite_dir(storage: str) -> None:
    """Check ``--storage`` before Optuna opens it, one line (ConfigError) for each fault: an
    unreadable RDB URL, an unknown database, a database driver that is not installed; and
    a ``sqlite:///path.db`` whose directory does not exist. Only the default storage's
    directory (``reports/``) is created: a mistyped path must not create directories."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    shown = without_userinfo(storage)  # never print a password
    try:
        url = make_url(storage)
        url.get_dialect().import_dbapi()
    except ImportError as exc:
        raise ConfigError(
            f"--storage {shown}: its database driver is not installed ({exc}); install it, "
            f"or use the default {DEFAULT_STORAGE}"
        ) from None
    except ArgumentError as exc:  # NoSuchModuleError too: an unknown database
        raise ConfigError(
            f"--storage {shown!r}: not a database URL Optuna can open ({exc}); "
            f"e.g. {DEFAULT_STORAGE} or postgresql://user@host/db"
        ) from None
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return
    parent = Path(url.database).parent
    if parent.is_dir():
        return
    if storage == DEFAULT_STORAGE:
        parent.mkdir(parents=True, exist_ok=True)
        return
    raise ConfigError(
        f"--storage {shown}: directory {parent} does not exist; create it first "
        "(lbtune does not create directories for a storage URL)"
    )


def open_study(
    name: str,
    storage: str,
    spec: ObjectiveSpec,
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner,
    *,
    resume: bool,
) -> optuna.Study:
    """Create a new study, or load ``name`` with ``resume``; refuse the other two cases."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sqlite_dir(storage)
    shown = without_userinfo(storage)  # never print a password
    names = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    if resume and name not in names:
        raise ConfigError(
            f"--resume: no study {name!r} in {shown}; "
            f"existing: {', '.join(sorted(names)) or 'none'}"
        )
    if not resume and name in names:
        raise ConfigError(
            f"study {name!r} already exists in {shown}: add --resume to continue it, "
            "or pick another --study name"
        )
    if resume:
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
    return optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=sampler,
        pruner=pruner,
        directions=spec.directions,
    )


def reference_trials(space: ParameterSpace, live: ParamSet) -> list[tuple[str, ParamSet]]:
    """``[(role, params)]``: live, round robin, least-conn where the space declares it
    (:meth:`ParameterSpace.reference`); deduplicated."""
    refs: list[tuple[str, ParamSet]] = [("live", space.complete({}, live))]
    roles: tuple[ReferenceRole, ...] = ("round-robin", "least-conn")
    for name in roles:
        params = space.reference(name)
        if params is not None:
            refs.append((name, params))
    out: list[tuple[str, ParamSet]] = []
    for role, params in refs:
        if all(params != p for _, p in out):
            out.append((role, params))
    return out


def enqueue_references(study: optuna.Study, refs: list[tuple[str, ParamSet]]) -> None:
    for role, params in refs:
        study.enqueue_trial(
            dict(params),
            user_attrs={"role": role, "enqueued_params": dict(params)},
            skip_if_exists=False,
        )


def recover(study: optuna.Study) -> list[int]:
    """Mark trials left RUNNING by a dead process as FAIL; returns their numbers."""
    from optuna.trial import TrialState

    host = socket.gethostname()
    storage = study._storage
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        who = str(t.user_attrs.get("owner", ""))
        h, _, pid = who.partition(":")
        if who and (h != host or (pid.isdigit() and _alive(int(pid)))):
            log.warning("trial %d is RUNNING in %s: left alone", t.number, who)
            continue
        storage.set_trial_user_attr(t._trial_id, "fail_reason", "interrupted: process died")
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        failed.append(t.number)
    return failed


def finished(study: optuna.Study) -> int:
    return sum(t.state.name in FINISHED for t in study.get_trials(deepcopy=False))


@dataclass(frozen=True)
class LoopOptions:
    """How :func:`run_loop` runs: its budget, pruning, stop and what it tells its caller."""

    budget: int
    """Trials to finish in all (the ones the study already holds count)."""
    prune: bool = True
    stop: threading.Event | None = None
    on_event: Callable[[LoopEvent], None] | None = None
    say: Callable[[str], None] = log.info


def run_loop(
    study: optuna.Study,
    space: ParameterSpace,
    runner: TrialRunner,
    spec: ObjectiveSpec,
    loop: LoopOptions,
) -> None:
    """Ask, run, tell until ``loop.budget`` trials finished or ``loop.stop`` is set."""
    from optuna.trial import TrialState

    budget, prune, say = loop.budget, loop.prune, loop.say
    stop = loop.stop or threading.Event()
    emit = loop.on_event or (lambda e: None)
    while not stop.is_set():
        done = finished(study)
        if done >= budget:
            break
        trial = study.ask()
        role = str(trial.user_attrs.get("role", "sampled"))
        base = trial.user_attrs.get("enqueued_params")
        params = space.suggest(trial, base if isinstance(base, dict) else None)
        trial.set_user_attr("params", dict(params))
        trial.set_user_attr("owner", owner())
        n = trial.number
        start = LoopEvent("start", n, done, budget, params, role)
        emit(start)
        on_window = _window_hook(trial, start, spec, prune, emit)

        t0 = time.monotonic()
        try:
            m = _run_with_rerun(runner, trial, params, role, spec, on_window, start, emit, say)
        except (TrialFailed, BalancerDown) as exc:
            trial.set_user_attr("fail_reason", str(exc))
            trial.set_user_attr("duration_s", time.monotonic() - t0)
            study.tell(trial, state=TrialState.FAIL)
            emit(LoopEvent("end", n, done + 1, budget, params, role, state="FAIL", reason=str(exc)))
            if isinstance(exc, BalancerDown):  # every further trial would fail: stop, resumable
                raise
            continue
        trial.set_user_attr("duration_s", time.monotonic() - t0)
        if isinstance(m.extra.get("timing"), dict):
            trial.set_user_attr("timing", m.extra["timing"])
        if m.plan is not None:
            trial.set_user_attr(PLAN_ATTR, m.plan.model_dump(mode="json", by_alias=True))
        if m.stopped:
            state, reason = _stopped(stop)
            if reason:
                trial.set_user_attr("fail_reason", reason)
            study.tell(trial, state=state)
            emit(
                LoopEvent("end", n, done + 1, budget, params, role, state=state.name, reason=reason)
            )
            continue
        _tell(study, trial, m, spec)
        emit(
            LoopEvent(
                "end",
                n,
                done + 1,
                budget,
                params,
                role,
                state="COMPLETE",
                value=trial_objective(m, spec),
            )
        )


def _run_with_rerun(
    runner: TrialRunner,
    trial: Any,
    params: ParamSet,
    role: str,
    spec: ObjectiveSpec,
    on_window: Callable[[int, Figures], bool],
    start: LoopEvent,
    emit: Callable[[LoopEvent], None],
    say: Callable[[str], None],
) -> Measurement:
    """One measurement; re-measured once when trial 0 failed or the generator was degraded."""
    label = f"trial-{trial.number:04d}"
    try:
        return runner.run(params, label, on_window)
    except TrialFailed as exc:
        if isinstance(exc, GeneratorBehind):
            why = f"the measurement is not trusted ({exc})"
        elif role == "live":
            why = f"the {role} baseline failed ({exc}), and every verdict is against it"
        else:
            raise
        say(f"trial {trial.number}: {why}; re-running it once")
        trial.set_user_attr("rerun", str(exc))

    def show(step: int, fig: Figures) -> bool:  # progress only: not reported, not pruned
        if spec.kind != "capacity":
            emit(replace(start, kind="window", value=window_value(fig, spec)))
        return False

    return runner.run(params, f"{label}-rerun", show)


def _window_hook(
    trial: Any,
    start: LoopEvent,
    spec: ObjectiveSpec,
    prune: bool,
    emit: Callable[[LoopEvent], None],
) -> Callable[[int, Figures], bool]:
    """Report each window's score (and its interval) to Optuna; True when the pruner says
    stop."""
    intervals: dict[str, list[float]] = {}

    def on_window(step: int, fig: Figures) -> bool:
        if spec.kind == "capacity":  # scored on the whole window only: no partial value
            return False
        value = window_value(fig, spec)
        emit(replace(start, kind="window", value=value))
        if spec.kind != "composite":
            return False
        ci = window_interval(fig, spec)
        if ci is not None:
            intervals[str(step)] = [ci[0], ci[1]]
            trial.set_user_attr(INTERVAL_ATTR, dict(intervals))
        trial.report(value, step)
        return prune and bool(trial.should_prune())

    return on_window


def _stopped(stop: threading.Event) -> tuple[Any, str | None]:
    from optuna.trial import TrialState

    if stop.is_set():
        return TrialState.FAIL, "interrupted by the user"
    return TrialState.PRUNED, None


def trial_objective(m: Measurement, spec: ObjectiveSpec) -> float | None:
    return None if m.figures is None else score(m.figures, spec)


def _tell(study: optuna.Study, trial: Any, m: Measurement, spec: ObjectiveSpec) -> None:
    assert m.figures is not None
    trial.set_user_attr("figures", json_data(FIGURES, m.figures))
    cons = constraints(m.figures, spec)
    trial.set_user_attr("constraints", cons)
    if _trial_constraints():
        trial.set_constraint("error_rate", cons[0])
    trial.set_user_attr("objective", trial_objective(m, spec))
    study.tell(trial, values(m.figures, spec))
