"""`lbtune stress` — one load test with live progress, a summary and a report."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from lbtune.cli.options import (
    CiOpt,
    JsonOpt,
    JunitOpt,
    OutOpt,
    PrometheusOpt,
    ScenarioOpt,
    SeedOpt,
    SloOpt,
    SpeedupOpt,
    StateDirOpt,
    TraceFormatOpt,
    TraceOpt,
    check_outputs,
    scenario_or_trace,
)
from lbtune.errors import TERMINATED_EXIT

if TYPE_CHECKING:
    from rich.console import Console

    from lbtune.loadgen.collect import Progress
    from lbtune.metrics.summary import RunSummary
    from lbtune.run.stress import StressOptions, StressResult


def stress_command(
    scenario: ScenarioOpt[str] = "chat",
    target: Annotated[
        str | None,
        typer.Option(
            "--target", help="Balancer base URL (OpenAI-compatible). Default: the embedded cluster."
        ),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option("--duration", "-d", help="Test length in seconds (default: the scenario's)."),
    ] = None,
    users: Annotated[
        int | None,
        typer.Option(
            "--users", "-u", help="Closed loop: concurrent users (scales the scenario's shape)."
        ),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option("--rate", "-r", help="Open loop: arrival rate in req/s (scales the shape)."),
    ] = None,
    seed: SeedOpt = None,
    until_samples: Annotated[
        int | None,
        typer.Option(
            "--until-samples",
            help="Run the shape, then hold its last stage until the measurement window holds N "
            "successful requests (100 for a P99); at most --max-duration.",
        ),
    ] = None,
    max_duration: Annotated[
        float | None,
        typer.Option(
            "--max-duration",
            help="With --until-samples: the longest the run may last, in seconds (default 600).",
        ),
    ] = None,
    slo: SloOpt = None,
    prometheus: PrometheusOpt = None,
    out: OutOpt = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="Generator processes on this machine (Locust distributed mode: a master and N "
            "workers). Default: one process up to 256 concurrent users, beyond that one per 256 "
            "users, up to the cores lbtune may use. 0: always one process.",
        ),
    ] = None,
    master: Annotated[
        bool,
        typer.Option(
            "--master", help="Run the Locust master only; workers join from other machines."
        ),
    ] = False,
    expect_workers: Annotated[
        int | None,
        typer.Option(
            "--expect-workers", help="With --master: how many workers to wait for (default 1)."
        ),
    ] = None,
    worker: Annotated[
        bool, typer.Option("--worker", help="Run a Locust worker that joins --master-host.")
    ] = False,
    master_host: Annotated[
        str, typer.Option("--master-host", help="With --worker: the master's address.")
    ] = "127.0.0.1",
    master_port: Annotated[int, typer.Option("--master-port", help="Locust master port.")] = 5557,
    master_bind: Annotated[
        str,
        typer.Option(
            "--master-bind",
            help="With --master: the address to listen on for workers (default loopback only).",
        ),
    ] = "127.0.0.1",
    ui: Annotated[
        bool, typer.Option("--ui", help="Also open Locust's web UI on 127.0.0.1:8089.")
    ] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="Fail (exit 1) when the generator fell behind.")
    ] = False,
    tokenizer: Annotated[
        str | None,
        typer.Option("--tokenizer", help="A Hugging Face tokenizer.json for prompt lengths."),
    ] = None,
    trace: TraceOpt = None,
    trace_format: TraceFormatOpt = None,
    speedup: SpeedupOpt = None,
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="Allow load against a non-loopback target.")
    ] = False,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
    ci: CiOpt = False,
    junit: JunitOpt = None,
) -> None:
    """Run one load test against the cluster and write a report.

    Live progress goes to stderr; the summary table (or --json: summary.json's content) to
    stdout; the report directory holds summary.json, requests.parquet, report.md and
    report.html. Ctrl-C stops the test cleanly and still writes the (partial) report.
    With --ci an SLO breach exits 1 (without it, 0 unless --strict); with
    GITHUB_STEP_SUMMARY set, a Markdown summary is appended to that file.

    Before the load starts it says how many requests the measurement window will hold,
    and what to change when that is too few for a P99.

    Example: lbtune stress --scenario longctx --until-samples 100
    """
    from lbtune.cli import ci as ci_mode
    from lbtune.run.stress import StressOptions

    if master and worker:
        raise typer.BadParameter("give --master or --worker, not both")
    check_outputs(out, state_dir=state_dir)
    opts = StressOptions(
        scenario=scenario_or_trace(scenario, trace, trace_format, speedup),
        target_url=target,
        prometheus_url=prometheus,
        duration_s=duration,
        users=users,
        rate=rate,
        seed=seed,
        slo=slo,
        until_samples=until_samples,
        max_duration_s=max_duration,
        out_dir=out,
        allow_remote=allow_remote,
        workers=workers,
        role="master" if master else ("worker" if worker else "auto"),
        master_host=master_host,
        master_bind=master_bind,
        master_port=master_port if (master or worker) else 0,
        expect_workers=expect_workers,
        ui=ui,
        strict=strict,
        tokenizer=tokenizer,
        state_dir=state_dir,
    )
    err = ci_mode.start(ci, junit)
    term = _OnStop()
    try:
        with term:
            result = _run(opts, ci, err, term.stop)
    except KeyboardInterrupt:
        if not term.stop.is_set():
            raise
        # A second signal while something before the load (or its drain) was still busy.
        err.print(f"{term.why}, twice: stopped without waiting", markup=False)
        raise typer.Exit(term.exit_code) from None
    except Exception as exc:
        ci_mode.junit_on_error(junit, "stress", exc)
        raise
    _show(result.summary, as_json, ci)
    report_dir = None if result.report is None else str(result.report.directory)
    _tell(result.summary, report_dir, junit, err)
    if result.load.stopped_early:
        err.print(f"{term.why}: the report holds what was measured until then")
        raise typer.Exit(term.exit_code)
    breaches = ci_mode.slo_breaches(result.summary)
    if ci and breaches:
        err.print("SLO breached (--ci: exit 1): " + ", ".join(breaches), markup=False)
        raise typer.Exit(1)


def _show(summary: RunSummary, as_json: bool, ci: bool) -> None:
    """The result on stdout: ``summary.json``'s text, or the tables (plain under ``--ci``,
    140 columns when piped)."""
    from rich.console import Console

    from lbtune.cli import ci as ci_mode

    if as_json:
        from lbtune.metrics.summary_file import dumps

        sys.stdout.write(dumps(summary) + "\n")
        return
    stdout = Console()
    if ci:
        stdout = ci_mode.console()
    elif not stdout.is_terminal:
        stdout = Console(width=140)
    _print_summary(stdout, summary)


def _run(opts: StressOptions, ci: bool, err: Console, stop: threading.Event) -> StressResult:
    """``run_stress`` with the progress display that fits: plain lines under ``--ci`` or
    when stderr is piped (every few seconds), else a live panel; the run is indexed in the
    history (:func:`lbtune.run.stress.record_stress`)."""
    from lbtune.cli import ci as ci_mode
    from lbtune.cli.ticker import EVERY_S
    from lbtune.run.stress import record_stress, run_stress

    if ci or not err.is_terminal:  # piped: a plain line every few seconds, not live
        lines = (
            ci_mode.StressLines(format_progress)
            if ci
            else ci_mode.StressLines(format_progress, every_s=EVERY_S)
        )
        return run_stress(
            opts, on_progress=lines, say=ci_mode.line, stop=stop, on_result=record_stress
        )
    with _LiveProgress(err, enabled=True) as live:
        return run_stress(
            opts,
            on_progress=live.update,
            say=lambda m: err.print(f"[dim]{m}[/]"),
            stop=stop,
            on_result=record_stress,
        )


def _tell(summary: RunSummary, report_dir: str | None, junit: Path | None, err: Console) -> None:
    """On stderr, a note when the window held too few requests for a P99 and where the
    report is; the JUnit file (--junit) and the GitHub step summary (when
    GITHUB_STEP_SUMMARY is set)."""
    from lbtune.cli import ci as ci_mode

    for note in summary.notes:
        if "too few for a P99" in note:
            err.print(f"note: {note}", markup=False)
    if report_dir is not None:
        err.print(f"report: {report_dir}", markup=False)
    if junit is not None:
        from lbtune.report.junit import stress_suite, write_junit

        write_junit(junit, [stress_suite(summary, report_dir)])
        err.print(f"junit: {junit}", markup=False)
    ci_mode.append_step_summary(ci_mode.stress_markdown(summary, report_dir))


class _OnStop:
    """While entered, Ctrl-C (SIGINT) and SIGTERM (what CI runners and systemd send) stop
    the run: the first sets ``stop``, which the load's supervisor polls (drain, partial
    report); a second one raises KeyboardInterrupt (stop waiting for the drain). A flag
    rather than the KeyboardInterrupt of a first Ctrl-C: that exception lands wherever the
    main thread happens to be, and a run that met it outside the supervisor's loop went on
    sending (seen in CI: generators still running 45 s after Ctrl-C). Only in the main
    thread; elsewhere it does nothing and Ctrl-C stays Python's KeyboardInterrupt."""

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    @property
    def why(self) -> str:
        """How the run was stopped, for the one line that says so."""
        return "terminated (SIGTERM)" if self.signum == signal.SIGTERM else "interrupted"

    @property
    def exit_code(self) -> int:
        """What a shell reports for a process that signal ended: 143 (SIGTERM), 130."""
        return TERMINATED_EXIT if self.signum == signal.SIGTERM else 128 + signal.SIGINT

    def _handler(self, signum: int, frame: object) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt
        self.signum = signum
        self.stop.set()

    def __enter__(self) -> _OnStop:
        if threading.current_thread() is threading.main_thread():
            self._old = {sig: signal.signal(sig, self._handler) for sig in self._SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class _LiveProgress:
    """A one-line rich status refreshed from runner progress snapshots."""

    def __init__(self, console: object, enabled: bool) -> None:
        from rich.console import Console

        assert isinstance(console, Console)
        self._console = console
        self._enabled = enabled
        self._live: object | None = None

    def __enter__(self) -> _LiveProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)  # type: ignore[attr-defined]

    def update(self, p: Progress) -> None:
        """Started on the first snapshot, so errors before the load print cleanly."""
        if not self._enabled:
            return
        if self._live is None:
            from rich.live import Live

            live = Live(console=self._console, refresh_per_second=4, transient=False)
            live.__enter__()
            self._live = live
        self._live.update(format_progress(p))  # type: ignore[attr-defined]


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms"


