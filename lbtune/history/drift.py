"""Drift: is the live config now significantly worse than the last accepted one?

*Current* is the newest entry of a scenario: tonight's study baseline (the live config
measured as the study's trial 0) or the newest stress run. *Reference* is the newest
**accepted** study before it (a winner rolled out, verified and not rolled back), through
the figures of its verification run (else of its confirmation). Without an accepted
study there is nothing to drift from, and nothing is flagged.

A figure has drifted when it is worse by more than the threshold (default 20 %, relative;
error rate: more than 1 percentage point, absolute) and, for P99 E2E and P99 TTFT, when
both measurements still have their ``requests.parquet``, when the 95 % bootstrap
confidence interval of the P99 difference (current − reference; 1000 resamples of the
successful requests in each measurement window) lies entirely above zero. P99 and the
bootstrap are the ones of :mod:`lbtune.metrics.bootstrap` (linear percentile, see
``docs/metrics.md``); TTFT is over streamed requests, as in the summary. Without the
records, the threshold alone decides. Throughput compares goodput where both have it,
else completed requests/s; it has no CI.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import Field, TypeAdapter, computed_field, field_serializer

from lbtune.errors import ConfigError
from lbtune.history.store import Entry, KeyFigures
from lbtune.loadgen.recordio import read_records
from lbtune.metrics.bootstrap import percentile_diff_interval
from lbtune.records.jsonform import key_order
from lbtune.scenario.runplan import read_run_plan

__all__ = [
    "DEFAULT_THRESHOLD",
    "DRIFT",
    "ERROR_RATE_POINTS",
    "DriftReport",
    "FigureCheck",
    "bootstrap_p99_diff",
    "check_drift",
]

DEFAULT_THRESHOLD = 0.20
ERROR_RATE_POINTS = 0.01
N_BOOT = 1000
LEVEL = 0.95
Array = np.ndarray[tuple[int], np.dtype[np.float64]]


@dataclass(frozen=True)
class FigureCheck:
    name: str
    current: float | None
    reference: float | None
    change: float | None
    """Relative change (``current/reference - 1``); absolute for the error rate."""
    limit: float
    beyond: bool
    """Worse than the reference by more than ``limit``."""
    # JSON quirk kept from the hand-written form: ``ci`` written as ``ci95``.
    ci: Annotated[tuple[float, float] | None, Field(serialization_alias="ci95")] = None
    """Bootstrap CI of ``current - reference`` (seconds), P99 figures with records only."""
    drifted: bool = False


_ENTRY_REF = ("id", "kind", "time", "study", "report_dir", "config_hash")
"""What a drift report's JSON says of the entries it compared (the entries are listed apart)."""


@dataclass(frozen=True)
class DriftReport:
    """The newest entry of a scenario against its reference. In JSON (:data:`DRIFT`), the
    computed :attr:`drifted` names follow ``drift``, and an entry is a short reference."""

    scenario: str
    current: Entry | None
    reference: Entry | None
    checks: tuple[FigureCheck, ...] = ()
    drift: bool = False
    notes: tuple[str, ...] = ()

    # JSON quirk kept from the hand-written form: ``drifted`` after ``drift``.
    _json = key_order("scenario", "drift", "drifted", "current", "reference")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def drifted(self) -> list[str]:
        return [c.name for c in self.checks if c.drifted]

    @field_serializer("current", "reference")
    def _entry_ref(self, e: Entry | None) -> dict[str, object] | None:
        return None if e is None else {k: getattr(e, k) for k in _ENTRY_REF}


DRIFT: TypeAdapter[DriftReport] = TypeAdapter(DriftReport)
"""A drift report to its JSON form (``lbtune history --check-drift --json``)."""


