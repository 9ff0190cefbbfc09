"""The knobs' importances of a study: PED-ANOVA over the composite score (fast, no
scikit-learn), for the study's report."""

from __future__ import annotations

import logging
import warnings
from typing import Any

__all__ = ["importances"]

log = logging.getLogger(__name__)


def importances(study: Any) -> dict[str, float]:
    """PED-ANOVA importances of the composite score (fast, no scikit-learn); {} if too few."""
    import optuna

    done = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if len(done) < 4:
        return {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = optuna.importance.get_param_importances(
                study,
                evaluator=optuna.importance.PedAnovaImportanceEvaluator(),
                target=lambda t: float(t.user_attrs.get("objective", float("nan"))),
            )
        return {k: float(v) for k, v in found.items()}
    except (ValueError, RuntimeError, ZeroDivisionError) as exc:
        log.debug("importances not computed: %s", exc)
        return {}