def format_progress(p: Progress) -> str:
    total = p.elapsed_s + p.remaining_s
    lag = "-" if p.generator_lag_p99_s is None else f"{p.generator_lag_p99_s * 1000:.1f} ms"
    cpu = "-" if p.generator_cpu_percent is None else f"{p.generator_cpu_percent:.0f} %"
    clock = f"{p.elapsed_s:5.0f}/{total:.0f} s"
    if p.remaining_s <= 0:  # past the planned length: only the requests still open remain
        clock = f"{p.elapsed_s:5.0f} s, draining {p.in_flight} requests"
    return (
        f"{clock} | sent {p.sent} done {p.completed} "
        f"in-flight {p.in_flight} | {p.requests_per_s:.1f} req/s {p.output_tokens_per_s:.0f} tok/s"
        f" | TTFT p50 {_ms(p.ttft_p50_s)} p99 {_ms(p.ttft_p99_s)} | errors {p.errors}"
        f" | gen lag {lag} cpu {cpu}"
    )


def fmt_cell(value: object) -> str:
    """Human-sized numbers: 1897.41 -> '1897', 78.52 -> '78.5', 0.0356 -> '0.036'."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    mag = abs(value)
    if mag >= 100:
        return f"{value:.0f}"
    if mag >= 10:
        return f"{value:.1f}"
    if mag >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}".rstrip("0").rstrip(".") if value else "0"


def _print_summary(console: object, s: RunSummary) -> None:
    from rich.console import Console
    from rich.table import Table

    assert isinstance(console, Console)
    from lbtune.report.frame import headline, latency_table, replica_table, warnings

    for w in warnings(s):
        console.print(f"[bold yellow]warning:[/] {w}")
    frames = (
        ("Summary", headline(s)),
        ("Latency", latency_table(s)),
        ("Replicas", replica_table(s)),
    )
    for title, frame in frames:
        t = Table(title=title)
        for col in frame.columns:
            t.add_column(str(col))
        for row in frame.rows:
            t.add_row(*(fmt_cell(c) for c in row))
        console.print(t)
    from lbtune.report.frame import verdict

    console.print(verdict(s), style="bold", markup=False, highlight=False, soft_wrap=True)
