"""The issue-10 headline: N columns, each a (target, params) pair, interleaved in paired rounds.

``headline.py --columns`` (or one ``--column NAME=TARGET:SPEC`` per column) runs this
instead of the ``RR LC W`` comparison. A column's SPEC is

* ``ref:round-robin`` / ``ref:least-conn``: the target space's reference;
* ``study:KNOB=A,B,...``: the winner of a study (``lbtune.tune.optimize``, ``--study-budget``
  trials) over the target's space with ``KNOB`` restricted to those choices (a space file
  written under the output dir; references outside the choices are dropped);
* a path: a ``knob: value`` file (``winner.yaml`` of an earlier run works: its ``params``).

Each target gets its own embedded cluster (``--cluster`` for the first target, else the
preset ``hetero4-TARGET``), all up at once on free ports; a round runs every column once,
in order, on the same scenario and seed. Figures, CIs and ratios come from
``benchmarks/_paired.py`` (the paired two-level bootstrap of ``lbtune.search.paired``);
the **no-queueing limit** (``lbtune.sim.limit``: each request of the rounds alone on the
fastest replica of the first cluster that serves its model) is one more column, and every
column's P99 is also given over the limit's.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast, get_args

import yaml
from _paired import KEYS, Analysis, Run, analyse, fmt, fmt_ci

from lbtune.cluster import api
from lbtune.cluster.config import PortsConfig, available_presets, load_config
from lbtune.records.endpoints import Endpoints
from lbtune.records.quantiles import MIN_SAMPLES, percentile
from lbtune.sim.limit import ReplicaSpec, fastest
from lbtune.targets import TARGETS, get_target
from lbtune.targets.base import ParamSet
from lbtune.targets.space import ReferenceRole, load_params_file

ISSUE10 = (
    "RR=haproxy:ref:round-robin",
    "LC=haproxy:ref:least-conn",
    "STOCK=haproxy:study:algorithm=roundrobin,leastconn,random,hash",
    "LLM=haproxy:study:algorithm=llm",
    "CA=vllm-router:study:policy=cache_aware",
)
"""The issue's columns: round robin, least-conn, the best stock-HAProxy config, the Lua
scheduler tuned, vllm-router's cache_aware tuned (the studies share one budget)."""

ROWS: tuple[tuple[str, str, str, float], ...] = (
    ("p50_e2e", "P50 end to end", "s", 1.0),
    ("p99_e2e", "P99 end to end", "s", 1.0),
    ("ttft_p50", "TTFT P50 (streamed)", "ms", 1000.0),
    ("ttft_p99", "TTFT P99 (streamed)", "ms", 1000.0),
    ("rps", "throughput, req/s", "req/s", 1.0),
    ("tok_s", "throughput, output tok/s", "tok/s", 1.0),
    ("fail", "failed requests", "%", 100.0),
    ("hit", "prefix-cache hit rate (server side)", "%", 100.0),
    ("gpu_sd", "GPU SM-activity std-dev", "", 1.0),
)
AIMS_MIXED: tuple[tuple[str, str, float, bool], ...] = (
    ("p99_e2e", "P99 e2e ≤ 0.40× RR", 0.40, False),
    ("ttft_p99", "P99 TTFT ≤ 0.45× RR", 0.45, False),
    ("rps", "throughput ≥ 1.5× RR", 1.5, True),
)


@dataclass(frozen=True)
class Column:
    name: str
    target: str
    spec: str


def parse_column(text: str) -> Column:
    name, sep, rest = text.partition("=")
    target, sep2, spec = rest.partition(":")
    if not (sep and sep2 and name and spec) or target not in TARGETS:
        raise SystemExit(
            f"--column {text!r}: want NAME=TARGET:SPEC, TARGET one of {', '.join(TARGETS)}"
        )
    return Column(name, target, spec)


