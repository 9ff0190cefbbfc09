"""`lbtune optimize` — tune the balancer; `lbtune dashboard` — optuna-dashboard on a study.

Parse and check the options, then run the study in the terminal
(:mod:`lbtune.cli.study_view`: progress, signals, the result). Optuna and the rest are
imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Annotated

import typer

from lbtune.cli.options import (
    DEFAULT_STUDY_STORAGE,
    CiOpt,
    InventoryOpt,
    JsonOpt,
    JunitOpt,
    MaxTwinErrorOpt,
    OutOpt,
    ScenarioOpt,
    SeedOpt,
    SloOpt,
    SpaceOpt,
    SpeedupOpt,
    StateDirOpt,
    StorageOpt,
    TargetNameOpt,
    TraceFormatOpt,
    TraceOpt,
    TwinProfileOpt,
    check_outputs,
    scenario_or_trace,
)
from lbtune.cli.study_view import print_result, run_study, tell
from lbtune.errors import TERMINATED_EXIT

if TYPE_CHECKING:
    pass


def optimize_command(
    budget: Annotated[
        int | None,
        typer.Option(
            "--budget",
            "-n",
            help="Trials to run (references included; default 50, on --resume the study's own).",
        ),
    ] = None,
    scenario: ScenarioOpt[str | None] = None,
    target: TargetNameOpt = None,
    space: SpaceOpt = None,
    objective: Annotated[
        str | None,
        typer.Option(
            "--objective",
            help="composite (weighted score), pareto, or capacity (tune for the capacity at "
            "--slo: trials at one open-loop --rate near it, scored by the SLO stretch at "
            "--attainment); default: composite.",
        ),
    ] = None,
    attainment: Annotated[
        str | None,
        typer.Option(
            "--attainment",
            help="--objective capacity: share of requests that must meet --slo (default 0.99).",
        ),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(
            "--rate",
            help="--objective capacity: the trials' offered req/s (default: 1.25x the live "
            "config's capacity in the twin).",
        ),
    ] = None,
    sampler: Annotated[str, typer.Option("--sampler", help="tpe, gp, nsga2 or random.")] = "tpe",
    pruner: Annotated[str, typer.Option("--pruner", help="median or none.")] = "median",
    trial_duration: Annotated[
        float | None,
        typer.Option(
            "--trial-duration",
            help="Seconds of load per trial, warm-up included (default: 25).",
        ),
    ] = None,
    study: Annotated[
        str | None,
        typer.Option(
            "--study", help="Study name (default: <scenario>-<target>-<time>; newest on --resume)."
        ),
    ] = None,
    storage: StorageOpt = DEFAULT_STUDY_STORAGE,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue an interrupted study.")
    ] = False,
    no_apply: Annotated[
        bool, typer.Option("--no-apply", help="Stop after the confirmation: apply nothing.")
    ] = False,
    confirm_runs: Annotated[
        int,
        typer.Option(
            "--confirm-runs",
            help="Confirmation rounds at least: baseline + candidates (0 = skip).",
        ),
    ] = 2,
    confirm_top: Annotated[int, typer.Option("--confirm-top", help="Candidates to confirm.")] = 2,
    confirm_max_rounds: Annotated[
        int,
        typer.Option(
            "--confirm-max-rounds",
            help="Rounds at most, added while an arm has fewer than the 100 samples a P99 needs "
            "(and 15 min at most).",
        ),
    ] = 6,
    screen: Annotated[
        int | None,
        typer.Option(
            "--screen",
            help="Configs to screen in the virtual-time twin first; the best go live "
            "(default 100 where the twin models the cluster; 0 = live-only).",
        ),
    ] = None,
    twin_profile: TwinProfileOpt = None,
    max_twin_error: MaxTwinErrorOpt = 0.25,
    seed: SeedOpt = None,
    slo: SloOpt = None,
    weights: Annotated[
        str | None,
        typer.Option("--weights", help="Score weights, e.g. e2e=0.45,ttft=0.35,decay=0.2."),
    ] = None,
    trace: TraceOpt = None,
    trace_format: TraceFormatOpt = None,
    speedup: SpeedupOpt = None,
    state_dir: StateDirOpt = None,
    cluster: Annotated[
        str | None,
        typer.Option("--cluster", help="Cluster preset/file used if the cluster must be started."),
    ] = None,
    inventory: InventoryOpt = None,
    out: OutOpt = None,
    as_json: JsonOpt = False,
    ci: CiOpt = False,
    junit: JunitOpt = None,
) -> None:
    """Tune the balancer for your traffic: search, confirm the winner, roll it out.

    Trial 0 is what runs now, then plain round robin and least-conn (where the target has
    it), each once: when the live config already is round robin, trial 1 is least-conn.
    Where the virtual-time twin models the cluster, --screen configs are first simulated
    and the best few go live next; the report sets each live trial beside the twin's
    prediction. The
    best candidates are re-run in rounds against the live config, measured
    afresh and interleaved, and the winner is applied through Ansible only if a paired
    bootstrap CI says it is better. If the live config cannot be measured, exit 2. Ctrl-C
    stops the running trial, restores the last known good and writes the report
    (exit 130; SIGTERM likewise, exit 143, even during the final write); `--resume`
    continues. With GITHUB_STEP_SUMMARY set, a Markdown
    summary is appended to that file.

    The scenario is `mixed` unless given (on --resume: the study's own). --json prints
    study.json's content. With --ci: exit 1 when the winner was rolled back, 3 on an
    infrastructure failure.

    Example: lbtune optimize --budget 50
    """
    from lbtune.cli import ci as ci_mode
    from lbtune.tune.options import OptimizeOptions

    _check_trial_duration(trial_duration)
    check_outputs(out, state_dir=state_dir)
    _check_study(study, storage)
    share = _check_capacity(objective, attainment, rate)
    opts = OptimizeOptions(
        budget=budget,
        scenario=scenario_or_trace(scenario, trace, trace_format, speedup),
        target=target,
        space=None if space is None else str(space),
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
        inventory=None if inventory is None else str(inventory),
        out_dir=out,
        screen=screen,
        attainment=share,
        rate=rate,
        twin_profile=twin_profile,
        max_twin_error=max_twin_error,
    )
    err = ci_mode.start(ci, junit)
    term = threading.Event()
    try:
        result = run_study(opts, ci, err, term)
    except Exception as exc:
        ci_mode.junit_on_error(junit, "optimize", exc)
        raise
    if as_json:
        from lbtune.report.study import study_json

        sys.stdout.write(study_json(result))
    else:
        print_result(result, ci_mode.console() if ci else None)
    tell(result, junit, err)
    if term.is_set():
        err.print("terminated (SIGTERM): the report holds the study until then", markup=False)
        raise typer.Exit(TERMINATED_EXIT)
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
    from lbtune.scenario.limits import MAX_DURATION_S

    if seconds is not None and not (math.isfinite(seconds) and 0 < seconds <= MAX_DURATION_S):
        raise ConfigError(
            f"--trial-duration: must be > 0 and at most {MAX_DURATION_S:g} s, got {seconds:g}"
        )


def _check_study(study: str | None, storage: str) -> None:
    """``--study`` is a name a terminal shows and a report directory is named after: no
    control characters, at most 200 characters; ``--storage``, a SQLite file, must be
    lbtune's or Optuna's (a foreign database is refused untouched)."""
    from lbtune.errors import ConfigError, printable
    from lbtune.history.dbfile import check_studies_db

    if study is not None and (printable(study) != study or not 0 < len(study) <= 200):
        raise ConfigError(
            f"--study {printable(study)[:200]}: a name of 1..200 printable characters"
        )
    check_studies_db(storage)


def dashboard_command(
    study: Annotated[str | None, typer.Option("--study", help="Open on this study.")] = None,
    storage: StorageOpt = DEFAULT_STUDY_STORAGE,
    port: Annotated[int, typer.Option("--port", help="Port on 127.0.0.1.")] = 8080,
) -> None:
    """Open optuna-dashboard (on 127.0.0.1) on the study storage."""
    from lbtune.errors import MissingExtra
    from lbtune.history.dbfile import check_studies_db

    check_studies_db(storage)

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


def _check_capacity(
    objective: str | None, attainment: str | None, rate: float | None
) -> float | None:
    """``--attainment`` as a share and ``--rate`` checked: both only with ``--objective
    capacity`` (one line, exit 2)."""
    from lbtune.cli.capacity import fraction
    from lbtune.errors import ConfigError

    if objective != "capacity":
        for flag, value in (("--attainment", attainment), ("--rate", rate)):
            if value is not None:
                raise ConfigError(f"{flag}: only with --objective capacity")
        return None
    if rate is not None and not rate > 0:
        raise ConfigError(f"--rate: must be > 0 req/s, got {rate:g}")
    return None if attainment is None else fraction(attainment, "--attainment")
