"""`lbtune twin run`: a what-if in virtual time — figures for a config, a scenario or a
cluster with a replica more or less, without touching any balancer.

Thin: parse, call :mod:`lbtune.twin` with the cluster's replicas and the balancer's own
routing model (``lbtune/targets/<balancer>/twin.py``), render. The glue that turns a
cluster file into twin replicas and a full parameter set (:func:`twin_cluster`,
:func:`twin_params`) lives here until a library module above ``cluster`` owns it.
"""

from __future__ import annotations

import importlib
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from lbtune.cli.options import JsonOpt, ScenarioOpt, SeedOpt

if TYPE_CHECKING:
    from lbtune.cluster.config import ClusterConfig
    from lbtune.objective import Figures
    from lbtune.targets.params import ParamSet
    from lbtune.twin.replica import TwinReplica
    from lbtune.twin.result import TwinRun
    from lbtune.twin.routing import RoutingFactory

__all__ = [
    "TwinCluster",
    "app",
    "routing_factory",
    "space_path",
    "twin_cluster",
    "twin_figures",
    "twin_params",
]

app = typer.Typer(
    help="The virtual-time twin: a run of the embedded cluster simulated in seconds of CPU.",
    no_args_is_help=True,
)
_DELTA = re.compile(r"^(?P<group>[A-Za-z0-9_.-]*?)(?P<sign>[+-])(?P<n>\d+)$")


@dataclass(frozen=True)
class TwinCluster:
    """A cluster file as the twin sees it."""

    config: ClusterConfig
    replicas: list[TwinReplica]
    source: str


def twin_cluster(ref: str | None, delta: str | None = None) -> TwinCluster:
    """The replicas of cluster ``ref`` (a preset or a file), named as ``lbtune cluster up``
    names them; ``delta`` changes them: ``+1``/``-1`` (the first replica group),
    ``GROUP+N``/``GROUP-N`` (by its name prefix, e.g. ``l4-1``) or another cluster file
    whose replicas replace them."""
    from lbtune.cluster.config import load_config, parse_config, resolve
    from lbtune.errors import ConfigError
    from lbtune.twin.replica import TwinReplica

    cfg, path = load_config(ref)
    source = str(path)
    if delta is not None:
        m = _DELTA.match(delta.strip())
        if m is None:
            other, other_path = load_config(delta)
            cfg = cfg.model_copy(update={"replicas": other.replicas})
            source = f"{path} with the replicas of {other_path}"
        else:
            groups = list(cfg.replicas)
            names = [g.prefix for g in groups]
            want = m["group"] or (names[0] if names else "")
            if want not in names:
                raise ConfigError(
                    f"--replicas {delta}: no replica group {want!r}; groups: {', '.join(names)}"
                )
            i = names.index(want)
            n = groups[i].count + (int(m["n"]) if m["sign"] == "+" else -int(m["n"]))
            if n < 0:
                raise ConfigError(f"--replicas {delta}: group {want} has {groups[i].count}")
            groups[i] = groups[i].model_copy(update={"count": n})
            data = cfg.model_dump()
            data["replicas"] = [g.model_dump() for g in groups if g.count > 0]
            cfg = parse_config(data, f"{path} with --replicas {delta}")
            source = f"{path} with --replicas {delta}"
    if not cfg.replicas:
        raise ConfigError(
            f"{source}: the twin simulates the embedded cluster's simulated replicas; "
            "this cluster has none (external or real vLLM servers)"
        )
    ports = itertools.count(1)
    resolved = resolve(cfg, pick_port=lambda: next(ports))
    replicas = [TwinReplica(r.name, r.gpu or "", r.models) for r in resolved.replicas]
    return TwinCluster(cfg, replicas, source)


def space_path(balancer: str) -> Path:
    """The packaged ``space.yaml`` of ``balancer``."""
    from lbtune.targets import TARGETS

    module = importlib.import_module(TARGETS[balancer].split(":", 1)[0])
    return Path(str(module.__file__)).with_name("space.yaml")


def routing_factory(balancer: str) -> RoutingFactory:
    """``routing_model`` of ``lbtune/targets/<balancer>/twin.py``; ConfigError if none."""
    from lbtune.errors import ConfigError
    from lbtune.targets import TARGETS
    from lbtune.targets import balancer as entry

    entry(balancer)  # an unknown name lists the names
    package = TARGETS[balancer].split(":", 1)[0].rsplit(".", 1)[0]
    try:
        factory: RoutingFactory = importlib.import_module(package + ".twin").routing_model
    except (ModuleNotFoundError, AttributeError):
        raise ConfigError(f"the twin has no routing model of balancer {balancer!r}") from None
    return factory


def twin_params(
    tc: TwinCluster, params_file: Path | None, sets: Sequence[str]
) -> tuple[ParamSet, list[str]]:
    """The full parameter set: the balancer's baseline, the cluster's ``params``, the file,
    then each ``--set KNOB=VALUE``; and notes (knobs without effect on this cluster)."""
    import yaml

    from lbtune.apply.paramfile import read_params_for
    from lbtune.errors import ConfigError
    from lbtune.targets.space import ParameterSpace

    balancer = tc.config.balancer
    space = ParameterSpace.load(space_path(balancer), [r.name for r in tc.replicas])
    params = space.baseline()
    params.update(space.validate(tc.config.params, f"{tc.source}: params"))
    if params_file is not None:
        params.update(space.validate(read_params_for(params_file, balancer), str(params_file)))
    for item in sets:
        knob, eq, text = item.partition("=")
        if not eq:
            raise ConfigError(f"--set {item!r}: expected KNOB=VALUE (e.g. algorithm=leastconn)")
        params.update(space.validate({knob.strip(): yaml.safe_load(text)}, "--set"))
    notes = []
    if not tc.config.agent.enabled:
        agent = sorted(k for k in params if k.startswith("agent."))
        for k in agent:
            del params[k]
        if agent:
            notes.append("agent.* knobs have no effect: this cluster runs no feedback agent")
    return params, notes


