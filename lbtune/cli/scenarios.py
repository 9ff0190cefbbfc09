"""`lbtune scenarios list|show|validate` — the built-in and user scenario files."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from lbtune.cli.options import JsonOpt

if TYPE_CHECKING:
    from lbtune.scenario import Scenario
    from lbtune.scenario.sessionplan import Call, SessionSource

app = typer.Typer(
    help="List, inspect and validate load scenarios (built in or YAML).", no_args_is_help=True
)

_PREVIEW_N = 1000
_PREVIEW_PCTS = (50.0, 68.0, 90.0, 99.0, 99.9, 100.0)


def _summary(sc: Scenario) -> dict[str, Any]:
    from lbtune.scenario import plan_load

    plan = plan_load(sc)
    level = (
        f"{plan.max_users} users max"
        if plan.mode == "closed"
        else f"{max(s.level_at(s.end_s) for s in plan.stages):g} req/s max"
    )
    return {
        "name": sc.name,
        "description": sc.description,
        "mode": sc.mode,
        "shape": sc.load.type,
        "load": level,
        "duration_s": sc.duration_s,
        "models": sc.model_names(),
    }


@app.command("list")
def list_(as_json: JsonOpt = False) -> None:
    """List the built-in scenarios: name, loop mode, duration, models, description."""
    from lbtune.scenario import list_scenarios

    rows = [_summary(sc) for sc in list_scenarios()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col in ("name", "mode", "load", "duration", "models", "description"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r["name"],
            f"{r['mode']} ({r['shape']})",
            r["load"],
            f"{r['duration_s']:g} s",
            ", ".join(r["models"]),
            r["description"],
        )
    Console(width=160).print(table)


def _preview(sc: Scenario) -> dict[str, Any]:
    """Spec vs sampled percentiles of the first requests (prompt and output tokens)."""
    from lbtune.scenario import build_workload
    from lbtune.scenario.distributions import mixture_quantile
    from lbtune.scenario.mix import resolve_classes
    from lbtune.scenario.sessionplan import SessionSource

    w = build_workload(sc)
    out: dict[str, Any] = {}
    if isinstance(w, SessionSource):  # the calls of the first sessions, in order
        calls, out["agent"] = _first_calls(w)
        reqs = [w.request(c.index) for c in calls]
    else:
        n = _PREVIEW_N if sc.source is None else min(_PREVIEW_N, len(w))  # type: ignore[arg-type]
        reqs = [w.request(i) for i in range(n)]
    n = len(reqs)
    mixes = resolve_classes(sc)

    def pct(values: list[int], p: float) -> int:
        s = sorted(values)
        return s[min(len(s) - 1, max(0, round(p / 100 * len(s)) - 1))]

    out = {"requests": n, **out}
    trace = (sc.fitted.percentiles if sc.fitted is not None else None) or {}
    rows = _trace_rows(sc)
    for key, sampled in (
        ("prompt_tokens", [r.prompt_tokens for r in reqs]),
        ("output_tokens", [r.max_tokens for r in reqs]),
    ):
        parts = [(m.weight, getattr(m, key)) for m in mixes]
        column: dict[str, dict[str, float]] = {}
        for p in _PREVIEW_PCTS:
            name = f"p{p:g}"
            if rows is not None:  # a replay: what the file says beside what is sent
                column[name] = {"trace": pct(rows[key], p), "sampled": pct(sampled, p)}
                continue
            column[name] = {
                "spec": round(mixture_quantile(parts, p / 100)),
                "sampled": pct(sampled, p),
            }
            if name in trace.get(key, {}):
                column[name] = {"trace": round(trace[key][name]), **column[name]}
        out[key] = column
    if sc.fitted is not None:
        out["fit"] = dict(sc.fitted.fit)
        out["arrival"] = _arrival_rows(sc)
    out["note"] = (
        "trace = the trace file's lengths; sampled = the first requests as sent"
        if rows is not None
        else "spec = the distribution of each new message (max_tokens for output); sampled "
        "prompt_tokens also count shared system prompts and resent session history"
        + ("; trace = the fitted trace's own percentiles" if trace else "")
        + ("; agent calls also carry earlier answers and tool outputs" if sc.agent else "")
    )
    out["sessions"] = sum(r.session_id is not None for r in reqs)
    out["prefix_shared"] = sum(r.prefix_group is not None for r in reqs)
    return out


def _first_calls(w: SessionSource) -> tuple[list[Call], dict[str, int]]:
    """The first calls of a session workload (an agentic trace's window once, synthetic
    sessions until the preview is full), and how many sessions and subagent calls."""
    from lbtune.scenario.traces.sessions import TraceSessionWorkload

    calls: list[Call] = []
    sessions: Iterable[int] = (
        range(len(w)) if isinstance(w, TraceSessionWorkload) else itertools.count()
    )
    n = 0
    for s in sessions:
        calls += w.session(s).calls
        n += 1
        if len(calls) >= _PREVIEW_N:
            break
    calls = calls[:_PREVIEW_N]
    return calls, {"sessions": n, "subagent_calls": sum(c.agent != 0 for c in calls)}


def _trace_rows(sc: Scenario) -> dict[str, list[int]] | None:
    """A replay's own lengths (the rows it sends), or None for a synthetic scenario."""
    if sc.source is None:
        return None
    from lbtune.scenario.traces.replay import replay_of
    from lbtune.scenario.traces.sessions import session_replay_of

    if sc.source.sessions:  # the calls of the first sessions, as the preview sends them
        calls = itertools.chain.from_iterable(x.calls for x in session_replay_of(sc).sessions)
        pairs = [(c.prompt_tokens, c.output_tokens) for c in itertools.islice(calls, _PREVIEW_N)]
    else:
        pairs = [(r.prompt_tokens, r.output_tokens) for r in replay_of(sc).rows[:_PREVIEW_N]]
    return {"prompt_tokens": [p for p, _ in pairs], "output_tokens": [o for _, o in pairs]}


