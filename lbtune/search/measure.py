"""The real measurement of a trial: one ``run_stress`` with the study's seed.

Every trial sees the same traffic (same scenario, seed and duration). While the
load runs, the per-request records are tailed and, every ``window_s`` seconds of
the measured part (after warm-up), the figures so far are handed to the study's
window hook (intermediate values for the pruner); when the hook asks to stop, the
load is stopped and the measurement is marked ``stopped``.

Intermediate and final figures come from the same samples and the same estimator:
:func:`lbtune.metrics.censor.censored_samples` over the requests sent in the
measurement window — a request still running at a checkpoint (or cut off at the
test's end) counts at the time it has been running, so a configuration cannot look
good by leaving its slowest requests unfinished — and the P99 of those samples
(:func:`lbtune.metrics.quantiles.percentile`) with its bootstrap interval
(:func:`lbtune.metrics.bootstrap.percentile_interval`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from lbtune.objective import Figures, figures_from_summary
from lbtune.search.trial import Measurement, Samples, WindowHook

if TYPE_CHECKING:
    from lbtune.loadgen.collect import Progress
    from lbtune.loadgen.records import RequestRecord
    from lbtune.metrics.censor import CensoredSamples
    from lbtune.stress import StressOptions

log = logging.getLogger(__name__)

TAIL_Q = 99.0
"""The objective's tail percentile."""
N_BOOT = 400
"""Bootstrap resamples per interval (a trial computes a few per window)."""


def tail_figures(cs: CensoredSamples) -> Figures | None:
    """P99 E2E and P99 TTFT of censored samples with their 95 % bootstrap intervals.

    TTFT over the streamed requests; when nothing was streamed, E2E stands in (the
    whole response is the first token). ``None`` when there is no sample.
    """
    from lbtune.metrics.bootstrap import percentile_interval

    if not cs.e2e:
        return None
    e2e, e_lo, e_hi = percentile_interval(cs.e2e, TAIL_Q, n_boot=N_BOOT)
    streamed = cs.streamed_ttft or cs.e2e
    ttft, t_lo, t_hi = percentile_interval(streamed, TAIL_Q, n_boot=N_BOOT, seed=1)
    return Figures(
        p99_e2e_s=e2e,
        p99_ttft_s=ttft,
        p99_e2e_ci=(e_lo, e_hi),
        p99_ttft_ci=(t_lo, t_hi),
        samples=len(cs.e2e),
        censored=cs.censored,
    )


def partial_figures(
    records: list[RequestRecord],
    start: float,
    end: float,
    *,
    now: float,
    open_requests: tuple[tuple[float, float | None, bool], ...] = (),
) -> Figures | None:
    """Figures at ``now`` of the requests sent in ``[start, end)``: the finished ones, and the
    ones still open at ``now`` at their elapsed time (censored, like the final figures)."""
    from lbtune.metrics.censor import censored_samples

    cs = censored_samples(records, start=start, end=end, now=now, open_requests=open_requests)
    tail = tail_figures(cs)
    if tail is None:
        return None
    judged = len(cs.e2e) - cs.censored + cs.errors  # ended, cut-off ones excluded
    return replace(
        tail, error_rate=cs.errors / judged if judged else 0.0, completed=len(cs.e2e) - cs.censored
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
    _planned: StressOptions | None = field(default=None, init=False, repr=False)

    def plan_options(self) -> StressOptions:
        """``options`` with the run plan made once (:func:`lbtune.runplan.plan_run`): every
        trial runs exactly that plan, and the scenario file is read only the first time."""
        if self._planned is None:
            from lbtune.runplan import plan_run

            self._planned = replace(self.options, plan=plan_run(self.options))
        return self._planned

    def __call__(self, label: str, on_window: WindowHook | None = None) -> Measurement:
        from lbtune.loadgen.recordio import read_records
        from lbtune.metrics.censor import censored_samples
        from lbtune.stress import run_stress

        opts = self.plan_options()
        assert opts.plan is not None
        warm, end = opts.plan.window_start_s, opts.plan.window_end_s
        out_dir = self.runs_dir / label
        out_dir.mkdir(parents=True, exist_ok=True)
        stop = threading.Event()
        records: list[RequestRecord] = []
        step = 1
        tail = None

        def on_progress(p: Progress) -> None:
            nonlocal tail, step
            if self.interrupt.is_set():
                stop.set()
                return
            if on_window is None:
                return
            if tail is None:
                from lbtune.loadgen.collect import RecordTail

                tail = RecordTail(out_dir, on_record=records.append)
            tail.poll()
            measured = p.elapsed_s - warm
            if measured < step * self.window_s or p.elapsed_s >= end:
                return
            # The run's start, as the runner counts elapsed time (the generators' start
            # once they reported it): this snapshot was taken just now.
            t0 = time.time() - p.elapsed_s
            fig = partial_figures(
                records, t0 + warm, t0 + end, now=p.now, open_requests=p.open_requests
            )
            if fig is None:  # nothing sent in the window as of the snapshot: next time
                return
            this, step = step, step + 1
            if on_window(this, fig):
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
        window = summary.window
        cs = censored_samples(read_records(res.records_path), start=window.start, end=window.end)
        figures: Figures | None
        try:
            figures = figures_from_summary(summary)
        except ValueError:
            if not stopped:
                raise
            figures = None
        tail_fig = tail_figures(cs)
        if figures is not None and tail_fig is not None:
            # The one estimator: the scored P99s are the censored samples' (summary's are
            # over finished requests only), with their intervals.
            figures = replace(
                figures,
                p99_e2e_s=tail_fig.p99_e2e_s,
                p99_ttft_s=tail_fig.p99_ttft_s,
                p99_e2e_ci=tail_fig.p99_e2e_ci,
                p99_ttft_ci=tail_fig.p99_ttft_ci,
                samples=tail_fig.samples,
                censored=tail_fig.censored,
            )
        # Paired per request (the bootstrap resamples requests); a non-streamed request
        # has no TTFT: NaN, left out of the TTFT percentile. Nothing streamed: E2E stands in.
        samples = Samples.of(
            cs.ttft if cs.streamed_ttft else cs.e2e, cs.e2e, sent=cs.sent, errors=cs.errors
        )
        return Measurement(
            figures=figures,
            samples=samples,
            degraded=tuple(summary.generator.reasons) if summary.generator.degraded else (),
            stopped=stopped,
            seconds=time.monotonic() - t_start,
        )