def restricted_space(target: str, knob: str, choices: list[str], path: Path) -> Path:
    """The target's own space file with ``knob``'s choices cut to ``choices``."""
    import importlib

    module = importlib.import_module(TARGETS[target].split(":", 1)[0])
    doc = yaml.safe_load(Path(str(module.__file__)).with_name("space.yaml").read_text())
    spec = doc["params"][knob]
    unknown = [c for c in choices if c not in spec["choices"]]
    if unknown:
        raise SystemExit(f"{target}: {knob} has no choice {unknown} (it has {spec['choices']})")
    spec["choices"] = choices
    if spec["baseline"] not in choices:
        spec["baseline"] = choices[0]
    refs = {r: v for r, v in spec.get("references", {}).items() if v in choices}
    if refs:
        spec["references"] = refs
    else:
        spec.pop("references", None)
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@dataclass
class Cluster:
    target: str
    name: str
    state: Path
    ep: Endpoints
    time_scale: float


def start_clusters(
    columns: Sequence[Column], args: argparse.Namespace, out: Path, say: Callable[[str], None]
) -> dict[str, Cluster]:
    clusters: dict[str, Cluster] = {}
    try:
        for col in columns:
            if col.target in clusters:
                continue
            preset = None
            # --cluster is the first target's, if it runs that target
            if (
                not clusters
                and args.cluster
                and load_config(args.cluster)[0].balancer == col.target
            ):
                preset = args.cluster
            if preset is None:
                names = (f"hetero4-{col.target}", f"hetero4-{col.target.split('-')[-1]}")
                preset = next((n for n in names if n in available_presets()), "hetero4")
            cfg = load_config(preset)[0]
            if cfg.balancer != col.target:
                raise SystemExit(f"cluster {cfg.name} runs {cfg.balancer}, not {col.target}")
            ports = PortsConfig(**dict.fromkeys(PortsConfig.model_fields, 0))
            update: dict[str, Any] = {"ports": ports}
            if args.time_scale is not None:
                update["time_scale"] = args.time_scale
            cfg = cfg.model_copy(update=update)
            state = out / f"cluster-{col.target}"
            say(f"cluster {cfg.name} (time scale {cfg.time_scale:g}) in {state}, free ports")
            ep = api.up(cfg, state, progress=say)
            clusters[col.target] = Cluster(col.target, cfg.name, state, ep, cfg.time_scale)
    except BaseException:
        for c in clusters.values():
            api.down(c.state)
        raise
    return clusters


def scenario_for(col: Column, cl: Cluster, scenario: str, out: Path) -> str:
    """``scenario``, or where the column's cluster lacks some of its models, a copy cut to
    the models it serves (weights renormalised), written to ``<out>/scenario-<COL>.yaml``:
    another traffic mix, which the table says."""
    from lbtune.scenario.loader import _resolve  # the file behind a built-in name

    path = _resolve(scenario)
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    served = {m for r in cl.ep.replicas for m in r.models}
    models = doc.get("models")
    if not isinstance(models, dict) or set(models) <= served:
        return scenario
    kept = {m: float(w) for m, w in models.items() if m in served}
    if not kept:
        raise SystemExit(f"column {col.name}: {cl.name} serves none of {scenario}'s models")
    total = sum(kept.values())
    doc["models"] = {m: w / total for m, w in kept.items()}
    doc["name"] = f"{doc.get('name', path.stem)}-{'-'.join(sorted(kept))}"
    dest = out / f"scenario-{col.name}.yaml"
    dest.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return str(dest)


