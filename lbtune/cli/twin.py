"""`lbtune twin run`: a what-if in virtual time — figures for a config, a scenario or a
cluster with a replica more or less, without touching any balancer; `lbtune twin check`:
how close the twin comes to the live cluster.

Thin: parse, call the library — :mod:`lbtune.cluster.twin` (the cluster's replicas and its
balancer's routing model), :mod:`lbtune.twin` (the simulation), :mod:`lbtune.tune.virtual`
(the figures a study gives a run) — and render.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from lbtune.cli.options import JsonOpt, ScenarioOpt, SeedOpt, StateDirOpt, TwinProfileOpt
from lbtune.cli.twin_view import check_json, check_lines, fit_lines

if TYPE_CHECKING:
    from lbtune.cluster.twin import TwinCluster
    from lbtune.objective import Figures
    from lbtune.twin.result import TwinRun

__all__ = ["app", "overlays"]

app = typer.Typer(
    help="The virtual-time twin: a run of the embedded cluster simulated in seconds of CPU.",
    no_args_is_help=True,
)


def overlays(
    balancer: str, params_file: Path | None, sets: Sequence[str]
) -> list[tuple[str, Mapping[str, object]]]:
    """``--params FILE`` then each ``--set KNOB=VALUE``, as :func:`lbtune.cluster.twin.
    twin_params` layers them over the baseline."""
    import yaml

    from lbtune.apply.paramfile import read_params_for
    from lbtune.errors import ConfigError

    out: list[tuple[str, Mapping[str, object]]] = []
    if params_file is not None:
        out.append((str(params_file), read_params_for(params_file, balancer)))
    for item in sets:
        knob, eq, text = item.partition("=")
        if not eq:
            raise ConfigError(f"--set {item!r}: expected KNOB=VALUE (e.g. algorithm=leastconn)")
        out.append(("--set", {knob.strip(): yaml.safe_load(text)}))
    return out


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
    twin_profile: TwinProfileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Simulate one run of SCENARIO against the cluster with a parameter set, in virtual
    time: the figures `lbtune stress` would print, computed the same way, plus the
    composite score a study would give them. Knobs the twin does not model are named.

    Example: lbtune twin run -s mixed --set algorithm=leastconn --replicas l4-1
    """
    from rich.console import Console

    from lbtune.cluster.twin import twin_cluster, twin_params
    from lbtune.run.plan import plan_run
    from lbtune.run.stress import StressOptions, check_bounds
    from lbtune.tune.virtual import twin_figures
    from lbtune.twin.fitted import read_profile
    from lbtune.twin.run import simulate

    profile = read_profile(twin_profile) if twin_profile is not None else None
    tc = twin_cluster(config, replicas, profile)
    values, notes = twin_params(tc, overlays(tc.balancer, params, set_ or []))
    opts = StressOptions(scenario=scenario, duration_s=duration, users=users, rate=rate, seed=seed)
    check_bounds(opts)
    plan = plan_run(opts)
    model = tc.routing(values, seed=plan.seed)
    twin_opts = tc.options(time_scale)
    run = simulate(plan, tc.replicas, model, twin_opts)
    fig, score = twin_figures(run)
    facts = _facts(tc, values, notes, run, twin_opts.time_scale)
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


