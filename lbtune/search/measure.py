"""The real measurement of a trial: one ``run_stress`` with the study's seed.

Every trial sees the same traffic (same scenario, seed and duration). While the
load runs, the per-request records are tailed and, every ``window_s`` seconds of
the measured part (after warm-up), the figures so far are handed to the study's
window hook (intermediate values for the pruner); when the hook asks to stop, the
load is stopped and the measurement is marked ``stopped``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from lbtune.loadgen.records import ERROR_OUTCOMES
from lbtune.objective import Figures, figures_from_summary
from lbtune.search.trial import Measurement, Samples, WindowHook

if TYPE_CHECKING:
    from lbtune.loadgen.collect import Progress
    from lbtune.loadgen.records import RequestRecord
    from lbtune.stress import StressOptions

log = logging.getLogger(__name__)


def nearest_rank(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); the max when there are < 100/(100-q) values."""
    s = sorted(values)
    k = max(1, math.ceil(q / 100 * len(s)))
    return s[k - 1]


def censored(records: list[RequestRecord]) -> list[tuple[float | None, float]]:
    """(TTFT, E2E) of every request that succeeded or was cut off by the test's end.

    TTFT is ``None`` for non-streamed requests (they have no first token).

    A cancelled request still ran when the test ended: its latencies are at least
    what had elapsed by then, so it enters the objective with that lower bound. A
    configuration cannot look better by leaving its slowest requests unfinished.
    """
    out: list[tuple[float | None, float]] = []
    for r in records:
        if r.outcome == "ok":
            out.append((r.ttft, r.e2e))
        elif r.outcome == "cancelled":
            # Still waiting for its first token at the end: TTFT >= what had elapsed.
            ttft = r.ttft if r.ttft is not None else (r.e2e if r.stream else None)
            out.append((ttft, r.e2e))
    return out


def partial_figures(records: list[RequestRecord], start: float, end: float) -> Figures | None:
    """Figures from the requests sent in ``[start, end)`` that have ended so far."""
    sent = [r for r in records if start <= r.sent_at < end]
    ok = [r for r in sent if r.outcome == "ok"]
    errors = [r for r in sent if r.outcome in ERROR_OUTCOMES]
    if not ok:
        return None
    ttfts = [r.ttft for r in ok if r.ttft is not None] or [r.e2e for r in ok]
    return Figures(
        p99_e2e_s=nearest_rank([r.e2e for r in ok], 99),
        p99_ttft_s=nearest_rank(ttfts, 99),
        error_rate=len(errors) / sum(1 for r in sent if r.outcome != "cancelled"),
        completed=len(ok),
    )


@dataclass
class StressMeasure:
    """A :class:`~lbtune.search.trial.Measure` backed by :func:`lbtune.stress.run_stress`."""

    options: StressOptions
    """Scenario, duration, seed, target; ``out_dir`` is replaced per trial."""
    runs_dir: Path
    window_s: float = 5.0
    interrupt: threading.Event = field(default_factory=threading.Event)
    """Set by Ctrl-C: stops the running measurement."""
    say: object = None

    def __call__(self, label: str, on_window: WindowHook | None = None) -> Measurement:
        from lbtune.loadgen.recordio import read_records
        from lbtune.scenario import load_scenario, plan_load
        from lbtune.stress import run_stress

        opts = self.options
        scenario = load_scenario(opts.scenario)
        plan = plan_load(scenario, opts.duration_s, opts.users, opts.rate, opts.seed)
        warm, end = plan.measure_window
        out_dir = self.runs_dir / label
        out_dir.mkdir(parents=True, exist_ok=True)
        stop = threading.Event()
        records: list[RequestRecord] = []
        state: dict[str, float] = {"t0": 0.0, "step": 1}
        tail = None

        def on_progress(p: Progress) -> None:
            nonlocal tail
            if self.interrupt.is_set():
                stop.set()
                return
            if on_window is None:
                return
            if tail is None:
                from lbtune.loadgen.collect import RecordTail

                tail = RecordTail(out_dir, on_record=records.append)
                state["t0"] = time.time() - p.elapsed_s
            tail.poll()
            step = int(state["step"])
            measured = p.elapsed_s - warm
            if measured < step * self.window_s or p.elapsed_s >= end:
                return
            state["step"] = step + 1
            t0 = state["t0"]
            fig = partial_figures(records, t0 + warm, t0 + end)
            if fig is not None and on_window(step, fig):
                stop.set()

        t_start = time.monotonic()
        res = run_stress(
            replace(opts, out_dir=out_dir, write_report=False),
            on_progress=on_progress,
            stop=stop,
            say=lambda msg: log.debug("%s: %s", label, msg),
        )
        stopped = stop.is_set() or res.load.stopped_early
        summary = res.summary
        figures: Figures | None
        try:
            figures = figures_from_summary(summary)
        except ValueError:
            if not stopped:
                raise
            figures = None
        window = summary.window
        in_window = [r for r in read_records(res.records_path) if window.contains(r.sent_at)]
        scored = censored(in_window)
        ttfts = [t for t, _ in scored if t is not None]
        e2es = [e for _, e in scored]
        if figures is not None and e2es:
            figures = replace(
                figures,
                p99_e2e_s=max(figures.p99_e2e_s, nearest_rank(e2es, 99)),
                p99_ttft_s=max(figures.p99_ttft_s, nearest_rank(ttfts or e2es, 99)),
            )
        # Paired per request (the bootstrap resamples requests); a non-streamed request
        # has no TTFT: NaN, left out of the TTFT percentile. Nothing streamed: E2E stands in.
        samples = Samples.of(
            [math.nan if t is None else t for t, _ in scored] if ttfts else e2es,
            e2es,
            sent=len(in_window),
            errors=sum(1 for r in in_window if r.outcome in ERROR_OUTCOMES),
        )
        return Measurement(
            figures=figures,
            samples=samples,
            degraded=tuple(summary.generator.reasons) if summary.generator.degraded else (),
            stopped=stopped,
            seconds=time.monotonic() - t_start,
        )