def check_drift(
    entries: Sequence[Entry],
    scenario: str,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> DriftReport:
    """Compare the newest entry of ``scenario`` with the last accepted one before it."""
    mine = [e for e in entries if e.scenario == scenario]
    cur_i = next((i for i in range(len(mine) - 1, -1, -1) if mine[i].current is not None), None)
    if cur_i is None:
        return DriftReport(scenario, None, None, notes=("no measurement of this scenario",))
    current = mine[cur_i]
    reference = next((e for e in reversed(mine[:cur_i]) if e.reference is not None), None)
    if reference is None:
        return DriftReport(
            scenario,
            current,
            None,
            notes=("no accepted configuration before the newest run: nothing to drift from",),
        )
    cur, ref = current.current, reference.reference
    assert cur is not None and ref is not None

    def ci(xa: Array, xb: Array) -> tuple[float, float]:
        _, lo, hi = bootstrap_p99_diff(xa, xb, n_boot=n_boot, seed=seed)
        return lo, hi

    checks = [_p99(name, cur, ref, threshold, ci) for name in ("p99_e2e_s", "p99_ttft_s")]
    checks.append(_throughput(cur, ref, threshold))
    checks.append(_error_rate(cur, ref))
    notes = []
    if cur.degraded:
        notes.append("the load generator fell behind in the current run: figures not trusted")
    if current.load.get("duration_s") != reference.load.get("duration_s"):
        notes.append(
            f"load differs: {current.load.get('duration_s')} s now, "
            f"{reference.load.get('duration_s')} s for the reference"
        )
    return DriftReport(
        scenario, current, reference, tuple(checks), any(c.drifted for c in checks), tuple(notes)
    )


def _p99(
    name: str,
    cur: KeyFigures,
    ref: KeyFigures,
    threshold: float,
    interval_of: Callable[[Array, Array], tuple[float, float]],
) -> FigureCheck:
    """A P99 figure drifts beyond the threshold and, where both runs have their records,
    when ``interval_of`` them (the bootstrap CI of the difference) lies above zero."""
    a, b = getattr(cur, name), getattr(ref, name)
    if a is None or b is None or b <= 0:
        return FigureCheck(name, a, b, None, threshold, False)
    change = a / b - 1
    beyond = change > threshold
    ci = None
    if beyond:
        metric = "e2e" if name == "p99_e2e_s" else "ttft"
        xa, xb = samples(cur, metric), samples(ref, metric)
        if xa is not None and xb is not None:
            ci = interval_of(xa, xb)
    drifted = beyond and (ci is None or ci[0] > 0)
    return FigureCheck(name, a, b, change, threshold, beyond, ci, drifted)


def _throughput(cur: KeyFigures, ref: KeyFigures, threshold: float) -> FigureCheck:
    name = "goodput_per_s"
    if cur.goodput_per_s is None or ref.goodput_per_s is None:
        name = "requests_per_s"
    a, b = getattr(cur, name), getattr(ref, name)
    if a is None or b is None or b <= 0:
        return FigureCheck(name, a, b, None, threshold, False)
    change = a / b - 1
    return FigureCheck(
        name, a, b, change, threshold, change < -threshold, None, change < -threshold
    )


def _error_rate(cur: KeyFigures, ref: KeyFigures) -> FigureCheck:
    a, b = cur.error_rate, ref.error_rate
    if a is None or b is None:
        return FigureCheck("error_rate", a, b, None, ERROR_RATE_POINTS, False)
    change = a - b
    beyond = change > ERROR_RATE_POINTS
    return FigureCheck("error_rate", a, b, change, ERROR_RATE_POINTS, beyond, None, beyond)


def samples(fig: KeyFigures, metric: str) -> Array | None:
    """Latencies (``e2e`` or ``ttft``, s) of the successful requests sent in the window
    (the one ``run.json`` records, see :func:`_window`).

    The samples of the summary's latency table: TTFT over streamed requests only
    (:attr:`~lbtune.records.requests.RequestRecord.ttft`), E2E over all of them.
    """
    if not fig.records_dir:
        return None
    d = Path(fig.records_dir)
    if not (d / "requests.parquet").is_file():
        return None
    records = read_records(d)
    if not records:
        return None
    lo, hi = _window(d, fig, min(r.sent_at for r in records))
    values = [
        v
        for r in records
        if r.outcome == "ok"
        and lo <= r.sent_at < hi
        and (v := (r.e2e if metric == "e2e" else r.ttft)) is not None
    ]
    out: Array = np.asarray(values, dtype=float)
    return out if out.size else None


def _window(run_dir: Path, fig: KeyFigures, first_sent: float) -> tuple[float, float]:
    """The absolute window as the run's ``run.json`` recorded it; for a run from before
    lbtune recorded its plan, the entry's offsets from its first send; else everything."""
    try:
        plan = read_run_plan(run_dir)
    except ConfigError:
        plan = None
    if plan is not None and plan.window_start is not None and plan.window_end is not None:
        return plan.window_start, plan.window_end
    if fig.window_start_s is not None and fig.window_end_s is not None:
        return first_sent + fig.window_start_s, first_sent + fig.window_end_s
    return -math.inf, math.inf


def bootstrap_p99_diff(
    current: Array, reference: Array, *, n_boot: int = N_BOOT, level: float = LEVEL, seed: int = 0
) -> tuple[float, float, float]:
    """``(diff, ci_low, ci_high)`` of P99(current) − P99(reference).

    :func:`lbtune.metrics.bootstrap.percentile_diff_interval`: the one percentile
    (linear) and the one bootstrap, each measurement resampled on its own.
    """
    return percentile_diff_interval(
        current, reference, 99.0, confidence=level, n_boot=n_boot, seed=seed
    )
