"""Screening: a study's first stage in the virtual-time twin.

``lbtune optimize --screen N`` runs N virtual trials of the study's own space, scenario
and objective on the running cluster's twin (:mod:`lbtune.cluster.twin`), with Optuna as
the live stage uses it, over a window :data:`WINDOW_FACTOR` times the live trial's (so the
twin's P99s rest on thousands of requests). It starts with every structural choice (each
algorithm, each scheduler mode) at its defaults, then Optuna's draws. The best few
diverse configs (the best of each algorithm first) are enqueued in the live study as
ordinary trials (role ``screened``); the live budget then holds the references, those,
and Optuna's own picks, then today's paired confirmation. After the search every
completed live trial is set beside the twin's prediction of it
(:class:`~lbtune.search.result.Screening`: the scores, P99 E2E, req/s and the rank
agreement).

The live path is never blocked by the twin: a cluster the twin cannot simulate or a twin
failure leaves a note and the study goes on live-only.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from lbtune.cluster.twin import TwinCluster, drop_inactive, running_twin
from lbtune.errors import ConfigError, LbtuneError
from lbtune.objective import ObjectiveSpec, feasible
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions
from lbtune.scenario.runplan import RunPlan
from lbtune.search.result import Screening, TrialResult, TwinPrediction
from lbtune.search.study import make_sampler
from lbtune.targets.params import ParamSet
from lbtune.targets.space import ParameterSpace
from lbtune.tune.options import objective_spec
from lbtune.tune.virtual import Predicted, VirtualBench
from lbtune.twin.fitted import TwinProfile
from lbtune.twin.requests import check_twinnable

__all__ = [
    "DEFAULT_SCREEN",
    "SCREEN_SHARE",
    "SCREEN_TOP",
    "WINDOW_FACTOR",
    "ScreenRequest",
    "Screener",
    "live_picks",
    "spearman",
    "start_screen",
]

log = logging.getLogger(__name__)

DEFAULT_SCREEN = 100
"""Virtual trials when ``--screen`` is not given and the twin models the cluster."""
SCREEN_TOP = 3
"""Screened configs sent live at least (fewer only when the live budget has no room)."""
SCREEN_SHARE = 0.6
"""...and up to this share of the live room, rounded up (a budget of ten: five screened,
three of Optuna's own). Optuna's live picks in a small budget are its random start-up
draws: they found two winners the twin had ranked low, and in one study two of five
scored worse than round robin. The twin's order agrees with the live one (Spearman
0.88-0.99 over whole studies), so its next best are the better bets for most of the room."""
SCREEN_SPREAD = 1.25
"""Another algorithm's best goes live ahead of the next best config only when the twin
scores it within this factor of the best: diversity hedges the twin's errors (P99 E2E
within 0-14 % per trial), not a config it predicts far behind."""
WINDOW_FACTOR = 4.0
"""A virtual trial runs this many times the live trial's duration."""
DEFAULTS_SHARE = 4
"""The screen starts with every structural choice at its defaults
(:meth:`~lbtune.targets.space.ParameterSpace.choice_defaults`: each algorithm, each mode
of the ``llm`` scheduler, ...) when they are at most 1/this of the screen. Without them
TPE's draws left whole algorithms unseen: in a 100-config screen of ``mixed`` on
``hetero4`` the ``llm`` scheduler's ``predict`` mode at its defaults, which the twin puts
at 0.33× round robin's P99 E2E, was never tried and the best screened was 0.44×."""
ROLE = "screened"


@dataclass(frozen=True)
class ScreenRequest:
    """What the screening stage runs with."""

    n: int | None
    """Virtual trials; ``None``: :data:`DEFAULT_SCREEN`; 0: no screening."""
    state_dir: Path | None
    """The running cluster's state directory (its recorded config is the twin's)."""
    trials: StressOptions
    """The live trials' options, their plan made (:func:`lbtune.tune.harness.plan_trials`)."""
    seed: int | None = None
    live_room: int = SCREEN_TOP
    """Live trials the budget leaves after the references."""
    target: str | None = None
    """The tuned balancer: the twin screens only when the cluster runs that one."""
    profile: TwinProfile | None = None
    """A fitted profile (trusted already): the replicas it fitted are simulated from it."""


