"""After a study's search: confirm, roll out, record the winner, or put the last known
good back.

The best ``--confirm-top`` candidates are confirmed (:func:`lbtune.search.confirm.confirm`)
against the live config and against the study's **best reference** config
(:func:`best_reference`: its best round-robin or least-conn trial, where that scored
better than the live config in the search; the live config is the strongest reference
otherwise). A confirmed winner is rolled out through the target's rollout path
(:func:`lbtune.search.harness.rollout`) and stored in the study
(:func:`lbtune.search.stored.record_winner`): the one configuration ``study.json``, the
report and ``lbtune apply --study`` name. Every skip is said in one line and kept as a note.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from lbtune.errors import LbtuneError
from lbtune.objective import ObjectiveSpec
from lbtune.search.confirm import Arm, BaselineUnmeasurable, confirm
from lbtune.search.harness import Harness, rollout
from lbtune.search.result import Confirmation, Rollout, Screening, TrialResult, Verdict
from lbtune.search.stored import record_winner
from lbtune.search.trial import TrialRunner
from lbtune.targets.base import ParamSet
from lbtune.tune.options import OptimizeOptions

__all__ = ["AfterSearch", "SearchDone", "after_search", "best_reference", "restore"]

REFERENCES = ("round-robin", "least-conn")
"""The roles of the reference configs (the live config is the baseline itself)."""


class Phases(Protocol):
    """Where the steps after the search say what they do."""

    def phase(self, text: str) -> None: ...
    def say(self, text: str) -> None: ...


@dataclass(frozen=True)
class SearchDone:
    """What the search left: its trials (with the best and, in pareto mode, the front),
    the study they are stored in and the last known good it started from."""

    opts: OptimizeOptions
    spec: ObjectiveSpec
    trials: list[TrialResult]
    study: Any
    lkg: ParamSet
    best: TrialResult | None
    front: list[int] = field(default_factory=list)


@dataclass
class AfterSearch:
    """What the confirmation and the rollout came to."""

    confirmation: Confirmation | None = None
    rollout: Rollout | None = None
    unmeasurable: BaselineUnmeasurable | None = None
    notes: list[str] = field(default_factory=list)
    screening: Screening | None = None
    """The twin's screen and how its predictions met the live trials (``--screen``)."""


def after_search(
    done: SearchDone, h: Harness, runner: TrialRunner, stop: threading.Event, show: Phases
) -> AfterSearch:
    """Confirm the best candidates, then roll a confirmed winner out (unless
    ``--no-apply`` or stopped) and store it in the study; every skip is a note."""
    opts = done.opts
    assert opts.study is not None
    out = AfterSearch()
    live_no, live_params = _live(done)
    winner: TrialResult | None = None
    try:
        if not stop.is_set():
            out.confirmation = _confirm(done, runner, (live_no, live_params), stop, show.phase)
            if out.confirmation.note:
                out.notes.append(out.confirmation.note)
        conf = out.confirmation
        if conf is not None and conf.winner is not None:
            winner = next(t for t in done.trials if t.number == conf.winner)
        if conf is not None and winner is not None and opts.apply and not stop.is_set():
            show.phase(f"rolling out trial {winner.number} through {h.rollout_via}")
            out.rollout = rollout(h, winner.params, done.lkg, conf, done.spec, opts.study, show.say)
        elif winner is not None:
            out.notes.append("--no-apply: the confirmed winner was not applied")
        elif conf is not None and not stop.is_set():
            why = f"rollout skipped: {conf.verdict}; the last known good stays live"
            show.say(why)
            out.notes.append(why)
    except BaselineUnmeasurable as exc:
        out.unmeasurable = exc
        out.confirmation = Confirmation("not run", live_no, note=str(exc))
        out.notes.append(str(exc))
        show.say(str(exc))
    except LbtuneError as exc:
        out.notes.append(f"stopped after the search: {exc}")
        show.say(f"error after the search: {exc}")
    record_winner(
        done.study, out.confirmation, None if winner is None else winner.params, out.rollout
    )
    return out


def restore(h: Harness, lkg: ParamSet, after: AfterSearch, show: Phases) -> None:
    """Unless a winner was rolled out and kept, put the last known good back."""
    ro = after.rollout
    if ro is None or not ro.applied or ro.rolled_back:
        show.phase("restoring the last known good")
        try:
            h.target.apply(h.lkg_get() or lkg)
        except LbtuneError as exc:
            after.notes.append(f"could not restore the last known good: {exc}")