@app.command("check")
def check_command(
    scenario: ScenarioOpt[str] = "mixed",
    configs: Annotated[
        int, typer.Option("--configs", "-n", help="Configs to measure, 3 to 20.")
    ] = 6,
    duration: Annotated[
        float, typer.Option("--duration", "-d", help="Seconds of load per config, 5 to 60.")
    ] = 15.0,
    seed: SeedOpt = None,
    draw_seed: Annotated[int, typer.Option("--draw-seed", help="Seed of the drawn configs.")] = 0,
    users: Annotated[
        int | None, typer.Option("--users", "-u", help="Closed-loop users (the scenario's).")
    ] = None,
    rounds: Annotated[
        int,
        typer.Option(
            "--rounds",
            help="Measure every config this many times, 1 to 4, in interleaved rounds "
            "(every other one reversed, each on its own seed): a drifting cluster shifts "
            "every config alike.",
        ),
    ] = 1,
    state_dir: StateDirOpt = None,
    twin_profile: TwinProfileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """How close the twin comes to the running cluster: CONFIGS configs (the live one,
    round robin, least-conn, then random draws of the balancer's space) each applied and
    measured live for DURATION s, then simulated on the same recorded plan; the rank
    correlation of the composite scores and the median error of P99 E2E, P99 TTFT and
    req/s, with 95 % bootstrap intervals over the configs. Changes the live balancer while
    it runs (the live config is put back at the end); about ROUNDS x CONFIGS x
    (DURATION + 5) s.

    Example: lbtune twin check -s mixed -n 6 -d 15 --rounds 2
    """
    from rich.console import Console

    from lbtune.tune.twincheck import CheckOptions, check_twin

    err = Console(stderr=True)
    from lbtune.twin.fitted import read_profile

    profile = read_profile(twin_profile) if twin_profile is not None else None
    opts = CheckOptions(
        scenario, configs, duration, seed, draw_seed, state_dir, profile, users, rounds
    )
    res = check_twin(opts, lambda m: err.print(m, markup=False, highlight=False))
    if as_json:
        typer.echo(json.dumps(check_json(res), indent=2, allow_nan=False))
        return
    for line in check_lines(res):
        typer.echo(line)


@app.command("fit")
def fit_command(
    scenario: ScenarioOpt[str] = "chat",
    duration: Annotated[
        float, typer.Option("--duration", "-d", help="Seconds of the live validation run.")
    ] = 30.0,
    seed: SeedOpt = None,
    batch: Annotated[
        int, typer.Option("--batch", help="Requests at once in the batch decode probes.")
    ] = 8,
    runs: Annotated[
        int, typer.Option("--runs", help="Live validation runs, 1 to 5 (each its own seed).")
    ] = 2,
    no_validate: Annotated[
        bool, typer.Option("--no-validate", help="Fit only: no live validation run.")
    ] = False,
    save: Annotated[
        Path | None,
        typer.Option(
            "--save", help="Profile file to write (default: twin-profile.json in the state dir)."
        ),
    ] = None,
    baseline: Annotated[
        Path | None,
        typer.Option(
            "--baseline",
            help="An earlier profile: name each replica that got slower since, and by how much.",
        ),
    ] = None,
    fail_on_drift: Annotated[
        str | None,
        typer.Option(
            "--fail-on-drift",
            help="With --baseline: exit 1 when a replica's decode or prefill got slower by "
            "more than this (e.g. 10%) and beyond the fits' noise.",
        ),
    ] = None,
    steady: Annotated[
        bool | None,
        typer.Option(
            "--steady/--no-steady",
            help="Keep each replica busy (closed loop, --batch streams, 20 s) to measure its "
            "step and front end under load. Default: where the replicas share CPUs (the "
            "vllm-cpu preset), all at once there.",
        ),
    ] = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Fit the twin to the running cluster's replicas from measurements: per replica,
    straight at it and one at a time, a calibration twice (decode step, per-request slope,
    prefill rate, overhead), the decode step at a batch with short and long prompts, the
    KV cache's size from its /metrics, and (--steady) the replica kept busy; then (unless
    --no-validate) SCENARIO for DURATION s through the balancer, and the fitted twin on the
    same plan: its error on P99 E2E, P99 TTFT and req/s. Writes the profile (--twin-profile
    of twin run/check) and calibration.json (the llm scheduler's rates). States its load
    before it starts.

    Example: lbtune twin fit -s chat -d 30
    """
    from rich.console import Console

    from lbtune.cli.capacity import fraction
    from lbtune.errors import ConfigError
    from lbtune.tune.twinfit import FitOptions, fit_twin
    from lbtune.twin.fitted import drift, read_profile

    if fail_on_drift is not None and baseline is None:
        raise ConfigError("--fail-on-drift needs --baseline PROFILE.json")
    limit = None if fail_on_drift is None else fraction(fail_on_drift, "--fail-on-drift")
    before = None if baseline is None else read_profile(baseline, "--baseline")  # before load
    err = Console(stderr=True)
    opts = FitOptions(
        state_dir=state_dir,
        out=save,
        validate=not no_validate,
        scenario=scenario,
        duration_s=duration,
        seed=seed,
        batch=batch,
        runs=runs,
        steady=steady,
    )
    profile, path = fit_twin(opts, lambda m: err.print(m, markup=False, highlight=False))
    moved = [] if before is None else drift(before, profile)
    if as_json:
        doc = json.loads(profile.model_dump_json())
        doc["path"] = str(path)
        doc["trusted"] = profile.trusted() is None
        if before is not None:
            doc["drift"] = [vars(d) | {"slower": d.slower} for d in moved]
        typer.echo(json.dumps(doc, indent=2, allow_nan=False))
    else:
        for line in fit_lines(profile, path):
            typer.echo(line)
        for d in moved:
            typer.echo(
                f"drift {d.replica}: decode {d.decode:+.0%}, prefill {d.prefill:+.0%}, "
                f"overhead {d.overhead:+.0%}" + ("" if d.beyond_noise else " (within noise)")
            )
    if limit is not None and any(d.beyond_noise and d.slower > limit for d in moved):
        worst = max(moved, key=lambda d: d.slower)
        err.print(
            f"drift: {worst.replica} is {worst.slower:.0%} slower than in {baseline} "
            f"(more than {limit:.0%})",
            markup=False,
        )
        raise typer.Exit(1)