def study_winner(
    col: Column, cl: Cluster, args: argparse.Namespace, out: Path, say: Callable[[str], None]
) -> tuple[ParamSet, dict[str, Any]]:
    from lbtune.tune.optimize import run_optimize
    from lbtune.tune.options import OptimizeOptions

    knob, _, choices = col.spec[len("study:") :].partition("=")
    space_file = restricted_space(
        col.target, knob, choices.split(","), out / f"space-{col.name}.yaml"
    )
    target = get_target(col.target, cl.ep)
    full = target.space()
    # The study's "live" reference must lie in the restricted space: start from its baseline.
    start = full.complete({knob: choices.split(",")[0]}, full.baseline())
    target.apply(start)
    say(
        f"study {col.name}: {args.study_budget} trials of {args.trial_duration:g} s, "
        f"{col.target} with {knob} in {choices}"
    )
    res = run_optimize(
        OptimizeOptions(
            budget=args.study_budget,
            scenario=scenario_for(col, cl, args.scenario, out),
            target=col.target,
            space=str(space_file),
            trial_duration_s=args.trial_duration,
            study=f"issue10-{col.name}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage=f"sqlite:///{(out / 'studies.db').resolve()}",
            apply=False,
            confirm_runs=0,
            seed=args.study_seed,
            state_dir=cl.state,
            reports_root=out,
            out_dir=out / f"study-{col.name}",
            write_report=False,
        ),
        say=say,
    )
    best = res.trial(res.best)
    if best is None:
        raise SystemExit(f"study {col.name}: no feasible completed trial")
    info = {
        "study": res.study,
        "best_trial": best.number,
        "best_role": best.role,
        "best_objective": best.objective,
        "trials": len(res.trials),
        "elapsed_s": res.elapsed_s,
    }
    return dict(best.params), info


def resolve(
    col: Column, cl: Cluster, args: argparse.Namespace, out: Path, say: Callable[[str], None]
) -> tuple[ParamSet, dict[str, Any]]:
    target = get_target(col.target, cl.ep)
    space = target.space()
    if col.spec.startswith("ref:"):
        role = col.spec[4:]
        roles = get_args(ReferenceRole)
        if role not in roles:
            raise SystemExit(f"{col.target}: no reference role {role!r} (roles: {roles})")
        ref = space.reference(cast(ReferenceRole, role))
        if ref is None:
            raise SystemExit(f"{col.target}: no reference {col.spec[4:]!r}")
        return ref, {"source": col.spec}
    if col.spec.startswith("study:"):
        params, info = study_winner(col, cl, args, out, say)
        return params, {"source": "study", **info}
    doc = load_params_file(col.spec)
    raw = doc.get("params", doc) if isinstance(doc.get("params"), dict) else doc
    params = space.complete(space.validate(raw, col.spec), space.baseline())
    # a ``--studies-only`` file keeps the study it came from (shown in the table)
    src = yaml.safe_load(Path(col.spec).read_text(encoding="utf-8")).get("source")
    origin: dict[str, Any] = src if isinstance(src, dict) else {}
    return params, {**origin, "source": f"file {col.spec}"}


def run_studies(args: argparse.Namespace, out: Path, say: Callable[[str], None]) -> list[Path]:
    """``--studies-only``: run each ``study:`` column's study, write its winner to
    ``<out>/params-<COL>.yaml`` (``params:`` plus the study it came from) and stop, so
    that studies can run in separate processes and one later ``--column NAME=TARGET:FILE``
    pass measures their winners side by side."""
    columns = [c for c in map(parse_column, args.column or ISSUE10) if c.spec.startswith("study:")]
    if not columns:
        raise SystemExit("--studies-only: no study: column")
    clusters = start_clusters(columns, args, out, say)
    written: list[Path] = []
    try:
        for col in columns:
            params, info = study_winner(col, clusters[col.target], args, out, say)
            path = out / f"params-{col.name}.yaml"
            doc = {"target": col.target, "source": info, "params": params}
            path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
            say(f"study {col.name}: winner (trial {info['best_trial']}) written to {path}")
            written.append(path)
    finally:
        for cl in clusters.values():
            say(f"bringing {cl.name} down")
            api.down(cl.state)
    return written


