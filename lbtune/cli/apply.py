"""`lbtune apply` and `lbtune rollback`: make a parameter set live, safely.

Thin: parse, call :mod:`lbtune.apply`, render. Heavy imports (ansible-runner, optuna) stay
inside the library functions. Register with ``app.command("apply")(apply_command)`` and
``app.command("rollback")(rollback_command)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from lbtune.cli.options import (
    DEFAULT_STUDY_STORAGE,
    DirectOpt,
    InventoryOpt,
    JsonOpt,
    SpaceOpt,
    StateDirOpt,
    StorageOpt,
    TargetNameOpt,
)

if TYPE_CHECKING:
    from lbtune.apply import ApplyOutcome
    from lbtune.targets.targetbase import TargetBase

__all__ = ["apply_command", "rollback_command"]


def _target(name: str | None, state_dir: Path | None, space: Path | None = None) -> TargetBase:
    from lbtune.cluster.api import find_state_dir
    from lbtune.errors import ConfigError, TargetError
    from lbtune.records.statedir import StatePaths, read_endpoints
    from lbtune.targets import balancer, get_target

    if name is not None:
        balancer(name)  # an unknown name is a ConfigError before anything else
    paths = StatePaths(find_state_dir(state_dir))
    ep = read_endpoints(paths)
    if ep is None:
        raise TargetError(
            f"No running cluster in {paths.root} (no endpoints.json); start one with "
            "`lbtune cluster up` or pass --state-dir"
        )
    if name is not None and name != ep.balancer:
        raise ConfigError(
            f"--target {name}: the cluster in {paths.root} runs {ep.balancer}; "
            f"pass --target {ep.balancer} (or leave --target out)"
        )
    return get_target(ep.balancer, ep, space_file=space)


def _study_params(study: str, trial: str, storage: str) -> tuple[dict[str, Any], str]:
    import optuna

    from lbtune.errors import ConfigError
    from lbtune.records.addresses import without_userinfo
    from lbtune.search.stored import stored_params
    from lbtune.search.study import sqlite_dir

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sqlite_dir(storage)  # a URL Optuna can open, its driver there: else one line
    try:
        s = optuna.load_study(study_name=study, storage=storage)
    except KeyError:
        names = [x.study_name for x in optuna.get_all_study_summaries(storage=storage)]
        where = without_userinfo(storage)
        raise ConfigError(
            f"No study {study!r} in {where}. Available: {', '.join(names) or '(none)'}"
        ) from None
    return stored_params(s, trial)


def _render(outcome: ApplyOutcome, as_json: bool, what: str) -> None:
    r = outcome.result
    if as_json:
        doc = {
            "changed": r.changed,
            "check": r.check,
            "reloaded": r.reloaded,
            "via": outcome.via,
            "seconds": round(r.seconds, 4),
            "diff": {k: list(v) for k, v in r.diff.items()},
            "hosts": [{"host": h.host, "status": h.status, "msg": h.msg} for h in outcome.hosts],
            "applied": r.applied,
            "lkg": None
            if outcome.lkg is None
            else {k: getattr(outcome.lkg, k) for k in ("time", "source", "sha256")},
            "log": str(outcome.log_path) if outcome.log_path else None,
        }
        typer.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    for h in outcome.hosts:
        typer.echo(h.line())
    for k, (before, after) in sorted(r.diff.items()):
        typer.echo(f"  {k}: {before} -> {after}")
    if r.check:
        verdict = "would change" if r.changed else "no change"
        reload = " (reload)" if r.reloaded and r.changed else ""
        typer.echo(f"check: {verdict}{reload}; nothing was touched")
    else:
        verdict = "changed" if r.changed else "no change"
        reload = ", reloaded" if r.reloaded else ""
        lkg = f"; last known good {outcome.lkg.describe()}" if outcome.lkg else ""
        typer.echo(f"{what}: {verdict}{reload} in {r.seconds:.2f} s{lkg}")
    if outcome.log_path:
        typer.echo(f"log: {outcome.log_path}", err=True)


def apply_command(
    target: TargetNameOpt = None,
    params: Annotated[
        Path | None, typer.Option("--params", "-p", help="YAML file of knob: value.")
    ] = None,
    study: Annotated[
        str | None, typer.Option("--study", help="Apply a trial of this Optuna study.")
    ] = None,
    trial: Annotated[
        str,
        typer.Option(
            "--trial",
            help="winner (the confirmed winner, as rolled out), best (the search's best, "
            "not confirmed) or a trial number.",
        ),
    ] = "winner",
    storage: StorageOpt = DEFAULT_STUDY_STORAGE,
    check: Annotated[bool, typer.Option("--check", help="Show the diff; change nothing.")] = False,
    inventory: InventoryOpt = None,
    direct: DirectOpt = False,
    space: SpaceOpt = None,
    show: Annotated[
        bool, typer.Option("--show", help="Print what is live now (the --params format).")
    ] = False,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Apply a parameter set to the balancer, verify it by read-back, record it as the last
    known good (rolled back automatically when verification fails)."""
    import yaml

    from lbtune.errors import ConfigError

    if show:
        from lbtune.report.study_plots import split_by_space

        t = _target(target, state_dir, space)
        live = t.read_live()
        effective, folded = split_by_space(t.space(), live)
        if as_json:
            out = {"target": t.name, "params": live, "without_effect": folded}
            typer.echo(json.dumps(out, indent=2))
        else:
            doc = {"target": t.name, "params": effective}
            typer.echo(yaml.safe_dump(doc, sort_keys=False), nl=False)
            if folded:  # comments, grouped by reason: the output stays a valid --params file
                n = len(folded)
                typer.echo(f"# {n} knobs without effect now (folded away; --json lists all):")
                groups: dict[str, list[str]] = {}
                for name, why in folded.items():
                    value, _, reason = why.partition(": ")
                    groups.setdefault(reason, []).append(f"{name}={value}")
                for reason, knobs in groups.items():
                    typer.echo(f"#   {reason}: {', '.join(knobs)}")
        return
    if (params is None) == (study is None):
        raise ConfigError("Give exactly one of --params FILE or --study NAME (or --show)")
    from lbtune.apply import apply_params
    from lbtune.apply.paramfile import read_params_for
    from lbtune.targets.space import load_params_file

    if params is not None:
        load_params_file(params)  # a bad file is named before a missing cluster
        t = _target(target, state_dir, space)
        values, source = read_params_for(params, t.name), f"file:{params}"
        values = t.space().validate(values, str(params))  # errors name the file, not file:
    else:
        assert study is not None
        from lbtune.history.dbfile import check_studies_db

        check_studies_db(storage)  # another program's database is not opened by Optuna
        values, source = _study_params(study, trial, storage)
        t = _target(target, state_dir, space)
        values = t.space().complete(t.space().validate(values, source), t.space().baseline())
    outcome = apply_params(
        t,
        values,
        via="direct" if direct else "ansible",
        check=check,
        inventory=inventory,
        source=source,
        progress=lambda m: typer.echo(m, err=True),
    )
    _render(outcome, as_json, "apply")


def rollback_command(
    target: TargetNameOpt = None,
    inventory: InventoryOpt = None,
    direct: DirectOpt = False,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-apply the last known good parameter set."""
    from lbtune.apply import rollback

    t = _target(target, state_dir)
    outcome = rollback(t, via="direct" if direct else "ansible", inventory=inventory)
    _render(outcome, as_json, "rollback")
