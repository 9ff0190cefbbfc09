"""The study report's frames (pure, tested): the optimisation history, the before/after
table (figures as rows; the live baseline and the winner from the *same* confirmation
rounds, and the change between them), the confirmation table and its rounds, the trials,
the headline, and which trial the report shows (:func:`shown_trial`: the confirmed
winner, else the search's best, said to be unconfirmed). :mod:`lbtune.report.study`
renders them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from lbtune.report.frame import Cell, Table

if TYPE_CHECKING:
    from lbtune.objective import Figures
    from lbtune.search.result import CapacityAtSlo, Comparison, StudyResult, TrialResult

__all__ = [
    "FIGURE_ROWS",
    "before_after",
    "confirmation_table",
    "headline",
    "history",
    "is_plain_round_robin",
    "rounds_table",
    "shown_comparison",
    "shown_trial",
    "trials_table",
]

FIGURE_ROWS: tuple[tuple[str, str, float], ...] = (
    ("P99 end-to-end latency (ms)", "p99_e2e_s", 1000.0),
    ("P99 time to first token (ms)", "p99_ttft_s", 1000.0),
    ("P50 time to first token (ms)", "p50_ttft_s", 1000.0),
    ("throughput (req/s)", "requests_per_s", 1.0),
    ("goodput (req/s)", "goodput_per_s", 1.0),
    ("replica balance (std-dev)", "balance", 1.0),
    ("failed requests (%)", "error_rate", 100.0),
    ("throughput decay", "decay", 1.0),
)


def history(result: StudyResult) -> list[tuple[int, float, float]]:
    """``(trial, objective, best so far)`` for every completed trial with a score."""
    out, best = [], math.inf
    for t in result.trials:
        if t.state == "COMPLETE" and t.objective is not None:
            best = min(best, t.objective) if t.feasible is not False else best
            out.append((t.number, t.objective, best))
    return out


def shown_comparison(result: StudyResult) -> Comparison | None:
    """The comparison the before/after table shows: the winner's, else the closest candidate."""
    c = result.confirmation
    if c is None or not c.comparisons:
        return None
    paired = [x for x in c.comparisons if x.candidate is not None and x.baseline is not None]
    win = next((x for x in paired if x.trial == c.winner), None)
    if win is not None:
        return win
    finite = [x for x in paired if math.isfinite(x.diff)]
    return min(finite, key=lambda x: x.diff) if finite else None


def is_plain_round_robin(params: Mapping[str, object]) -> bool:
    """Round robin with equal weights and no per-server limits or length routing."""
    if params.get("algorithm", "roundrobin") != "roundrobin":
        return False
    weights = {v for k, v in params.items() if k.startswith("weight.")}
    limits = {v for k, v in params.items() if k.startswith("maxconn.")}
    return len(weights) <= 1 and limits <= {0} and not params.get("long_request_bytes")


def _live_params(result: StudyResult) -> Mapping[str, object]:
    live = next((t for t in result.trials if t.role == "live"), None)
    return live.params if live is not None else {}


def before_after(result: StudyResult) -> Table:
    """The live baseline and the winner, both from the same confirmation rounds.

    Figures as rows. Each column pools its arm's requests over the rounds in which both
    arms were measured (interleaved, same traffic); the last column is the change in
    those rounds. No search run is ever a column of this table: without a paired
    comparison (confirmation skipped) the search's live and best trials are shown with
    no change column, since they ran at different times.
    """
    comp = shown_comparison(result)
    c = result.confirmation
    if comp is None or c is None or comp.candidate is None or comp.baseline is None:
        return _unpaired(result)
    rr = is_plain_round_robin(_live_params(result))
    where = "rounds " + ", ".join(map(str, comp.rounds))
    base_label = (
        f"live baseline{' = round robin' if rr else ''} (trial {c.baseline_trial}; {where})"
    )
    if comp.trial == c.winner:
        cand_label = f"winner (trial {comp.trial}, confirmed; {where})"
    else:
        cand_label = f"best candidate (trial {comp.trial}, not significant; {where})"
    change = f"winner vs {'round robin' if rr else 'live'} (same rounds)"
    q = f"P{c.quantile:g}"
    b, w = comp.baseline, comp.candidate
    bf, wf = comp.baseline_figures, comp.figures
    rows: list[tuple[Cell, ...]] = []

    def row(name: str, a: float | None, x: float | None, scale: float = 1.0) -> None:
        av = None if a is None else a * scale
        xv = None if x is None else x * scale
        rel = f"{(xv / av - 1) * 100:+.0f} %" if av and xv is not None else None
        rows.append((name, av, xv, rel))

    row(f"{q} end-to-end latency (ms)", b.tail_e2e_s, w.tail_e2e_s, 1000.0)
    row(f"{q} time to first token (ms)", b.tail_ttft_s, w.tail_ttft_s, 1000.0)
    row("P50 time to first token (ms)", b.p50_ttft_s, w.p50_ttft_s, 1000.0)
    row("throughput (req/s)", b.requests_per_s, w.requests_per_s)
    row("goodput (req/s)", _get(bf, "goodput_per_s"), _get(wf, "goodput_per_s"))
    row("replica balance (std-dev)", _get(bf, "balance"), _get(wf, "balance"))
    row("failed requests (%)", b.error_rate, w.error_rate, 100.0)
    row("throughput decay", _get(bf, "decay"), _get(wf, "decay"))
    cap = result.capacity
    if result.spec.kind == "capacity" and cap is not None:
        row(
            f"attainment at {cap.rate:g} req/s (%)",
            _get(bf, "attainment"),
            _get(wf, "attainment"),
            100.0,
        )
        after = cap.winner if comp.trial == c.winner else None
        row(f"capacity at the SLO, twin ({_kind(cap)}req/s)", cap.baseline, after)
    rel = None
    if math.isfinite(comp.relative):
        rel = (
            f"{comp.relative * 100:+.0f} % (diff {comp.diff:+.3f}, "
            f"{comp.level:.1%} CI {comp.ci_low:+.3f} .. {comp.ci_high:+.3f})"
        )
    rows.append((f"{score_name(result)} (lower is better)", b.score, w.score, rel))
    rows.append(("latency samples (requests)", b.requests, w.requests, None))
    return Table(("figure", base_label, cand_label, change), tuple(rows))