def limit_of(
    runs: Sequence[Run], replicas: Sequence[ReplicaSpec], time_scale: float
) -> dict[str, Any]:
    """The no-queueing limit over every distinct request (by index) the rounds sent whose
    prompt and output token counts are known (same seed: the same request in every run)."""
    seen: dict[int, tuple[str, int, int, bool]] = {}
    for run in runs:
        lo, hi = run.window
        for r in run.records:
            if lo <= r.sent_at < hi and r.prompt_tokens and r.output_tokens is not None:
                seen.setdefault(r.index, (r.model, r.prompt_tokens, r.output_tokens, r.stream))
    e2e: list[float] = []
    ttft: list[float] = []
    unserved = 0
    for model, p, o, stream in seen.values():
        a = fastest(replicas, model, p, o, time_scale=time_scale)
        if a is None:
            unserved += 1
            continue
        e2e.append(a.e2e_s)
        if stream:
            ttft.append(a.ttft_s)

    def pct(v: list[float], q: float) -> float:
        return percentile(v, q) if len(v) >= (MIN_SAMPLES["p99"] if q == 99 else 2) else math.nan

    return {
        "requests": len(e2e),
        "unserved": unserved,
        "p50_e2e": pct(e2e, 50),
        "p99_e2e": pct(e2e, 99),
        "ttft_p50": pct(ttft, 50),
        "ttft_p99": pct(ttft, 99),
    }


def run_columns(
    args: argparse.Namespace,
    out: Path,
    measure: Callable[[str, int, argparse.Namespace, Path, Path], Run],
    say: Callable[[str], None],
) -> dict[str, Any]:
    specs = list(args.column or ISSUE10)
    columns = [parse_column(t) for t in specs]
    if len({c.name for c in columns}) != len(columns):
        raise SystemExit("--column names must differ")
    t0 = time.monotonic()
    clusters = start_clusters(columns, args, out, say)
    params: dict[str, ParamSet] = {}
    sources: dict[str, dict[str, Any]] = {}
    runs: list[Run] = []
    try:
        scenarios = {
            c.name: scenario_for(c, clusters[c.target], args.scenario, out) for c in columns
        }
        for col in columns:
            params[col.name], sources[col.name] = resolve(col, clusters[col.target], args, out, say)
        (out / "columns.yaml").write_text(
            yaml.safe_dump(
                {c.name: {"target": c.target, "params": params[c.name]} for c in columns},
                sort_keys=False,
            ),
            encoding="utf-8",
        )
        say(
            f"rounds: {args.repeats} x ({' '.join(c.name for c in columns)}), "
            f"{args.duration:g} s each, seed {args.seed}"
        )
        for rep in range(args.repeats):
            for col in columns:
                cl = clusters[col.target]
                get_target(col.target, cl.ep).apply(params[col.name])
                col_args = argparse.Namespace(**vars(args))
                col_args.scenario = scenarios[col.name]
                run = measure(col.name, rep, col_args, cl.state, out)
                runs.append(run)
                say(
                    f"round {rep + 1} {col.name}: {len(run.records)} records ({run.seconds:.0f} s)"
                    + (f"; GENERATOR BEHIND: {run.degraded}" if run.degraded else "")
                )
    finally:
        for cl in clusters.values():
            say(f"bringing {cl.name} down")
            api.down(cl.state)
    first = clusters[columns[0].target]
    replicas = [ReplicaSpec(r.name, r.gpu or "", tuple(r.models)) for r in first.ep.replicas]
    same = [r for r in runs if scenarios[r.config] == args.scenario]  # the scenario's own requests
    limit = limit_of(same, replicas, first.time_scale)
    doc = {
        "columns": [c.__dict__ for c in columns],
        "clusters": {
            t: {"cluster": c.name, "time_scale": c.time_scale} for t, c in clusters.items()
        },
        "params": params,
        "sources": sources,
        "scenarios": scenarios,
        "limit": limit,
        "runs": runs,
        "wall_s": time.monotonic() - t0,
    }
    return doc


