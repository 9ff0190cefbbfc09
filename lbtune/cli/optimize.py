"""`lbtune optimize` — tune the balancer; `lbtune dashboard` — optuna-dashboard on a study.

Parse, call :func:`lbtune.tune.optimize.run_optimize`, render. Optuna and the rest are
imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from lbtune.search.result import StudyResult
    from lbtune.tune.optimize import StudyProgress


def optimize_command(
    budget: int | None = typer.Option(
        None,
        "--budget",
        "-n",
        help="Trials to run (references included; default 50, on --resume the study's own).",
    ),
    scenario: str | None = typer.Option(
        None, "--scenario", "-s", help="Built-in scenario or a YAML file (default: mixed)."
    ),
    target: str | None = typer.Option(
        None,
        "--target",
        help="Balancer to tune: haproxy, envoy, nginx or vllm-router (default: the cluster's own).",
    ),
    space: str | None = typer.Option(
        None, "--space", help="Parameter-space YAML (default: the target's own)."
    ),
    objective: str | None = typer.Option(
        None, "--objective", help="composite (weighted score) or pareto (default: composite)."
    ),
    sampler: str = typer.Option("tpe", "--sampler", help="tpe, gp, nsga2 or random."),
    pruner: str = typer.Option("median", "--pruner", help="median or none."),
    trial_duration: float | None = typer.Option(
        None, "--trial-duration", help="Seconds of load per trial, warm-up included (default: 25)."
    ),
    study: str | None = typer.Option(
        None,
        "--study",
        help="Study name (default: <scenario>-<target>-<time>; newest on --resume).",
    ),
    storage: str = typer.Option(
        "sqlite:///reports/studies.db", "--storage", help="Optuna RDB URL (e.g. PostgreSQL)."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted study."),
    no_apply: bool = typer.Option(
        False, "--no-apply", help="Stop after the confirmation: apply nothing."
    ),
    confirm_runs: int = typer.Option(
        2, "--confirm-runs", help="Confirmation rounds at least: baseline + candidates (0 = skip)."
    ),
    confirm_top: int = typer.Option(2, "--confirm-top", help="Candidates to confirm."),
    confirm_max_rounds: int = typer.Option(
        6,
        "--confirm-max-rounds",
        help="Rounds at most, added while an arm has fewer than the 100 samples a P99 needs "
        "(and 15 min at most).",
    ),
    seed: int | None = typer.Option(
        None, "--seed", help="Traffic and sampler seed (default: the scenario's traffic seed)."
    ),
    slo: str | None = typer.Option(
        None, "--slo", help="Score references and error limit, e.g. ttft=350ms,e2e=800ms,errors=1%."
    ),
    weights: str | None = typer.Option(
        None, "--weights", help="Score weights, e.g. e2e=0.45,ttft=0.35,decay=0.2."
    ),
    trace: str | None = typer.Option(
        None, "--trace", help="Tune on this trace's replay instead of --scenario."
    ),
    trace_format: str | None = typer.Option(
        None, "--trace-format", help="azure, mooncake, burstgpt, sharegpt or lbtune."
    ),
    speedup: float | None = typer.Option(
        None, "--speedup", help="With --trace: replay K times faster than recorded."
    ),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="Embedded cluster state dir."),
    cluster: str | None = typer.Option(
        None, "--cluster", help="Cluster preset/file used if the cluster must be started."
    ),
    inventory: str | None = typer.Option(
        None, "--inventory", help="Ansible inventory for the winner's rollout."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Report dir (default: reports/<time>-optimize-<study>/)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print study.json alone on stdout."),
    ci: bool = typer.Option(
        False,
        "--ci",
        envvar="LBTUNE_CI",
        help="CI mode: a plain line per trial, no colour; exit 1 when the winner was rolled "
        "back, 3 on an infrastructure failure.",
    ),
    junit: Path | None = typer.Option(
        None,
        "--junit",
        help="Write each trial, confirmation and rollout step as a JUnit test case here.",
    ),
) -> None:
    """Tune the balancer for your traffic: search, confirm the winner, roll it out.

    Trial 0 is what runs now, then plain round robin and least-conn (where the target has
    it), each once: when the live config already is round robin, trial 1 is least-conn. The
    best candidates are re-run in rounds against the live config, measured
    afresh and interleaved, and the winner is applied through Ansible only if a paired
    bootstrap CI says it is better. If the live config cannot be measured, exit 2. Ctrl-C
    stops the running trial, restores the last known good and writes the report
    (exit 130); `--resume` continues. With GITHUB_STEP_SUMMARY set, a Markdown
    summary is appended to that file.

    Example: lbtune optimize --budget 50
    """
    from rich.console import Console

    from lbtune.cli.ticker import ticking
    from lbtune.tune.optimize import OptimizeOptions, record_study, run_optimize

    if trace is not None:
        from lbtune.scenario.loader import trace_ref

        scenario = trace_ref(trace, trace_format, speedup)
    elif trace_format is not None or speedup is not None:
        raise typer.BadParameter("--trace-format and --speedup apply to --trace")
    _check_trial_duration(trial_duration)
    opts = OptimizeOptions(
        budget=budget,
        scenario=scenario,
        target=target,
        space=space,
        objective=objective,
        sampler=sampler,
        pruner=pruner,
        trial_duration_s=trial_duration,
        study=study,
        storage=storage,
        resume=resume,
        apply=not no_apply,
        confirm_runs=confirm_runs,
        confirm_top=confirm_top,
        confirm_max_rounds=confirm_max_rounds,
        seed=seed,
        slo=slo,
        weights=weights,
        state_dir=state_dir,
        cluster_config=cluster,
        inventory=inventory,
        out_dir=out,
    )
    from lbtune.cli import ci as ci_mode

    ci_mode.check_writable(junit)
    if ci:
        ci_mode.plain_logging()
    err = ci_mode.console(stderr=True) if ci else Console(stderr=True)
    stop = threading.Event()
    view = _View()
    lines = ci_mode.StudyLines() if ci else None

    def on_progress(p: StudyProgress) -> None:
        view.update(p)
        if lines is not None:
            lines(p)

    say = ci_mode.line if ci else (lambda m: view.say(err, m))
    try:
        with (
            _sigint(stop),
            _live(err, view, enabled=err.is_terminal and not ci),
            ticking(view.render, ci_mode.line, enabled=not err.is_terminal),
        ):
            result = run_optimize(
                opts,
                on_progress=on_progress,
                stop=stop,
                say=say,
                on_result=record_study,
            )
    except Exception as exc:
        ci_mode.junit_on_error(junit, "optimize", exc)
        raise
    if as_json:
        from lbtune.report.study import study_json

        sys.stdout.write(study_json(result))
    else:
        _print_result(result, ci_mode.console() if ci else None)
    if result.report_dir:
        err.print(f"report: {result.report_dir}", markup=False)
    if junit is not None:
        from lbtune.report.junit import study_suite, write_junit

        write_junit(junit, [study_suite(result)])
        err.print(f"junit: {junit}", markup=False)
    ci_mode.append_step_summary(ci_mode.study_markdown(result))
    if result.interrupted:
        raise typer.Exit(130)
    code = ci_mode.study_exit_code(result) if ci else 0
    if code:
        r = result.rollout
        why = "; ".join(([r.detail] if r is not None and r.detail else []) + list(result.notes))
        err.print(f"--ci: exit {code}: {why or 'no trial could be measured'}", markup=False)
        raise typer.Exit(code)


def _check_trial_duration(seconds: float | None) -> None:
    """``--trial-duration``: > 0 and finite (0 failed every trial and exited 0)."""
    import math

    from lbtune.errors import ConfigError
    from lbtune.scenario.models import MAX_DURATION_S

    if seconds is not None and not (math.isfinite(seconds) and 0 < seconds <= MAX_DURATION_S):
        raise ConfigError(
            f"--trial-duration: must be > 0 and at most {MAX_DURATION_S:g} s, got {seconds:g}"
        )


def dashboard_command(
    study: str | None = typer.Option(None, "--study", help="Open on this study."),
    storage: str = typer.Option(
        "sqlite:///reports/studies.db", "--storage", help="Optuna RDB URL."
    ),
    port: int = typer.Option(8080, "--port", help="Port on 127.0.0.1."),
) -> None:
    """Open optuna-dashboard (on 127.0.0.1) on the study storage."""
    from lbtune.errors import MissingExtra

    try:
        from optuna_dashboard import run_server
    except ImportError:
        raise MissingExtra(
            "lbtune dashboard needs optuna-dashboard: pip install 'lbtune[dashboard]' "
            "(or pip install optuna-dashboard)"
        ) from None
    where = f"http://127.0.0.1:{port}" + (f"/dashboard/studies?study={study}" if study else "")
    typer.echo(f"optuna-dashboard on {where} (Ctrl-C to stop)", err=True)
    run_server(storage, host="127.0.0.1", port=port)


@contextlib.contextmanager
def _sigint(stop: threading.Event) -> Iterator[None]:
    """First Ctrl-C sets ``stop`` (graceful); the second one raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        stop.set()

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


class _View:
    """The rich progress renderable: recomputed at every refresh (elapsed keeps ticking)."""

    def __init__(self) -> None:
        self.p: StudyProgress | None = None
        self.live: Any = None

    def update(self, p: StudyProgress) -> None:
        self.p = p

    def say(self, console: Any, msg: str) -> None:
        (self.live.console if self.live is not None else console).print(f"[dim]{msg}[/]")

    def __rich__(self) -> str:
        return self.render() or "starting…"

    def render(self) -> str | None:
        return None if self.p is None else format_progress(self.p, time.monotonic())


def format_progress(p: StudyProgress, now: float) -> str:
    n = "-" if p.trial is None else str(p.trial)
    best = "-" if p.best is None else f"{p.best:.3f} (trial {p.best_trial})"
    imp = p.improvement
    gain = "" if imp is None else f", {-imp:+.1%} vs baseline"
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
def _live(console: Any, view: _View, enabled: bool) -> Iterator[None]:
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


def _print_result(result: StudyResult, out: Any = None) -> None:
    from rich.console import Console

    from lbtune.report.study import before_after, confirmation_table, headline, rounds_table

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