def score_name(result: StudyResult) -> str:
    """What the study's score is, in a row's words."""
    spec = result.spec
    if spec.kind == "capacity":
        return f"SLO stretch at P{spec.share * 100:g}"
    return "composite score"


def _kind(cap: CapacityAtSlo) -> str:
    """``at least `` when a side's twin capacity is only a lower bound (every rate met)."""
    return "at least " if "above" in (cap.baseline_kind, cap.winner_kind) else ""


def _unpaired(result: StudyResult) -> Table:
    """No paired comparison: the search's live and best trials, side by side, no change."""
    live = next((t for t in result.trials if t.role == "live"), None)
    best = result.trial(result.best)
    cols: list[tuple[str, Figures | None]] = []
    if live is not None:
        cols.append((f"live (trial {live.number}, search run, {live.state.lower()})", live.figures))
    if best is not None and (live is None or best.number != live.number):
        cols.append((f"best trial {best.number} (search run, not confirmed)", best.figures))
    rows = tuple(
        (name, *(_val(f, attr, scale) for _, f in cols)) for name, attr, scale in FIGURE_ROWS
    )
    return Table(("figure", *(label for label, _ in cols)), rows)


def rounds_table(result: StudyResult) -> Table:
    """Every confirmation run, round by round, in the order it ran."""
    c = result.confirmation
    q = f"P{c.quantile:g}" if c is not None else "P99"
    cols = (
        "round",
        "arm",
        "trial",
        f"{q} E2E (ms)",
        f"{q} TTFT (ms)",
        "throughput (req/s)",
        "requests",
        "score",
        "note",
    )
    if c is None:
        return Table(cols, ())
    rows = []
    for r in c.rounds:
        note = (
            r.reason if not r.measured else ("" if r.tail_e2e_s is not None else f"< {q} samples")
        )
        rows.append(
            (
                r.round,
                r.arm,
                r.trial,
                _ms(r.tail_e2e_s),
                _ms(r.tail_ttft_s),
                r.requests_per_s,
                r.requests if r.measured else None,
                r.score,
                note,
            )
        )
    return Table(cols, tuple(rows))


def confirmation_table(result: StudyResult) -> Table:
    """One row per challenger against the live baseline (the reference's row is ``R``);
    with a reference, a last column: each candidate against it."""
    c = result.confirmation
    level = max((x.level for x in c.comparisons), default=0.95) if c is not None else 0.95
    cols: tuple[str, ...] = (
        "candidate",
        "rounds",
        "requests (cand. / base.)",
        "score",
        "baseline score",
        "diff",
        f"{level:.1%} CI",
        "verdict",
    )
    if c is not None and c.reference_trial is not None:
        cols += (f"vs {c.reference_role} reference (trial {c.reference_trial})",)
    if c is None:
        return Table(cols, ())
    rows: list[tuple[Cell, ...]] = []
    for x in c.comparisons:
        verdict = (
            "winner" if x.trial == c.winner else ("better" if x.significant else "not significant")
        )
        if not x.feasible:
            verdict = "infeasible"
        cand, base = x.candidate, x.baseline
        n = f"{cand.requests} / {base.requests}" if cand is not None and base is not None else None
        rows.append(
            (
                f"trial {x.trial} ({x.arm})" if x.arm else f"trial {x.trial}",
                len(x.rounds) or None,
                n,
                None if cand is None else cand.score,
                None if base is None else base.score,
                x.diff,
                f"{x.ci_low:+.3f} .. {x.ci_high:+.3f}",
                verdict,
            )
            + ((_against_reference(c.reference_comparisons, x),) if len(cols) > 8 else ())
        )
    return Table(cols, tuple(rows))


