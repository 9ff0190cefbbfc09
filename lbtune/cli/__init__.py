"""The ``lbtune`` command line: parse, call the library, render. No logic lives here.

Each command group is a small module in this package that imports the library
lazily inside its functions, so ``lbtune --help`` stays fast and importing
``lbtune.cli`` pulls in neither locust/gevent, optuna, pandas nor ansible-runner.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any

import typer
import typer.core

from lbtune import __version__
from lbtune.cli import agent as _agent
from lbtune.cli import apply as _apply
from lbtune.cli import capacity as _capacity
from lbtune.cli import cluster as _cluster
from lbtune.cli import compare as _compare
from lbtune.cli import history as _history
from lbtune.cli import optimize as _optimize
from lbtune.cli import scenarios as _scenarios
from lbtune.cli import stress as _stress
from lbtune.cli import twin as _twin
from lbtune.errors import TERMINATED_EXIT, LbtuneError, printable
from lbtune.safety.secrets import ScrubFilter, scrub


def _no_type_for_switches() -> None:
    """Typer's rich help prints a type for every option (``--json <bool>``, ``-v <int>``),
    which reads as if on/off flags and counters took a value: show none for those."""
    option = typer.core.TyperOption
    shown = option.display_type_rich

    def display_type_rich(self: typer.core.TyperOption, ctx: Any) -> str | None:
        if self.is_flag or self.count:
            return None
        return shown(self, ctx)

    option.display_type_rich = display_type_rich  # type: ignore[method-assign]


_no_type_for_switches()

PIPED_COLUMNS = 140
"""Width of tables and help when stdout is not a terminal (a log, ``| tee``): rich would
otherwise wrap them at 80 columns."""

app = typer.Typer(
    name="lbtune",
    help=(
        "Load-test LLM inference clusters behind a load balancer and tune the balancer.\n\n"
        "Start with `lbtune cluster up` to run the embedded default cluster "
        "(simulated vLLM replicas behind HAProxy, scraped by Prometheus)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(_cluster.app, name="cluster")
app.add_typer(_scenarios.app, name="scenarios")
app.add_typer(_agent.app, name="agent")
app.add_typer(_twin.app, name="twin")
app.command("stress")(_stress.stress_command)
app.command("optimize")(_optimize.optimize_command)
app.command("apply")(_apply.apply_command)
app.command("rollback")(_apply.rollback_command)
app.command("dashboard")(_optimize.dashboard_command)
app.command("compare")(_compare.compare_command)
app.command("capacity")(_capacity.capacity_command)
app.command("history")(_history.history_command)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"lbtune {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More log output (-vv)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only warnings and errors."),
) -> None:
    """Configure logging on stderr; results go to stdout."""
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    if verbose == 0 and not quiet:
        level = logging.WARNING
    _configure_logging(level)


def _configure_logging(level: int) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    handler = RichHandler(console=Console(stderr=True), show_path=False, show_time=False)
    handler.addFilter(ScrubFilter())  # no secret of this process in a log line
    logging.basicConfig(level=level, handlers=[handler], format="%(message)s", force=True)


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM (what CI runners, systemd and ``kill`` send) unwinds the command as an error
    would: every ``finally`` runs, so a balancer config it changed is put back (``twin
    check``, a capacity ``--compare``) and what it started is stopped; exit 143. ``stress``
    and ``optimize`` take SIGTERM over while they run (a graceful stop, a partial report)."""
    sys.stderr.write("terminated (SIGTERM)\n")
    raise SystemExit(TERMINATED_EXIT)


def main() -> None:
    """Console-script entry point: user-fixable errors become one line and exit 2/3.

    Click (standalone mode) already turns usage errors into a message and exit 2;
    lbtune's own errors pass through it and are printed here without a traceback.
    """
    if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        os.environ["COLUMNS"] = str(PIPED_COLUMNS)
    main_thread = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        app()
    except LbtuneError as exc:
        # One line: a name's ANSI escape or newline is shown escaped; no secret is shown.
        typer.echo(f"error: {printable(scrub(str(exc)))}", err=True)
        sys.exit(exc.exit_code)
    finally:
        if main_thread and before is not None:  # an in-process caller gets its own back
            signal.signal(signal.SIGTERM, before)
