"""`lbtune cluster up|down|status|calibrate` — the embedded default target.

A thin layer over :mod:`lbtune.cluster.api`: parse options, call the library, render
tables (stdout) and progress (stderr). The library is imported inside the commands so
that ``lbtune --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from lbtune.cli.options import JsonOpt, StateDirOpt

if TYPE_CHECKING:
    from rich.console import Console

    from lbtune.cluster.health import ClusterStatus
    from lbtune.records.endpoints import Endpoints
    from lbtune.targets.base import ReplicaRow

app = typer.Typer(
    help=(
        "Run the embedded default cluster: simulated vLLM replicas behind a balancer "
        "(HAProxy by default), scraped by Prometheus (all on 127.0.0.1)."
    ),
    no_args_is_help=True,
)

StateDirOption = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help=(
            "State dir (PID files, logs, configs, endpoints.json). Default: $LBTUNE_STATE_DIR, "
            "else ~/.local/state/lbtune/<cluster name> (down/status: the one running there)."
        ),
    ),
]


def _progress(msg: str) -> None:
    typer.echo(msg, err=True)


def _console() -> Console:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # piped: do not cut URLs at 80 columns
        console = Console(width=max(console.width, 160))
    return console


def _endpoints_table(ep: Endpoints, health: dict[str, str] | None = None) -> None:
    from rich.table import Table

    table = Table(title=f"cluster {ep.config_name}  ({ep.state_dir})")
    for col in ("name", "URL", "GPU", "models", "health"):
        table.add_column(col, no_wrap=col in ("URL", "health"))
    health = health or {}
    ok = "[green]up[/green]"
    table.add_row(f"balancer ({ep.balancer})", ep.balancer_url, "", ", ".join(ep.models), ok)
    table.add_row(f"{ep.balancer} stats", ep.stats_url, "", "", ok)
    table.add_row(f"{ep.balancer} metrics", ep.balancer_metrics_url, "", "", ok)
    table.add_row("Prometheus", ep.prometheus_url, "", "", ok)
    table.add_row("lbtune exporter", ep.exporter_url, "", "", "up during a stress run only")
    if ep.agent_metrics_url is not None:
        table.add_row("feedback agent", ep.agent_metrics_url, "", "", ok)
    for r in ep.replicas:
        gpu = r.gpu or ("external" if r.external else "")
        table.add_row(r.name, r.url, gpu, ", ".join(r.models), health.get(r.name, ok))
    console = _console()
    console.print(table)
    for key, value in sorted(ep.balancer_details.items()):
        console.print(f"{key}: {value}")
    if ep.agent_config is not None:
        console.print(f"agent settings: {ep.agent_config}  (re-read on SIGHUP)")


def _status_tables(st: ClusterStatus, rows: list[ReplicaRow]) -> None:
    from rich.table import Table

    console = _console()
    if st.endpoints is None:
        console.print(f"not running (state dir {st.state_dir})")
        for p in st.problems:
            console.print(f"  {p}")
        return

    def num(v: float | None, fmt: str = "{:.0f}") -> str:
        return "-" if v is None else fmt.format(v)

    health = {r.name: "[green]up[/green]" if r.healthy else "[red]down[/red]" for r in st.replicas}
    _endpoints_table(st.endpoints, health)
    procs = Table(title="processes")
    for col in ("component", "pid", "running", "log"):
        procs.add_column(col)
    for c in st.components:
        procs.add_row(c.name, str(c.pid), "yes" if c.running else "[red]no[/red]", c.log)
    console.print(procs)
    seen = {row.replica: row for row in rows}
    lb = st.endpoints.balancer
    load = Table(title="replica load")
    right = ("running", "waiting", f"{lb} weight", f"{lb} open")
    for col in ("replica", "GPU", *right[:2], "KV usage", f"{lb} status", *right[2:]):
        load.add_column(col, justify="right" if col in right else "left")
    for r in st.replicas:
        row = seen.get(r.name)
        load.add_row(
            r.name,
            r.gpu or "-",
            num(r.running),
            num(r.waiting),
            "-" if r.kv_usage is None else f"{100 * r.kv_usage:.1f} %",
            "-" if row is None else row.status,
            "-" if row is None else num(row.weight),
            "-" if row is None else num(row.active),
        )
    console.print(load)
    verdict = "[green]healthy[/green]" if st.healthy else "[red]unhealthy[/red]"
    console.print(f"cluster {st.endpoints.config_name}: {verdict}")
    for p in st.problems:
        console.print(f"  [red]problem:[/red] {p}")


@app.command()
def up(
    config: Annotated[
        str,
        typer.Option(
            "--config",
            "-c",
            help="Built-in preset (hetero4, mini2, ...) or a path to a cluster YAML.",
        ),
    ] = "hetero4",
    state_dir: StateDirOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the endpoints as JSON to stdout only.")
    ] = False,
) -> None:
    """Start the replicas, the balancer and Prometheus; wait until all are healthy.

    Idempotent: if the same cluster is already running and healthy, report it.
    On any failure everything this command started is stopped again.
    """
    from lbtune.cluster import api

    ep = api.up(config, state_dir, progress=_progress)
    if as_json:
        typer.echo(ep.model_dump_json(indent=2))
    else:
        _endpoints_table(ep)


@app.command()
def down(
    state_dir: StateDirOption = None,
) -> None:
    """Stop exactly what `up` started (by recorded PID, never by name). Idempotent."""
    from lbtune.cluster import api

    stopped = api.down(state_dir)
    if not stopped:
        typer.echo("nothing was running")
    else:
        typer.echo(
            "stopped "
            + ", ".join(f"{n} (pids {' '.join(map(str, p))})" for n, p in stopped.items())
        )


@app.command()
def status(
    state_dir: StateDirOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print endpoints, health and load as JSON (for scripts).")
    ] = False,
) -> None:
    """Show health and per-replica load (running/waiting requests, KV usage) and each
    replica as the balancer sees it (its status, weight and open sessions/requests).

    Exits 0 when healthy, 1 when not running or unhealthy.
    """
    import dataclasses

    from lbtune.cluster import api
    from lbtune.targets import balancer

    st = api.status(state_dir)
    ep = st.endpoints
    rows = balancer(ep.balancer).replica_rows(ep) if ep is not None else []
    if as_json:
        replicas = [dataclasses.asdict(r) for r in rows]  # ints, strings and None only
        doc = {**st.model_dump(mode="json"), "balancer_replicas": replicas}
        typer.echo(json.dumps(doc, indent=2))
    else:
        _status_tables(st, rows)
    if not st.healthy:
        raise typer.Exit(1)


@app.command()
def calibrate(
    state_dir: StateDirOpt = None,
    replica: Annotated[
        list[str] | None,
        typer.Option(
            "--replica", "-r", metavar="NAME", help="Measure only this replica (repeatable)."
        ),
    ] = None,
    long_tokens: Annotated[
        int,
        typer.Option(
            "--prompt-tokens",
            min=64,
            help="The long probe prompt, in tokens (capped at a quarter of the context).",
        ),
    ] = 512,
    repeats: Annotated[
        int, typer.Option("--repeats", min=1, max=20, help="Requests per measured point.")
    ] = 3,
    as_json: JsonOpt = False,
) -> None:
    """Measure each replica's engine rates (prefill tokens/s, decode step, its growth per
    running request, per-request overhead) with a few requests sent straight to it, one
    replica at a time, and write them to calibration.json in the state dir.

    The `llm` scheduler's `mode: predict` uses them for replicas whose GPU and model lbtune
    has no profile of (a real vLLM, an unknown GPU): a running scheduler takes them at
    once, without a reload. Run it with no other traffic on the cluster.

    Example: lbtune cluster calibrate --state-dir ./state --replica vllm-0
    """
    from lbtune.cluster import api
    from lbtune.cluster.calibrate import calibrate as run
    from lbtune.cluster.calibrate import hand_to_scheduler
    from lbtune.cluster.probing import ProbePlan
    from lbtune.errors import ClusterError
    from lbtune.records.statedir import StatePaths, read_endpoints

    paths = StatePaths(api.find_state_dir(state_dir))
    ep = read_endpoints(paths)
    if ep is None or not api.status(paths.root).running:
        raise ClusterError(f"no cluster is running in {paths.root}; run `lbtune cluster up`")
    plan = ProbePlan(long_tokens=long_tokens, repeats=repeats)
    cal = run(ep, replica or (), plan, progress=_progress)
    if hand_to_scheduler(ep):
        _progress("the running llm scheduler took the rates (no reload)")
    else:
        _progress(
            f"saved; {ep.balancer} runs no llm scheduler: an apply of algorithm llm uses them"
        )
    if as_json:
        typer.echo(cal.model_dump_json(indent=2))
        return
    from rich.table import Table

    table = Table(title=f"calibration  ({paths.calibration})")
    cols = ("replica", "model", "prefill tok/s", "decode step", "+ per request", "overhead", "fit")
    for col in cols:
        table.add_column(col, justify="left" if col in ("replica", "model") else "right")
    for r in cal.replicas:
        table.add_row(
            r.name,
            r.model,
            f"{r.prefill_tokens_per_s:,.0f}",
            f"{1000 * r.step_s:.2f} ms",
            f"{1000 * r.step_per_seq_s:.3f} ms",
            f"{1000 * r.overhead_s:.2f} ms",
            f"±{100 * r.fit_error:.0f} %",
        )
    _console().print(table)