def render_columns(
    doc: dict[str, Any], args: argparse.Namespace
) -> tuple[list[str], dict[str, Any]]:
    columns = [Column(**c) for c in doc["columns"]]
    names = [c.name for c in columns]
    runs: list[Run] = doc["runs"]
    a: Analysis = analyse(runs, args.bootstrap, configs=names)
    lim = doc["limit"]
    cl = ", ".join(
        f"{t}: {c['cluster']} (time scale {c['time_scale']:g})" for t, c in doc["clusters"].items()
    )
    lines = [
        f"## Issue-10 headline — {args.scenario}, {len(a.rounds)} paired round(s) x "
        f"{args.duration:g} s per column, seed {args.seed}; clusters {cl}",
        "",
        "| figure | " + " | ".join(names) + " | no-queueing limit |",
        "|---|" + "---|" * (len(names) + 1),
    ]
    for key, label, unit, scale in ROWS:
        cells = []
        for c in names:
            lo, hi = a.spread(c, key)
            cells.append(
                f"{fmt(a.value(c, key), scale, unit)} {fmt_ci(lo, hi, scale, unit)}".strip()
            )
        limit = lim.get(key)
        cells.append("" if limit is None else fmt(limit, scale, unit))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append(
        "| samples (E2E / streamed) | "
        + " | ".join(f"{a.count(c, 'e2e')} / {a.count(c, 'ttft')}" for c in names)
        + f" | {lim['requests']} requests |"
    )
    base = names[0]
    lines += [
        "",
        "| ratio | " + " | ".join(f"{c} / {base}" for c in names[1:]) + " |",
        "|---|" + "---|" * (len(names) - 1),
    ]
    for key, label, _unit, _scale in ROWS:
        cells = []
        for c in names[1:]:
            r, lo, hi = a.ratio(c, key)
            cells.append("n/a" if not math.isfinite(r) else f"{r:.2f} [{lo:.2f}, {hi:.2f}]")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| P99 over the no-queueing limit | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for key, label in (("p99_e2e", "end to end"), ("ttft_p99", "TTFT (streamed)")):
        cells = []
        for c in names:
            lv = lim.get(key)
            if lv is None or not math.isfinite(lv) or lv <= 0:
                cells.append("n/a")
                continue
            lo, hi = a.spread(c, key)
            cells.append(f"{a.value(c, key) / lv:.1f}× [{lo / lv:.1f}, {hi / lv:.1f}]")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    asked = [tuple(p.split("/", 1)) for p in (getattr(args, "pair", None) or [])]
    pairs = [
        (x, y) for x, y in (asked or [("LLM", "STOCK"), ("LLM", "CA")]) if x in names and y in names
    ]
    if pairs:
        lines += [
            "",
            "| paired | " + " | ".join(f"{x} / {y}" for x, y in pairs) + " |",
            "|---|" + "---|" * len(pairs),
        ]
        for key, label, _unit, _scale in ROWS:
            cells = []
            for x, y in pairs:
                r, lo, hi = a.ratio(x, key, over=y)
                excl = math.isfinite(lo) and (hi < 1 or lo > 1)
                cells.append(
                    "n/a"
                    if not math.isfinite(r)
                    else f"{r:.2f} [{lo:.2f}, {hi:.2f}]{' *' if excl else ''}"
                )
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("(* the paired 95 % CI of the ratio excludes 1)")
    if "LLM" in names and "CA" in names and args.scenario == "prefix":
        h, hc = a.value("LLM", "hit"), a.value("CA", "hit")
        ok = "met" if h >= hc else "not met"
        lines += ["", f"aim (issue 10, `prefix`): LLM's hit rate {h:.1%} ≥ CA's {hc:.1%} — {ok}"]
    if "LLM" in names and args.scenario == "mixed":
        lines += ["", "aims (issue 10, `mixed`) for LLM:"]
        for key, text, bound, higher in AIMS_MIXED:
            r, lo, hi = a.ratio("LLM", key)
            met = (lo >= bound if higher else hi <= bound) if math.isfinite(lo) else False
            point = (r >= bound if higher else r <= bound) if math.isfinite(r) else False
            lines.append(
                f"  {text}: {r:.2f} [{lo:.2f}, {hi:.2f}] — "
                + ("met (CI)" if met else "met (point only)" if point else "not met")
            )
        f = a.value("LLM", "fail")
        lines.append(f"  failures ≤ 0.3 %: {f * 100:.2f} % — {'met' if f <= 0.003 else 'not met'}")
    lines += [
        "",
        "CIs: 95 % paired two-level bootstrap (rounds, then requests; lbtune.search.paired). "
        "The limit is each request of the rounds (distinct by index, token counts known) alone "
        "on the fastest replica of the first cluster serving its model, no prefix-cache hit "
        "(lbtune.sim.limit); it carries no CI, so a P99/limit interval is the column's alone. "
        + (
            f"{lim['unserved']} request(s) had no replica of their model. "
            if lim["unserved"]
            else ""
        )
        + "Columns on another cluster (another target) share the scenario and seed, not the "
        "replicas: hetero4-router serves only the 8B model.",
    ]
    for c in names:
        if doc["scenarios"][c] != args.scenario:
            lines.append(
                f"{c} ran {doc['scenarios'][c]}: {args.scenario} cut to the models its cluster "
                "serves (other traffic: its pairing with the other columns is by round only)."
            )
    for c in names:
        src = doc["sources"][c]
        lines.append(
            f"{c}: {columns[names.index(c)].target}, {src.get('source')}"
            + (
                f" {src['study']} trial {src['best_trial']} of {src['trials']}"
                if "study" in src
                else ""
            )
        )
    summary = {
        "figures": {
            c: {k: {"value": a.value(c, k), "ci95": list(a.spread(c, k))} for k in KEYS}
            for c in names
        },
        "ratios_vs_first": {c: {k: list(a.ratio(c, k)) for k in KEYS} for c in names[1:]},
        "paired_rounds": [i + 1 for i in a.rounds],
    }
    return lines, summary