def best_reference(trials: list[TrialResult], live: ParamSet) -> TrialResult | None:
    """The study's strongest reference config to confirm against, besides the live one:
    its best-scoring completed, feasible round-robin or least-conn trial that differs from
    the live config and scored better than the live config's own trial (None when the
    live config scored best: it is the strongest reference itself)."""
    refs = [
        t
        for t in trials
        if t.role in REFERENCES
        and t.state == "COMPLETE"
        and t.feasible
        and t.objective is not None
        and t.params != live
    ]
    if not refs:
        return None
    best = min(refs, key=lambda t: t.objective if t.objective is not None else float("inf"))
    own = next((t for t in trials if t.role == "live" and t.state == "COMPLETE"), None)
    if (
        own is not None
        and own.objective is not None
        and best.objective is not None
        and own.objective <= best.objective
    ):
        return None
    return best


def _candidates(done: SearchDone, exclude: list[ParamSet]) -> list[TrialResult]:
    """The best ``--confirm-top`` distinct feasible completed trials (on the front in
    pareto mode), none equal to a parameter set of ``exclude``."""
    pool = [
        t for t in done.trials if t.state == "COMPLETE" and t.feasible and t.objective is not None
    ]
    if done.spec.kind == "pareto":
        pool = [t for t in pool if t.number in done.front]
    pool.sort(key=lambda t: t.objective if t.objective is not None else float("inf"))
    out: list[TrialResult] = []
    for t in pool:
        if all(t.params != p for p in exclude) and all(t.params != c.params for c in out):
            out.append(t)
    return out[: done.opts.confirm_top]


def _live(done: SearchDone) -> tuple[int | None, ParamSet]:
    """The live configuration's trial number (whatever its state) and parameters.

    The baseline of the confirmation is the live configuration re-measured, never its
    search run: a failed trial 0 still names what to measure. Without a live trial
    (a study from before roles), the parameters recorded when the study began.
    """
    live = next((t for t in done.trials if t.role == "live"), None)
    if live is not None and live.params:
        return live.number, dict(live.params)
    stored = done.study.user_attrs.get("lkg_params")
    return None, dict(stored) if isinstance(stored, dict) else dict(done.lkg)


def _confirm(
    done: SearchDone,
    runner: TrialRunner,
    live: tuple[int | None, ParamSet],
    stop: threading.Event,
    phase: Callable[[str], None],
) -> Confirmation:
    """Confirm the best candidates against the live config and the best reference; every
    skip says why."""
    opts, best = done.opts, done.best
    live_no, live_params = live

    def skipped(verdict: Verdict, why: str) -> Confirmation:
        phase(f"confirmation skipped: {why}")
        return Confirmation(verdict, live_no, note=f"confirmation skipped: {why}")

    if best is None:
        return skipped("not run", "no feasible completed trial to confirm; nothing applied")
    if best.params == live_params:
        return skipped("baseline is best", f"the best trial ({best.number}) is the live config")
    ref = best_reference(done.trials, live_params)
    cands = _candidates(done, [live_params] + ([ref.params] if ref is not None else []))
    if not cands and ref is None:
        return skipped("baseline is best", "no feasible candidate differs from the live config")
    if opts.confirm_runs == 0:
        return skipped("not run", "--confirm-runs 0; nothing applied")
    arms = [Arm(f"B{i + 1}", t.number, t.params) for i, t in enumerate(cands)]
    ref_arm = None if ref is None else Arm("R", ref.number, ref.params, role=ref.role)
    against = "the live config" + (
        f" and the study's best reference ({ref.role}, trial {ref.number})"
        if ref is not None
        else " (no reference config scored better than it in the search)"
    )
    phase(
        f"confirmation: {len(arms)} candidate(s) against {against}, at least "
        f"{opts.confirm_runs} round(s), up to {opts.confirm_max_rounds} for enough samples"
    )
    return confirm(
        runner,
        Arm("A", live_no, live_params),
        arms,
        done.spec,
        runs=opts.confirm_runs,
        max_rounds=opts.confirm_max_rounds,
        max_s=opts.confirm_max_s,
        seed=opts.seed or 0,
        stop=stop,
        say=phase,
        reference=ref_arm,
    )