class Screener:
    """The screening stage's result and what the study does with it."""

    def __init__(
        self, tc: TwinCluster, plan: RunPlan, spec: ObjectiveSpec, live: RunPlan | None = None
    ) -> None:
        self.tc, self.plan, self.spec = tc, plan, spec
        self.live_plan = live or plan
        """The live trials' plan: their predictions run it (the same window as measured)."""
        self.picked: list[Predicted] = []
        self.screened = 0
        self.cpu_s = 0.0
        self.wall_s = 0.0

    def bench(self, plan: RunPlan | None = None) -> VirtualBench:
        return VirtualBench(self.tc, plan or self.plan, self.spec)

    def twin_params(self, params: ParamSet) -> ParamSet:
        return drop_inactive(self.tc, params)[0]

    def enqueue(self, study: Any) -> None:
        """The picked configs as ordinary live trials, after the references."""
        for p in self.picked:
            study.enqueue_trial(
                dict(p.params),
                user_attrs={"role": ROLE, "enqueued_params": dict(p.params)},
                skip_if_exists=False,
            )

    def compare(self, trials: Sequence[TrialResult], say: Callable[[str], None]) -> Screening:
        """Every completed live trial beside the twin's prediction of it: its config simulated
        on the live trials' own plan (the same window, not the screen's longer one)."""
        done = [t for t in trials if t.state == "COMPLETE" and t.figures is not None]
        try:
            with self.bench(self.live_plan) as bench:
                predicted = bench.run([self.twin_params(t.params) for t in done])
        except Exception as exc:  # the twin never blocks the live result
            log.debug("twin predictions failed", exc_info=True)
            return self.result((), f"the twin's predictions failed ({exc}); live figures only")
        rows = tuple(_row(t, p) for t, p in zip(done, predicted, strict=True))
        out = self.result(rows)
        for line in describe(out):
            say(line)
        return out

    def result(self, rows: tuple[TwinPrediction, ...], note: str = "") -> Screening:
        pairs = [
            (r.predicted, r.measured)
            for r in rows
            if r.predicted is not None and r.measured is not None
        ]
        rho = spearman([a for a, _ in pairs], [b for _, b in pairs]) if len(pairs) >= 3 else None
        return Screening(
            screened=self.screened,
            sent_live=len(self.picked),
            window_s=self.plan.load.duration_s,
            live_window_s=self.live_plan.load.duration_s,
            cpu_s=self.cpu_s,
            wall_s=self.wall_s,
            rows=rows,
            rank_corr=rho,
            note=note,
        )


def _row(t: TrialResult, p: Predicted) -> TwinPrediction:
    live, twin = t.figures, p.figures
    return TwinPrediction(
        trial=t.number,
        role=t.role,
        predicted=p.score,
        measured=t.objective,
        predicted_p99_e2e_s=None if twin is None else twin.p99_e2e_s,
        measured_p99_e2e_s=None if live is None else live.p99_e2e_s,
        predicted_rps=None if twin is None else twin.requests_per_s,
        measured_rps=None if live is None else live.requests_per_s,
    )


def describe(s: Screening) -> list[str]:
    """What the terminal says of a screening: how many configs, and twin against live."""
    lines = [
        f"the twin screened {s.screened} configs ({s.window_s:g} virtual s each) in "
        f"{s.wall_s:.0f} s; {s.sent_live} went live; every live trial beside the twin's "
        f"prediction of it ({s.live_window_s:g} virtual s, as measured):"
    ]
    for r in s.rows:
        if r.predicted is None or r.measured is None:
            continue
        lines.append(
            f"  trial {r.trial} ({r.role}): score twin {r.predicted:.3f} live {r.measured:.3f}"
            + _pair(" P99 E2E", r.predicted_p99_e2e_s, r.measured_p99_e2e_s, "s")
            + _pair(" req/s", r.predicted_rps, r.measured_rps, "")
        )
    if s.rank_corr is not None:
        lines.append(f"  rank agreement (Spearman, twin vs live scores): {s.rank_corr:.2f}")
    if s.note:
        lines.append(s.note)
    return lines


