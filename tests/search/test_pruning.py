"""The pruner: never on the warm-up windows, and only when a trial's interval is clear of
the median (pure: an in-memory Optuna study)."""

from __future__ import annotations

import optuna
import pytest

from lbtune.objective import Figures, ObjectiveSpec, composite_interval
from lbtune.search.pruning import (
    INTERVAL_ATTR,
    WARMUP_WINDOWS,
    make_pruner,
    should_prune,
    window_value,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _study(
    n_done: int = 5, score: float = 1.0, warmup_windows: int = WARMUP_WINDOWS
) -> optuna.Study:
    pruner = make_pruner("median", n_references=3, warmup_windows=warmup_windows)
    study = optuna.create_study(pruner=pruner)
    for _ in range(n_done):
        t = study.ask()
        for step in (1, 2, 3):
            t.report(score, step)
        study.tell(t, score)
    return study


def _report(trial: optuna.Trial, step: int, value: float, ci: tuple[float, float] | None) -> bool:
    if ci is not None:
        found = dict(trial.user_attrs.get(INTERVAL_ATTR, {}))
        found[str(step)] = list(ci)
        trial.set_user_attr(INTERVAL_ATTR, found)
    trial.report(value, step)
    return trial.should_prune()


def test_the_first_window_is_never_pruned() -> None:
    trial = _study().ask()
    assert not _report(trial, 1, 50.0, None)  # window 1: the warm-up, however bad
    assert _report(trial, 2, 50.0, None)


def test_more_warmup_windows_protect_more() -> None:
    trial = _study(warmup_windows=2).ask()
    assert not _report(trial, 1, 50.0, None)
    assert not _report(trial, 2, 50.0, None)
    assert _report(trial, 3, 50.0, None)


def test_no_pruning_before_the_references_and_two_trials_completed() -> None:
    trial = _study(n_done=4).ask()  # 3 references + 2 needed
    assert not _report(trial, 2, 50.0, None)


def test_an_interval_that_reaches_the_median_is_not_pruned() -> None:
    study = _study()
    wide = study.ask()
    assert not _report(wide, 2, 1.5, (0.9, 2.4))  # worse point, but the median is inside
    narrow = study.ask()
    assert _report(narrow, 2, 1.5, (1.2, 1.8))


def test_should_prune_rule() -> None:
    assert should_prune(1.1, [1.0, 0.5, 2.0])
    assert not should_prune(1.0, [1.0, 0.5, 2.0])
    assert not should_prune(9.0, [])


def test_score_interval_brackets_the_score() -> None:
    spec = ObjectiveSpec()
    fig = Figures(1.0, 0.3, p99_e2e_ci=(0.8, 1.4), p99_ttft_ci=(0.25, 0.5))
    ci = composite_interval(fig, spec)
    assert ci is not None
    lo, hi = ci
    assert lo < window_value(fig, spec) < hi
    assert composite_interval(Figures(1.0, 0.3), spec) is None


def test_figures_with_intervals_round_trip_through_json() -> None:
    import json

    from lbtune.objective import FIGURES
    from lbtune.records.jsonform import json_data

    fig = Figures(1.0, 0.3, p99_e2e_ci=(0.8, 1.4), p99_ttft_ci=(0.25, 0.5), samples=120)
    back = FIGURES.validate_python(json.loads(json.dumps(json_data(FIGURES, fig))))
    assert back == fig
    assert FIGURES.validate_python({"p99_e2e_s": 1.0, "p99_ttft_s": 0.3}).p99_e2e_ci is None


@pytest.mark.parametrize("name", ["none"])
def test_none_never_prunes(name: str) -> None:
    study = optuna.create_study(pruner=make_pruner(name, n_references=0))
    trial = study.ask()
    assert not _report(trial, 5, 1e9, None)