def _against_reference(vs_ref: tuple[Comparison, ...], x: Comparison) -> str:
    """A candidate's diff against the reference, its CI and whether it is better."""
    found = next((r for r in vs_ref if r.arm == x.arm), None)
    if found is None:
        return "—"
    said = "better" if found.significant else "not significant"
    return f"{found.diff:+.3f} ({found.ci_low:+.3f} .. {found.ci_high:+.3f}) {said}"


def trials_table(result: StudyResult) -> Table:
    cols = ("trial", "role", "state", "score", "P99 e2e (s)", "P99 TTFT (s)", "errors (%)", "note")
    rows = []
    for t in result.trials:
        f = t.figures
        rows.append(
            (
                t.number,
                t.role,
                t.state,
                t.objective,
                _val(f, "p99_e2e_s", 1.0),
                _val(f, "p99_ttft_s", 1.0),
                _val(f, "error_rate", 100.0),
                t.fail_reason or "",
            )
        )
    return Table(cols, tuple(rows))


def _val(f: Figures | None, attr: str, scale: float) -> float | None:
    v = None if f is None else getattr(f, attr)
    return None if v is None else float(v) * scale


def _get(f: Figures | None, attr: str) -> float | None:
    v = None if f is None else getattr(f, attr)
    return None if v is None else float(v)


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def shown_trial(result: StudyResult) -> tuple[TrialResult | None, str, str]:
    """``(trial, heading, who)``: the trial whose parameters the report shows — the
    confirmed winner (what the rollout applied and ``lbtune apply --study`` applies), else
    the search's best, said to be unconfirmed — its section heading and its name."""
    won = result.trial(result.winner_trial)
    if won is not None:
        beats = _beats(result)
        return won, f"Winner: trial {won.number} (confirmed{beats})", "the winner"
    best = result.trial(result.best)
    if best is None:
        return None, "Best parameters", "the winner"
    return best, f"Best search trial {best.number} (not confirmed)", f"trial {best.number}"


def _beats(result: StudyResult) -> str:
    """`` against live and least-conn``: what the confirmed winner beat."""
    c = result.confirmation
    if c is None or not c.winner_beats:
        return ""
    return " against " + " and ".join(c.winner_beats)


def _reference_name(result: StudyResult) -> str:
    c = result.confirmation
    if c is None or c.reference_trial is None:
        return ""
    return f"the study's best reference ({c.reference_role}, trial {c.reference_trial})"


def headline(result: StudyResult) -> str:
    c = result.confirmation
    r = result.rollout
    if result.interrupted:
        return "Interrupted: the last known good was restored; `--resume` continues the study."
    if c is None or c.verdict == "not run":
        why = f" ({c.note})" if c is not None and c.note else ""
        return f"No confirmation was run{why}: nothing applied."
    if c.verdict != "improved":
        said = f" ({c.note})" if c.note and _reference_name(result) else ""
        return f"{c.verdict.capitalize()}{said}: nothing applied; the last known good stays live."
    comp = next(x for x in c.comparisons if x.trial == c.winner)
    what = (
        f"Trial {c.winner} beats the live baseline by {-comp.relative:.1%} in the same "
        f"{len(comp.rounds)} confirmation round(s) (score diff CI "
        f"{comp.ci_low:+.3f} .. {comp.ci_high:+.3f})."
    )
    ref = _reference_name(result)
    vs_ref = next((x for x in c.reference_comparisons if x.trial == c.winner), None)
    if vs_ref is not None:
        what += f" It beats {ref} by {-vs_ref.relative:.1%} too."
    elif ref and c.winner == c.reference_trial:
        what += f" It is {ref}: no candidate beat it."
    if r is None:
        return what + " Not applied (--no-apply)."
    return f"{what} Rollout: {r.detail}."


def capacity_line(result: StudyResult) -> str | None:
    """A capacity study's rate, SLO and the twin's capacity before and after, in a
    sentence; None for another objective."""
    cap = result.capacity
    if result.spec.kind != "capacity" or cap is None:
        return None
    bounds = [
        f"{name} <= {v * 1000:g} ms"
        for name, v in (("TTFT", cap.slo.ttft_s), ("TPOT", cap.slo.tpot_s), ("E2E", cap.slo.e2e_s))
        if v is not None
    ]
    text = (
        f"Capacity at the SLO ({', '.join(bounds)} for {cap.attainment:.0%} of requests): "
        f"every trial ran open loop at {cap.rate:g} req/s."
    )
    if cap.note:
        return f"{text} {cap.note}."
    if cap.baseline is not None:
        text += f" In the twin the live config's capacity is {_kind(cap)}{cap.baseline:.3g} req/s"
        if cap.winner is not None:
            text += f", the winner's {cap.winner:.3g} req/s ({cap.winner / cap.baseline:.2f}x)"
        text += "."
    return (
        f"{text} A live capacity with its CI: `lbtune capacity --compare LIVE.yaml "
        "WINNER.yaml` with the same scenario, --slo and --attainment."
    )