def _pair(label: str, twin: float | None, live: float | None, unit: str) -> str:
    if twin is None or live is None:
        return ""
    return f";{label} twin {twin:.2f}{unit} live {live:.2f}{unit}"


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); ``None`` when a side is
    constant or there are fewer than two pairs."""

    def ranks(x: Sequence[float]) -> np.ndarray[Any, np.dtype[np.float64]]:
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in set(x):
            idx = [i for i, y in enumerate(x) if y == v]
            r[idx] = float(np.mean(r[idx]))
        return r

    if len(a) < 2:
        return None
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def start_screen(
    req: ScreenRequest,
    space: ParameterSpace,
    known: Sequence[ParamSet],
    spec: ObjectiveSpec,
    say: Callable[[str], None],
) -> tuple[Screener | None, str | None]:
    """Run the screening stage: the screener (``None`` when off) and a note for the report
    when it was off or failed (the study then goes on live-only). ``known`` are the
    references the live study runs anyway (never picked again)."""
    if req.n == 0 or req.state_dir is None:
        return None, None
    try:
        assert req.trials.plan is not None
        check_twinnable(req.trials.plan)
        tc = running_twin(req.state_dir, req.profile)
        if req.target is not None and tc.balancer != req.target:
            raise ConfigError(f"the cluster runs {tc.balancer}, the target is {req.target}")
        assert req.trials.plan is not None
        seconds = req.trials.plan.load.shape_duration_s * WINDOW_FACTOR
        plan = plan_run(replace(req.trials, duration_s=seconds, plan=None))
        if spec.kind == "pareto":  # the twin ranks by one score: the composite
            spec = objective_spec("composite", plan.slo_value(), None)
        sc = Screener(tc, plan, spec, req.trials.plan)
        tc.routing(sc.twin_params(space.baseline()))  # no model: one line, before any work
    except LbtuneError as exc:
        note = f"no screening: {exc}; the search is live-only"
        say(note)
        return None, note
    n = req.n if req.n is not None else DEFAULT_SCREEN
    say(f"screening {n} configs in the twin ({plan.load.duration_s:g} virtual s each)")
    try:
        ranked = _search(sc, space, n, req.seed)
    except Exception as exc:  # the live path is never blocked by the twin
        log.debug("screening failed", exc_info=True)
        note = f"screening failed ({exc}); the search is live-only"
        say(note)
        return None, note
    sc.picked = pick_diverse(ranked, spec, known, live_picks(req.live_room))
    return sc, None


def _search(sc: Screener, space: ParameterSpace, n: int, seed: int | None) -> list[Predicted]:
    """``n`` virtual trials, asked of Optuna in batches of two per worker; all results,
    best score first."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=make_sampler("tpe", seed, n_startup=min(20, n // 4 + 1)))
    defaults = space.choice_defaults()
    if len(defaults) <= n // DEFAULTS_SHARE:
        for params in defaults:
            study.enqueue_trial(dict(params))
    t0, cpu0 = time.monotonic(), time.process_time()
    out: list[Predicted] = []
    with sc.bench() as bench:
        while len(out) < n:
            asked = [study.ask() for _ in range(min(2 * bench.workers, n - len(out)))]
            batch = [space.suggest(t) for t in asked]
            results = bench.run([sc.twin_params(p) for p in batch])
            for trial, params, p in zip(asked, batch, results, strict=True):
                p = replace(p, params=params)
                out.append(p)
                bad = p.score is None or p.figures is None or not feasible(p.figures, sc.spec)
                study.tell(trial, float("inf") if bad or p.score is None else p.score)
            sc.cpu_s += sum(p.cpu_s for p in results)
    sc.screened, sc.wall_s = len(out), time.monotonic() - t0
    sc.cpu_s = max(sc.cpu_s, time.process_time() - cpu0)
    return sorted(out, key=lambda p: float("inf") if p.score is None else p.score)


def live_picks(room: int) -> int:
    """How many screened configs go live when the budget leaves ``room`` live trials."""
    room = max(0, room)
    return min(room, max(SCREEN_TOP, math.ceil(SCREEN_SHARE * room)))


def pick_diverse(
    ranked: Sequence[Predicted], spec: ObjectiveSpec, known: Sequence[ParamSet], k: int
) -> list[Predicted]:
    """Up to ``k`` feasible configs of ``ranked`` (best first), none in ``known``: the best
    of each algorithm the twin scores within :data:`SCREEN_SPREAD` of the best first, then
    the next best."""
    ok = [
        p
        for p in ranked
        if p.score is not None and p.figures is not None and feasible(p.figures, spec)
    ]
    ok = [p for p in ok if all(p.params != q for q in known)]
    heads: list[Predicted] = []
    seen: set[object] = set()
    best = min((p.score for p in ok if p.score is not None), default=0.0)
    for p in ok:
        algo = p.params.get("algorithm")
        close = best <= 0 or (p.score is not None and p.score <= best * SCREEN_SPREAD)
        if algo not in seen and close:
            seen.add(algo)
            heads.append(p)
    out = heads[:k]
    for p in ok:
        if len(out) >= k:
            break
        if all(p.params != q.params for q in out):
            out.append(p)
    return sorted(out, key=lambda p: p.score if p.score is not None else float("inf"))


def screen_study(
    req: ScreenRequest,
    space: ParameterSpace,
    study: Any,
    spec: ObjectiveSpec,
    say: Callable[[str], None],
) -> tuple[Screener | None, str | None]:
    """:func:`start_screen` for a new live study (its enqueued references are known, its
    budget's room after them is ``req.live_room`` less those), the picks enqueued."""
    from optuna.trial import TrialState

    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    known = [dict(t.user_attrs.get("enqueued_params") or t.params) for t in waiting]
    req = replace(req, live_room=req.live_room - len(study.get_trials(deepcopy=False)))
    screener, note = start_screen(req, space, known, spec, say)
    if screener is not None:
        screener.enqueue(study)
        say(
            f"the twin screened {screener.screened} configs in {screener.wall_s:.0f} s; "
            f"{len(screener.picked)} go live first"
        )
    return screener, note
