"""`lbtune capacity` — the highest offered rate at which the SLO holds for a share of
requests, with a CI. Thin: parse, build the probes, call :mod:`lbtune.capacity`, render."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from lbtune.cli.options import JsonOpt, OutOpt, ScenarioOpt, SeedOpt, StateDirOpt

if TYPE_CHECKING:
    from lbtune.capacity.probes import TwinCase
    from lbtune.capacity.search import ProbeResult
    from lbtune.records.slo import Slo
    from lbtune.run.stress import StressOptions

__all__ = ["capacity_command", "fraction"]


def fraction(text: str, flag: str) -> float:
    """``10%`` or ``0.1`` as 0.1; a one-line ConfigError otherwise."""
    from lbtune.errors import ConfigError

    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected a share like 10% or 0.1") from None
    if not 0 < v < 1:
        raise ConfigError(f"{flag} {text!r}: must be between 0 and 100 % (exclusive)")
    return v


def capacity_command(
    scenario: ScenarioOpt[str] = "chat",
    slo: Annotated[
        str | None,
        typer.Option(
            "--slo",
            help="Per-request bounds, e.g. ttft=1s,tpot=100ms,e2e=20s (default: the "
            "scenario's ttft and e2e).",
        ),
    ] = None,
    attainment: Annotated[
        str, typer.Option("--attainment", help="Share of requests that must meet the SLO.")
    ] = "0.99",
    precision: Annotated[
        str, typer.Option("--precision", help="Stop when the CI is narrower than this share.")
    ] = "10%",
    target: Annotated[
        str | None,
        typer.Option("--target", help="Balancer base URL. Default: the embedded cluster."),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option("--probe-duration", "-d", help="Seconds per probe (default: the scenario's)."),
    ] = None,
    samples: Annotated[
        int,
        typer.Option(
            "--probe-samples",
            help="Requests each probe's window should hold (sets its length; more: a "
            "narrower CI per probe).",
        ),
    ] = 200,
    max_duration: Annotated[
        float, typer.Option("--probe-max-duration", help="The longest a probe may last (s).")
    ] = 120.0,
    start_rate: Annotated[
        float, typer.Option("--start-rate", help="First probe's req/s without a twin bracket.")
    ] = 1.0,
    max_probes: Annotated[int, typer.Option("--max-probes", help="Live probes at most.")] = 12,
    twin: Annotated[
        bool,
        typer.Option(
            "--twin/--no-twin",
            help="Place the bracket with the twin first (embedded cluster, a modeled balancer).",
        ),
    ] = True,
    config: Annotated[
        str | None,
        typer.Option("--config", "-c", help="Cluster the twin models (default: the running one)."),
    ] = None,
    seed: SeedOpt = None,
    out: OutOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Search the capacity at SLO: probes are ordinary stress runs (open loop) at rates
    the search picks; it stops when the capacity's CI is narrower than --precision, and
    reports attainment vs rate, the fitted curve and the capacity (capacity.json).

    Example: lbtune capacity -s mixed --slo ttft=1s,tpot=100ms,e2e=20s --attainment 0.95
    """
    from rich.console import Console

    from lbtune.capacity.probes import ProbeShape
    from lbtune.capacity.report import describe, dumps
    from lbtune.capacity.run import CapacityOptions, check_slo, run_capacity
    from lbtune.capacity.search import SearchOptions
    from lbtune.run.stress import StressOptions, default_out_dir

    share = fraction(attainment, "--attainment")
    base = StressOptions(
        scenario=scenario,
        target_url=target,
        duration_s=duration,
        seed=seed,
        state_dir=state_dir,
        write_report=False,
    )
    the_slo = _slo(base, slo)
    check_slo(the_slo, share)
    err = Console(stderr=True)
    case = _twin_case(base, config) if twin and target is None else None
    out_dir = out or default_out_dir(Path("reports"), f"capacity-{scenario}")
    search = SearchOptions(
        attainment=share,
        precision=fraction(precision, "--precision"),
        start_rate=start_rate,
        max_probes=max_probes,
    )
    opts = CapacityOptions(
        base, the_slo, out_dir, search, case, shape=ProbeShape(samples, max_duration)
    )

    def on_probe(p: ProbeResult) -> None:
        att = f"{p.met / p.judged:.2%}" if p.judged else "-"
        behind = f" (generator behind: {'; '.join(p.behind)})" if p.behind else ""
        err.print(
            f"{p.source} probe {p.rate:.4g} req/s: {att} of {p.judged} met the SLO{behind}",
            markup=False,
            highlight=False,
        )

    report = run_capacity(opts, on_probe=on_probe, say=lambda m: err.print(m, markup=False))
    if as_json:
        typer.echo(dumps(report))
        return
    for line in describe(report):
        typer.echo(line)
    typer.echo(f"report: {out_dir / 'capacity.json'}")


def _slo(base: StressOptions, text: str | None) -> Slo:
    """The scenario's SLO with ``--slo``'s per-request bounds over it (TPOT included)."""
    from lbtune.records.slo import parse_slo
    from lbtune.run.plan import plan_run

    return parse_slo(text, plan_run(base).slo_value(), tpot=True)


def _twin_case(base: StressOptions, config: str | None) -> TwinCase | None:
    """The twin of the embedded cluster (``config``, else the running one, else the
    default preset) behind its balancer's routing model; None, said, when it has none."""
    from lbtune.capacity.probes import TwinCase
    from lbtune.cli.twin import routing_factory, twin_cluster, twin_params
    from lbtune.cluster import api
    from lbtune.errors import ConfigError
    from lbtune.run.target import live_config
    from lbtune.twin.options import TwinOptions

    ep = api.status(base.state_dir).endpoints
    ref = config or (ep.config_path if ep is not None else None)
    try:
        tc = twin_cluster(ref)
        factory = routing_factory(tc.config.balancer)
    except ConfigError as exc:
        typer.echo(f"note: no twin bracket ({exc})", err=True)
        return None
    values, _ = twin_params(tc, None, [])
    if ep is not None and config is None:
        live, _ = live_config(ep)
        values.update({k: v for k, v in (live or {}).items() if k in values})
    options = TwinOptions(time_scale=tc.config.time_scale, host_seed=tc.config.seed)
    return TwinCase(tc.replicas, lambda plan: factory(values, tc.replicas, seed=plan.seed), options)