def twin_figures(run: TwinRun) -> tuple[Figures, float]:
    """A study trial's figures of a twin run (summary, with the censored samples' P99s) and
    its composite score under the scenario's SLO."""
    from lbtune.objective import composite, figures_from_summary
    from lbtune.search.tail import scored_figures
    from lbtune.tune.options import objective_spec

    fig = scored_figures(figures_from_summary(run.summary()), run.censored())
    return fig, composite(fig, objective_spec("composite", run.plan.slo_value(), None))


ConfigOpt = Annotated[
    str | None,
    typer.Option("--config", "-c", help="Cluster preset or YAML file (default: hetero4)."),
]
ReplicasOpt = Annotated[
    str | None,
    typer.Option(
        "--replicas",
        help="What-if: +1 / -1 replica of the first group, GROUP+N / GROUP-N (e.g. l4-1), "
        "or a cluster YAML whose replicas replace the cluster's.",
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="KNOB=VALUE over the params (repeatable), e.g. algorithm=llm."),
]


@app.command("run")
def run_command(
    config: ConfigOpt = None,
    scenario: ScenarioOpt[str] = "chat",
    params: Annotated[
        Path | None, typer.Option("--params", "-p", help="YAML file of knob: value.")
    ] = None,
    set_: SetOpt = None,
    duration: Annotated[
        float | None,
        typer.Option("--duration", "-d", help="Virtual seconds (default: the scenario's)."),
    ] = None,
    users: Annotated[int | None, typer.Option("--users", "-u", help="Closed-loop users.")] = None,
    rate: Annotated[float | None, typer.Option("--rate", "-r", help="Open-loop req/s.")] = None,
    seed: SeedOpt = None,
    replicas: ReplicasOpt = None,
    time_scale: Annotated[
        float | None, typer.Option("--time-scale", help="Override the cluster's time_scale.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Simulate one run of SCENARIO against the cluster with a parameter set, in virtual
    time: the figures `lbtune stress` would print, computed the same way, plus the
    composite score a study would give them. Knobs the twin does not model are named.

    Example: lbtune twin run -s mixed --set algorithm=leastconn --replicas l4-1
    """
    from rich.console import Console

    from lbtune.run.plan import plan_run
    from lbtune.run.stress import StressOptions, check_bounds
    from lbtune.twin.options import TwinOptions
    from lbtune.twin.run import simulate

    tc = twin_cluster(config, replicas)
    values, notes = twin_params(tc, params, set_ or [])
    opts = StressOptions(scenario=scenario, duration_s=duration, users=users, rate=rate, seed=seed)
    check_bounds(opts)
    plan = plan_run(opts)
    model = routing_factory(tc.config.balancer)(values, tc.replicas, seed=plan.seed)
    scale = tc.config.time_scale if time_scale is None else time_scale
    run = simulate(
        plan, tc.replicas, model, TwinOptions(time_scale=scale, host_seed=tc.config.seed)
    )
    fig, score = twin_figures(run)
    facts = _facts(tc, values, notes, run, scale)
    if as_json:
        from lbtune.metrics.summary_file import dumps
        from lbtune.objective import FIGURES
        from lbtune.records.jsonform import json_data

        out = {"twin": facts, "figures": json_data(FIGURES, fig), "score": score}
        out["summary"] = json.loads(dumps(run.summary()))
        typer.echo(json.dumps(out, indent=2, allow_nan=False))
        return
    from lbtune.cli.stress import _print_summary

    err = Console(stderr=True)
    for knob in run.unmodeled:
        err.print(f"warning: not modeled by the twin: {knob}", markup=False)
    for note in notes:
        err.print(f"note: {note}", markup=False)
    stdout = Console() if Console().is_terminal else Console(width=140)
    _print_summary(stdout, run.summary())
    stdout.print(_describe(facts, score, fig), markup=False, highlight=False)


def _facts(
    tc: TwinCluster, values: Mapping[str, Any], notes: list[str], run: TwinRun, scale: float
) -> dict[str, Any]:
    return {
        "cluster": tc.source,
        "balancer": tc.config.balancer,
        "replicas": [r.name for r in tc.replicas],
        "time_scale": scale,
        "params": dict(values),
        "unmodeled": list(run.unmodeled),
        "notes": notes,
        "virtual_s": run.virtual_s,
        "cpu_s": run.cpu_s,
        "events": run.events,
        "requests": len(run.records),
    }


def _describe(facts: Mapping[str, Any], score: float, fig: Figures) -> str:
    speed = facts["virtual_s"] / facts["cpu_s"] if facts["cpu_s"] > 0 else float("inf")
    return (
        f"twin: {facts['requests']} requests over {facts['virtual_s']:.0f} virtual s in "
        f"{facts['cpu_s']:.2f} CPU s ({speed:.0f}x); composite score {score:.3f} "
        f"(P99 E2E {fig.p99_e2e_s:.3g} s, P99 TTFT {fig.p99_ttft_s:.3g} s over "
        f"{fig.samples} samples)"
    )
