"""A study in the terminal: ``lbtune optimize``'s progress display (a live panel, a line
every few seconds when piped, a line per trial under ``--ci``), its Ctrl-C and SIGTERM
handling, and the result and report it prints at the end."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from lbtune.search.result import StudyResult
    from lbtune.tune.options import OptimizeOptions, StudyProgress

__all__ = ["format_progress", "print_result", "run_study", "tell"]


def run_study(opts: OptimizeOptions, ci: bool, err: Console, term: threading.Event) -> StudyResult:
    """``run_optimize`` with the progress display that fits: a plain line per trial under
    ``--ci``, a line every few seconds when stderr is piped, else a live panel; Ctrl-C
    stops it gracefully (the first one), SIGTERM too (and sets ``term``); the study is
    indexed in the history."""
    from lbtune.cli import ci as ci_mode
    from lbtune.cli.ticker import ticking
    from lbtune.tune.optimize import record_study, run_optimize

    stop = threading.Event()
    view = _View()
    lines = ci_mode.StudyLines() if ci else None

    def on_progress(p: StudyProgress) -> None:
        view.update(p)
        if lines is not None:
            lines(p)

    say = ci_mode.line if ci else (lambda m: view.say(err, m))
    with (
        _sigint(stop),
        _sigterm(stop, term),
        _live(err, view, enabled=err.is_terminal and not ci),
        ticking(view.render, ci_mode.line, enabled=not err.is_terminal),
    ):
        return run_optimize(
            opts, on_progress=on_progress, stop=stop, say=say, on_result=record_study
        )


def tell(result: StudyResult, junit: Path | None, err: Console) -> None:
    """On stderr, where the report is; the JUnit file (--junit) and the GitHub step summary
    (when GITHUB_STEP_SUMMARY is set)."""
    from lbtune.cli import ci as ci_mode

    if result.report_dir:
        err.print(f"report: {result.report_dir}", markup=False)
    if junit is not None:
        from lbtune.report.junit import study_suite, write_junit

        write_junit(junit, [study_suite(result)])
        err.print(f"junit: {junit}", markup=False)
    ci_mode.append_step_summary(ci_mode.study_markdown(result))


@contextlib.contextmanager
def _sigint(stop: threading.Event) -> Iterator[None]:
    """First Ctrl-C sets ``stop`` (graceful); the second one raises KeyboardInterrupt."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        stop.set()

    with _handled(signal.SIGINT, handler):
        yield


@contextlib.contextmanager
def _sigterm(stop: threading.Event, term: threading.Event) -> Iterator[None]:
    """SIGTERM (what CI runners and systemd send) stops the study like the first Ctrl-C:
    the running trial ends, the last known good is restored, the report is written. It
    only sets flags, so a SIGTERM during the restore or the final write interrupts
    neither; later ones change nothing (SIGKILL remains, and the lease guard restores)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        term.set()
        stop.set()

    with _handled(signal.SIGTERM, handler):
        yield


@contextlib.contextmanager
def _handled(
    sig: signal.Signals, handler: Callable[[int, FrameType | None], None]
) -> Iterator[None]:
    """``handler`` for ``sig`` while inside, the old one back after; only in the main
    thread (Python delivers signals there, and only it may set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(sig, handler)
    try:
        yield
    finally:
        signal.signal(sig, old)


class _View:
    """The rich progress renderable: recomputed at every refresh (elapsed keeps ticking)."""

    def __init__(self) -> None:
        self.p: StudyProgress | None = None
        self.live: Any = None

    def update(self, p: StudyProgress) -> None:
        self.p = p

    def say(self, console: Console, msg: str) -> None:
        (self.live.console if self.live is not None else console).print(f"[dim]{msg}[/]")

    def __rich__(self) -> str:
        return self.render() or "starting…"

    def render(self) -> str | None:
        return None if self.p is None else format_progress(self.p, time.monotonic())


def format_progress(p: StudyProgress, now: float) -> str:
    n = "-" if p.trial is None else str(p.trial)
    best = "-" if p.best is None else f"{p.best:.3f} (trial {p.best_trial})"
    imp = p.improvement  # study.json's sign: negative = a lower (better) score
    gain = "" if imp is None else f", score {imp:+.1%} vs baseline"
    params = ", ".join(f"{k}={_short(v)}" for k, v in list(p.params.items())[:8])
    value = "" if p.last_value is None else f" | score so far {p.last_value:.3f}"
    what = f"trial {n} ({p.role})"  # during a trial the phase is "trial": said once
    if p.phase != "trial":
        what = p.phase if p.trial is None else f"{p.phase} | last trial {n} ({p.role})"
    head = (
        f"[bold]{what}[/] | {p.done}/{p.budget} done | "
        f"elapsed {(now - p.started_at) / 60:.1f} min (trial {now - p.trial_started_at:.0f} s)"
    )
    return (
        f"{head}{value}\nbest {best}{gain} | pruned {p.pruned} failed {p.failed}\n[dim]{params}[/]"
    )


def _short(v: object) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


@contextlib.contextmanager
def _live(console: Console, view: _View, enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    from rich.live import Live

    with Live(view, console=console, refresh_per_second=2, transient=False) as live:
        view.live = live
        try:
            yield
        finally:
            view.live = None


def print_result(result: StudyResult, out: Console | None = None) -> None:
    from rich.console import Console

    from lbtune.report.study_frame import before_after, confirmation_table, headline, rounds_table

    out = out or Console()
    from lbtune.cli.stress import fmt_cell

    out.print(f"[bold]{headline(result)}[/]")
    for t in (before_after(result), confirmation_table(result), rounds_table(result)):
        if not t.rows:
            continue
        from rich.table import Table

        table = Table(*t.columns)
        for row in t.rows:
            table.add_row(*(fmt_cell(c) for c in row))
        out.print(table)
