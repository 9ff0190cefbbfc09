"""What a study's storage holds, read back: its trials, its confirmed winner, the
parameters of one of them (for ``lbtune apply --study``).

Every trial stores the full parameter set it applied (user attribute ``params``: knobs
that do not act under it included, so that what ran can be applied again exactly); what
acts is the space's answer (:meth:`lbtune.targets.space.ParameterSpace.split`), asked when
the trials are read (:func:`collect`). The confirmed winner is a study user attribute
(:data:`WINNER_ATTR`, :func:`record_winner`), written once confirmation and the rollout
are done: the one configuration the report shows, the rollout applied and ``apply
--study`` applies by default.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from lbtune.errors import ConfigError
from lbtune.objective import FIGURES, ObjectiveSpec, feasible
from lbtune.scenario.runplan import RunPlan
from lbtune.search.result import Confirmation, Rollout, TrialResult
from lbtune.search.study import PLAN_ATTR

if TYPE_CHECKING:
    import optuna

    from lbtune.targets.base import ParamSet
    from lbtune.targets.space import ParameterSpace

__all__ = ["WINNER_ATTR", "collect", "record_winner", "stored_params"]

log = logging.getLogger(__name__)

WINNER_ATTR = "winner"
"""Study user attribute: ``{trial, params, verdict, beats, rolled_out, rolled_back}`` of
the confirmed winner, or ``{trial: null, verdict}`` when confirmation confirmed none."""


def collect(
    study: optuna.Study, spec: ObjectiveSpec, space: ParameterSpace | None = None
) -> list[TrialResult]:
    """Every trial of the study as a :class:`TrialResult`, in number order; with the
    ``space``, each knows which of its knobs act (:attr:`TrialResult.folded`)."""
    out = []
    for t in study.get_trials(deepcopy=False):
        ua: Mapping[str, Any] = t.user_attrs
        fig = (
            FIGURES.validate_python(ua["figures"]) if isinstance(ua.get("figures"), dict) else None
        )
        params = dict(ua.get("params") or ua.get("enqueued_params") or dict(t.params))
        out.append(
            TrialResult(
                number=t.number,
                state=t.state.name,
                role=str(ua.get("role", "sampled")),
                params=params,
                objective=ua.get("objective"),
                values=None if t.values is None else tuple(t.values),
                figures=fig,
                feasible=None if fig is None else feasible(fig, spec),
                fail_reason=ua.get("fail_reason"),
                duration_s=ua.get("duration_s"),
                intermediate=dict(t.intermediate_values),
                plan=_plan(ua.get(PLAN_ATTR)),
                folded={} if space is None else space.split(params)[1],
            )
        )
    return out


def _plan(stored: object) -> RunPlan | None:
    """A trial's recorded run plan (None when it has none, or one lbtune cannot read)."""
    if not isinstance(stored, dict):
        return None
    try:
        return RunPlan.model_validate(stored)
    except ValidationError as exc:
        log.debug("trial run plan not read: %s", exc)
        return None


def record_winner(
    study: optuna.Study,
    confirmation: Confirmation | None,
    params: ParamSet | None,
    rollout: Rollout | None,
) -> None:
    """Store the confirmed winner (or that there is none) in the study."""
    if confirmation is None:
        return
    doc: dict[str, Any] = {"trial": confirmation.winner, "verdict": confirmation.verdict}
    if confirmation.winner is not None and params is not None:
        doc.update(
            params=dict(params),
            beats=list(confirmation.winner_beats),
            rolled_out=bool(rollout is not None and rollout.applied),
            rolled_back=bool(rollout is not None and rollout.rolled_back),
        )
    study.set_user_attr(WINNER_ATTR, doc)


def stored_params(study: optuna.Study, which: str) -> tuple[ParamSet, str]:
    """``(params, source)`` of ``which``: ``winner`` (the confirmed winner, as rolled out),
    ``best`` (the search's best trial) or a trial number; each the full set the trial
    applied. ConfigError, one line, when there is no such configuration."""
    name = study.study_name
    if which == "winner":
        doc = study.user_attrs.get(WINNER_ATTR)
        if not isinstance(doc, dict) or doc.get("trial") is None or "params" not in doc:
            verdict = doc.get("verdict") if isinstance(doc, dict) else "not confirmed yet"
            raise ConfigError(
                f"Study {name!r} has no confirmed winner ({verdict}); nothing to apply: pass "
                "--trial best (the search's best, not confirmed) or a trial number"
            )
        return dict(doc["params"]), f"study:{name}#winner({doc['trial']})"
    trials = study.get_trials(deepcopy=False)
    if which == "best":
        try:
            number = study.best_trial.number
        except (ValueError, RuntimeError):
            raise ConfigError(f"Study {name!r} has no completed trial yet") from None
        return _params_of(trials[number]), f"study:{name}#best({number})"
    if not which.isdigit() or int(which) >= len(trials):
        raise ConfigError(
            f"--trial {which!r}: expected winner, best or a trial number 0..{len(trials) - 1}"
        )
    return _params_of(trials[int(which)]), f"study:{name}#{which}"


def _params_of(t: optuna.trial.FrozenTrial) -> ParamSet:
    """The full set a trial applied (its sampled knobs only, for a study from before
    lbtune recorded it)."""
    stored = t.user_attrs.get("params") or t.user_attrs.get("enqueued_params")
    return dict(stored) if isinstance(stored, dict) else dict(t.params)