def load_columns(out: Path) -> dict[str, Any]:
    """A columns run's doc read back from its output dir (``results.json`` and every
    run's records), for :func:`render_columns` (``headline.py --from``)."""
    from lbtune.loadgen.recordio import read_records

    doc: dict[str, Any] = json.loads((out / "results.json").read_text(encoding="utf-8"))
    doc["runs"] = [
        Run(
            config=r["config"],
            repeat=r["repeat"],
            window=(r["window"][0], r["window"][1]),
            records=list(
                read_records(out / "runs" / f"{r['repeat'] + 1}-{r['config']}" / "requests.parquet")
            ),
            gpu_sd=r["gpu_sd"],
            kv_sd=r["kv_sd"],
            degraded=tuple(r["degraded"]),
            seconds=r["seconds"],
            hit=r.get("hit"),
        )
        for r in doc["runs"]
    ]
    return doc


def write_results(
    doc: dict[str, Any],
    summary: dict[str, Any],
    lines: list[str],
    out: Path,
    args: argparse.Namespace,
    clean: Callable[[Any], Any],
) -> None:
    body = {k: v for k, v in doc.items() if k != "runs"}
    body["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    body["runs"] = [
        {
            "config": r.config,
            "repeat": r.repeat,
            "window": list(r.window),
            "gpu_sd": r.gpu_sd,
            "kv_sd": r.kv_sd,
            "hit": r.hit,
            "degraded": list(r.degraded),
            "seconds": r.seconds,
            "records": len(r.records),
        }
        for r in doc["runs"]
    ]
    body["summary"] = summary
    body["table_md"] = lines
    (out / "results.json").write_text(json.dumps(clean(body), indent=2), encoding="utf-8")