def _arrival_rows(sc: Scenario) -> dict[str, dict[str, float]]:
    """Inter-arrival gap percentiles: the trace's beside the fitted load plan's."""
    from lbtune.records.quantiles import percentile
    from lbtune.scenario import plan_load

    assert sc.fitted is not None
    trace = sc.fitted.percentiles.get("gap_s", {})
    times = plan_load(sc).arrivals
    gaps = [b - a for a, b in itertools.pairwise(times)]
    out: dict[str, dict[str, float]] = {}
    for p in _PREVIEW_PCTS:
        name = f"p{p:g}"
        if name in trace and gaps:
            out[name] = {"trace": trace[name], "fit": round(percentile(gaps, p), 4)}
    return out


def _tidy(value: Any) -> Any:
    """YAML-friendly dump: ``type`` first, whole-number float keys as ints."""
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: kv[0] != "type")
        return {
            (int(k) if isinstance(k, float) and k.is_integer() else k): _tidy(v) for k, v in items
        }
    if isinstance(value, list):
        return [_tidy(v) for v in value]
    return value


@app.command()
def show(
    name: Annotated[str, typer.Argument(help="Built-in scenario name or path to a YAML file.")],
    as_json: JsonOpt = False,
) -> None:
    """Show the full validated scenario and a preview of its first 1000 requests."""
    from lbtune.scenario import load_scenario

    sc = load_scenario(name)
    summary = _summary(sc)  # the load plan: what cannot run is refused here too
    preview = _preview(sc)
    if as_json:
        data = sc.model_dump(mode="json", by_alias=True, exclude_none=True)
        typer.echo(json.dumps({"scenario": data, "summary": summary, "preview": preview}))
        return
    import yaml

    data = _tidy(sc.model_dump(mode="python", by_alias=True, exclude_none=True))
    typer.echo(yaml.safe_dump(data, sort_keys=False, width=100).rstrip())
    typer.echo(f"\n# preview: first {preview['requests']} requests (seed {sc.seed})")
    typer.echo(f"# {preview['note']}")
    for key in ("prompt_tokens", "output_tokens", "arrival"):
        table = preview.get(key) or {}
        if not table:
            continue
        label = "gap_s" if key == "arrival" else key
        typer.echo(f"{label:>14}  " + "  ".join(f"{p:>12}" for p in table))
        for col in next(iter(table.values())):
            row = "  ".join(f"{v[col]:>12g}" for v in table.values())
            typer.echo(f"{col:>14}  {row}")
    for what, how in (preview.get("fit") or {}).items():
        typer.echo(f"# fit: {what}: {how}")
    typer.echo(
        f"session turns: {preview['sessions']}, with a shared prefix: {preview['prefix_shared']}"
    )
    if "agent" in preview:
        a = preview["agent"]
        typer.echo(
            f"agent sessions: {a['sessions']} (the first {preview['requests']} calls, "
            f"{a['subagent_calls']} of them by subagents)"
        )


@app.command()
def validate(
    file: Annotated[Path, typer.Argument(help="Scenario YAML file to check.")],
) -> None:
    """Check a scenario file; prints one ok line, or one error line and exits 2."""
    from lbtune.scenario import load_scenario, plan_load

    sc = load_scenario(file)
    plan = plan_load(sc)
    typer.echo(
        f"ok: {file}: scenario '{sc.name}', {plan.mode} loop ({sc.load.type}), "
        f"{sc.duration_s:g} s, models: {', '.join(sc.model_names())}"
    )


@app.command()
def fit(
    trace: Annotated[Path, typer.Argument(help="Trace file (any format `--trace` takes).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Scenario YAML to write.")],
    trace_format: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="azure, mooncake, burstgpt, sharegpt, lbtune, weka, otel or copilot.",
        ),
    ] = None,
    kind: Annotated[
        str, typer.Option("--kind", help="auto, lognormal or empirical length tables.")
    ] = "auto",
    name: Annotated[str, typer.Option("--name", help="Scenario name.")] = "",
) -> None:
    """Write a compact scenario with the trace's shape (lengths, arrivals, prefixes, sessions,
    models; an agentic trace's agent sessions) and none of its data; `lbtune scenarios show`
    it to compare with the trace."""
    from lbtune.errors import ConfigError
    from lbtune.safety.files import check_out_file
    from lbtune.scenario import scenario_from_dict
    from lbtune.scenario.traces.fit import fit_trace
    from lbtune.scenario.traces.fitsessions import fit_sessions
    from lbtune.scenario.traces.read import guess_format
    from lbtune.scenario.traces.sessiongraph import SESSION_FORMATS

    if kind not in ("auto", "lognormal", "empirical"):
        raise ConfigError(f"--kind: expected auto, lognormal or empirical, found {kind!r}")
    check_out_file(out, "--out")
    fmt = trace_format or guess_format(trace)
    fitter = fit_sessions if fmt in SESSION_FORMATS else fit_trace  # agent sessions: `agent:`
    doc = fitter(trace, fmt, kind=kind, name=name)  # type: ignore[arg-type]
    scenario_from_dict(doc, source=f"fit of {trace}")  # the document must validate
    import yaml

    n = doc["fitted"]["requests"]
    header = f"# Fitted by `lbtune scenarios fit` from {trace} ({fmt}, {n} requests)\n"
    out.write_text(header + yaml.safe_dump(_tidy(doc), sort_keys=False, width=100))
    typer.echo(f"wrote {out}: scenario '{doc['name']}'")
    for what, how in doc["fitted"]["fit"].items():
        typer.echo(f"  {what}: {how}")
