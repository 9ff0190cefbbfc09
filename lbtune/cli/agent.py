"""`lbtune agent run` — the LLM-aware feedback agent that sets a balancer's weights live.

Thin: parse flags, build the config (defaults < running cluster's endpoints < --config
file < flags), hand the agent its actuator (:func:`connect`: the registry entry of the
cluster's balancer), call :mod:`lbtune.agent.loop`, render. The library is imported inside
the command so that ``lbtune --help`` stays fast.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import typer

from lbtune.cli.options import JsonOpt, PrometheusOpt, StateDirOpt

if TYPE_CHECKING:
    from lbtune.agent.config import AgentConfig
    from lbtune.agent.loop import StepResult
    from lbtune.targets.base import LiveWeights

app = typer.Typer(
    help=(
        "The feedback agent: every interval, score each replica from Prometheus (KV-cache "
        "usage, waiting queue, recent TTFT) and set the balancer's weights live (HAProxy: its "
        "runtime API), "
        "with guard rails (min weight, max step, drain on full KV cache, never all at zero)."
    ),
    no_args_is_help=True,
)


def connect(cfg: AgentConfig) -> LiveWeights:
    """The live weights of the balancer of the cluster in ``cfg.state_dir`` (else the
    running cluster), through its registry entry."""
    from lbtune.cluster.api import find_state_dir
    from lbtune.errors import TargetError
    from lbtune.records.statedir import StatePaths, read_endpoints
    from lbtune.targets import balancer

    paths = StatePaths(find_state_dir(cfg.state_dir))
    ep = read_endpoints(paths)
    if ep is None:
        raise TargetError(
            f"No running cluster in {paths.root} (no endpoints.json): the agent steers the "
            "balancer of an lbtune cluster (`lbtune cluster up`, or --state-dir)"
        )
    return balancer(ep.balancer).weights(ep)


def _cluster_defaults(state_dir: Path | None) -> dict[str, Any]:
    """Prometheus URL and state dir of the running embedded cluster, if there is one."""
    from lbtune.cluster.api import find_state_dir
    from lbtune.errors import ClusterError
    from lbtune.records.statedir import StatePaths, read_endpoints

    try:
        ep = read_endpoints(StatePaths(find_state_dir(state_dir)))
    except ClusterError as exc:
        logging.getLogger("lbtune.agent").warning("cluster endpoints not used: %s", exc)
        return {}
    if ep is None:
        return {}
    return {"prometheus_url": ep.prometheus_url, "state_dir": ep.state_dir}


class DecisionRow(TypedDict):
    """One replica's decision as ``--once`` shows it (and ``--json`` prints it)."""

    replica: str
    previous: int
    weight: int
    target: int | None
    score: float | None
    kv_norm: float | None
    latency_norm: float | None
    queue_norm: float | None
    reasons: list[str]


def _rows(result: StepResult) -> list[DecisionRow]:
    rows: list[DecisionRow] = []
    for d in result.decisions:
        n = d.smoothed
        rows.append(
            {
                "replica": d.replica,
                "previous": d.previous,
                "weight": d.weight,
                "target": d.target,
                "score": None if d.score is None else round(d.score, 4),
                "kv_norm": None if n is None else round(n.kv, 4),
                "latency_norm": None if n is None or n.latency is None else round(n.latency, 4),
                "queue_norm": None if n is None else round(n.queue, 4),
                "reasons": list(d.reasons),
            }
        )
    return rows


def _print_table(rows: list[DecisionRow], applied: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    def f(v: object) -> str:
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    table = Table(title="agent decisions" + ("" if applied else " (not applied)"))
    for col in ("replica", "weight", "target", "score", "kv", "latency", "queue", "reasons"):
        table.add_column(col, no_wrap=col != "reasons")
    for r in rows:
        weight = (
            f"{r['previous']} → {r['weight']}" if r["previous"] != r["weight"] else f(r["weight"])
        )
        table.add_row(
            r["replica"],
            weight,
            f(r["target"]),
            f(r["score"]),
            f(r["kv_norm"]),
            f(r["latency_norm"]),
            f(r["queue_norm"]),
            ", ".join(r["reasons"]),
        )
    Console().print(table)


@app.command("run")
def run(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="Agent settings (YAML or JSON; see docs/agent.md). Re-read on SIGHUP.",
        ),
    ] = None,
    prometheus: PrometheusOpt = None,
    interval: Annotated[
        float | None, typer.Option("--interval", help="Seconds between steps (default 2).")
    ] = None,
    port: Annotated[
        int | None,
        typer.Option("--port", help="Serve /metrics on 127.0.0.1:PORT (default 9492; 0 = any)."),
    ] = None,
    state_dir: StateDirOpt = None,
    once: Annotated[
        bool, typer.Option("--once", help="One step: print the decision table and exit.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Compute and show decisions; set no weight.")
    ] = False,
    as_json: JsonOpt = False,
    allow_remote: Annotated[
        bool,
        typer.Option("--allow-remote", help="Allow a --prometheus on another machine."),
    ] = False,
) -> None:
    """Run the agent until SIGTERM/Ctrl-C (SIGHUP re-reads --config), or one step with --once.

    It steers the balancer of the lbtune cluster in --state-dir (default: the running one).
    --json (with --once) prints the step's decisions as JSON.
    """
    import threading

    from lbtune.agent.config import load_agent_config
    from lbtune.agent.loop import install_signal_handlers
    from lbtune.agent.loop import run as run_loop

    if as_json and not once:
        raise typer.BadParameter("--json goes with --once", param_hint="--json")
    overrides: dict[str, Any] = {
        "prometheus_url": prometheus,
        "state_dir": str(state_dir) if state_dir is not None else None,
        "interval_s": interval,
        "metrics_port": port,
        "allow_remote": allow_remote or None,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    defaults = _cluster_defaults(state_dir)
    cfg = load_agent_config(config, overrides, defaults)
    if once:
        _once(cfg, dry_run, as_json)
        return
    agent_log = logging.getLogger("lbtune.agent")
    if agent_log.getEffectiveLevel() > logging.INFO:
        agent_log.setLevel(logging.INFO)  # the decisions are this command's output
    stop, reload = threading.Event(), threading.Event()
    install_signal_handlers(stop, reload)
    run_loop(
        cfg,
        stop,
        reload_event=reload,
        config_path=config,
        overrides=overrides,
        defaults=defaults,
        connect=connect,
        dry_run=dry_run,
    )


def _once(cfg: AgentConfig, dry_run: bool, as_json: bool) -> None:
    """``--once``: one step, its decisions printed (a table, or JSON)."""
    from lbtune.agent.loop import Agent
    from lbtune.errors import TargetError

    agent = Agent(cfg, connect=connect, dry_run=dry_run)
    result = agent.step()
    if not result.ok:
        raise TargetError(next(iter(agent.down.values()), f"step failed ({result.error})"))
    rows = _rows(result)
    applied = cfg.enabled and not dry_run
    if as_json:
        typer.echo(json.dumps({"applied": applied, "decisions": rows}, indent=2))
    else:
        _print_table(rows, applied)
