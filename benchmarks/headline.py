"""Headline benchmark: round robin vs least-conn vs the tuned winner, side by side.

On the embedded ``hetero4`` cluster (2x H100, A100, L4 behind HAProxy; its own state dir
and free loopback ports, so a running demo cluster is left alone) with the ``mixed``
scenario:

1. **A tuned winner**: ``--params FILE`` (a ``knob: value`` file, e.g. ``lbtune apply
   --show`` or ``winner.yaml`` from an earlier run of this script), or else a short study
   of its own (``run_optimize``: ``--budget`` trials of ``--trial-duration`` s, TPE, no
   confirmation, no apply, SQLite under the output dir). The study tunes on the
   scenario's seed; the comparison below runs on ``--seed`` (default: another seed), so
   the winner is judged on traffic it was not picked on.
2. **Side by side**: round robin (equal weights), least-conn (equal weights) and the
   winner, interleaved ``RR LC W RR LC W ...``, ``--repeats`` runs of ``--duration`` s
   each, the same seed for every run; each config is applied through the target's
   direct path (the code the Ansible module calls) just before its run.
3. **The source material's table** for each config: P99 end-to-end latency, TTFT P50 and
   P99 (over streamed requests: a non-streamed response's first chunk is its whole body;
   TTFT P99 over all requests, as lbtune's summary has it, is shown as an extra row),
   throughput (req/s, output tok/s), GPU-utilisation std-dev across replicas and
   failed requests, each with a 95 % CI and, beside each P99, the pooled sample count;
   then winner/RR and LC/RR next to the source's ratios, the rounds (per run: requests,
   its own P99s, req/s), the knobs where the winner differs from RR and the per-replica
   request share of each config.

Every figure and interval comes from the machinery lbtune's confirmation uses
(``lbtune.search.paired``; the analysis is in ``benchmarks/_paired.py``): a repeat is a
round (``RR LC W``, same seed), a config's figures pool its requests over the rounds in
which every config was measured, percentiles are ``lbtune.records.quantiles.percentile``,
and the CI (``--bootstrap`` replicates) is the paired two-level bootstrap: draw the
rounds with replacement, the same rounds for every config, then the requests (throughput:
~2.5 s bins) within each drawn run. Ratios are taken per replicate, so run-to-run
variance and the pairing are both in them (an A/A comparison showed that a request-level
interval alone under-covers; see docs/results.md).

The cluster is always brought down at the end (``finally``). Everything is written to
``--out`` (default ``/tmp/lbtune-headline-<time>/``): ``results.json``, ``winner.yaml``,
the per-request records of every run and the study's SQLite file; ``--from DIR``
re-analyses such a directory without running anything. Results: docs/results.md.

    .venv/bin/python benchmarks/headline.py            # ~10.5 min: 10-trial study + 3x3x30 s
    .venv/bin/python benchmarks/headline.py --quick    # ~3 min: budget 4, 1 repeat of 15 s
    .venv/bin/python benchmarks/headline.py --params winner.yaml --repeats 5
    .venv/bin/python benchmarks/headline.py --from /tmp/lbtune-headline-<time>
    .venv/bin/python benchmarks/headline.py --target envoy   # hetero4-envoy (nginx: -nginx)

``--columns`` (the issue-10 table; ``benchmarks/_columns.py``) runs N columns instead of
``RR LC W``: round robin, least-conn, the best stock-HAProxy config (a study with
``algorithm`` cut to the stock ones), the Lua scheduler tuned (``algorithm: llm`` only) and
vllm-router's ``cache_aware`` tuned (on the ``hetero4-router`` cluster), each study of
``--study-budget`` trials, then ``--repeats`` paired rounds of every column, plus the
no-queueing limit (``lbtune.sim.limit``) and each P99 over it. ``--column NAME=TARGET:SPEC``
(repeatable) chooses other columns; ``--time-scale`` speeds the simulated clusters up:

    .venv/bin/python benchmarks/headline.py --columns --scenario mixed   # budget 50 each
    .venv/bin/python benchmarks/headline.py --columns --scenario prefix --study-budget 2 \
        --trial-duration 8 --repeats 1 --duration 10 --time-scale 4      # smoke run, ~5 min

``--target NAME`` benchmarks another balancer: the cluster defaults to the preset
``hetero4-NAME``, and round robin and least-conn are that target's own references (its
space's ``references:``, e.g. nginx ``least_conn``, Envoy ``LEAST_REQUEST``); without it
the target is the cluster's own balancer.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from _paired import CONFIGS, KEYS, LABELS, Run, analyse, render, rounds_table, shares
from _sigterm import exit_on_sigterm

from lbtune.cluster import api
from lbtune.cluster.config import PortsConfig, available_presets, load_config
from lbtune.loadgen.recordio import read_records
from lbtune.records.quantiles import MIN_SAMPLES, percentile
from lbtune.run.stress import StressOptions, run_stress
from lbtune.scenario import load_scenario
from lbtune.targets import TARGETS, get_target
from lbtune.targets.base import ParamSet
from lbtune.targets.space import ParameterSpace, load_params_file


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Measurement: one run per (repeat, config), records kept.


def measure(config: str, repeat: int, args: argparse.Namespace, state: Path, out: Path) -> Run:
    t0 = time.monotonic()
    res = run_stress(
        StressOptions(
            scenario=args.scenario,
            duration_s=args.duration,
            seed=args.seed,
            state_dir=state,
            out_dir=out / "runs" / f"{repeat + 1}-{config}",
            write_report=False,
        ),
        say=lambda m: None,
    )
    s = res.summary
    server = s.server
    kv = [r.kv_usage_avg for r in server.replicas] if server else []
    kv_ok = [v for v in kv if v is not None]
    return Run(
        config=config,
        repeat=repeat,
        window=(s.window.start, s.window.end),
        records=list(read_records(res.records_path)),
        gpu_sd=None if server is None else server.replica_balance,
        kv_sd=float(np.std(kv_ok)) if kv_ok and len(kv_ok) == len(kv) else None,
        degraded=tuple(s.generator.reasons) if s.generator.degraded else (),
        seconds=time.monotonic() - t0,
        hit=None if server is None else server.prefix_cache_hit_rate,
    )


def knob_diff(space: ParameterSpace, rr: ParamSet, w: ParamSet) -> tuple[list[str], int]:
    """Lines ``knob: RR → W`` for the knobs that matter, and the count of inert agent knobs."""
    out, agent = [], 0
    for name in space.params:
        a, b = rr.get(name), w.get(name)
        if a == b:
            continue
        if name.startswith("agent."):
            agent += 1
            continue
        active = space.is_active(name, w)
        note = "" if active else "  (inactive: its condition does not hold)"
        out.append(f"  {name}: {a} → {b}{note}")
    return out, agent


def weight_shares(params: ParamSet, replicas: Sequence[str]) -> str:
    ws = {r: float(params.get(f"weight.{r}", 0)) for r in replicas}
    total = sum(ws.values()) or 1.0
    return ", ".join(f"{r} {v / total:.0%}" for r, v in ws.items())


# ---------------------------------------------------------------------------------------
# The winner.


def run_study(args: argparse.Namespace, state: Path, out: Path) -> tuple[ParamSet, dict[str, Any]]:
    from lbtune.tune.optimize import run_optimize
    from lbtune.tune.options import OptimizeOptions

    say(f"study: {args.budget} trials of {args.trial_duration:g} s (TPE, no confirmation)")
    res = run_optimize(
        OptimizeOptions(
            budget=args.budget,
            scenario=args.scenario,
            target=args.target,
            space=args.space,
            trial_duration_s=args.trial_duration,
            study=f"headline-{time.strftime('%Y%m%d-%H%M%S')}",
            storage=f"sqlite:///{(out / 'study.db').resolve()}",
            apply=False,
            confirm_runs=0,
            seed=args.study_seed,
            state_dir=state,
            reports_root=out,
            out_dir=out / "study",
            write_report=False,
        ),
        say=say,
    )
    best = res.trial(res.best)
    if best is None:
        raise SystemExit("the study produced no feasible completed trial: no winner to measure")
    info = {
        "study": res.study,
        "best_trial": best.number,
        "best_role": best.role,
        "best_objective": best.objective,
        "improvement_vs_baseline": res.improvement,
        "elapsed_s": res.elapsed_s,
        "importances": dict(res.importances),
        "trials": [
            {
                "number": t.number,
                "role": t.role,
                "state": t.state,
                "objective": t.objective,
                "p99_e2e_s": t.figures.p99_e2e_s if t.figures else None,
                "p99_ttft_s": t.figures.p99_ttft_s if t.figures else None,
                "error_rate": t.figures.error_rate if t.figures else None,
                "fail_reason": t.fail_reason,
            }
            for t in res.trials
        ],
    }
    return dict(best.params), info


def print_study(info: dict[str, Any]) -> None:
    print(f"## Study {info['study']} ({info['elapsed_s'] / 60:.1f} min)")
    print("| trial | role | state | composite | P99 e2e s | P99 TTFT s | errors |")
    print("|---|---|---|---|---|---|---|")
    for t in info["trials"]:

        def f(v: float | None, p: str = ".3f") -> str:
            return "" if v is None else format(v, p)

        print(
            f"| {t['number']} | {t['role']} | {t['state']} | {f(t['objective'])} | "
            f"{f(t['p99_e2e_s'], '.2f')} | {f(t['p99_ttft_s'], '.2f')} | "
            f"{f(t['error_rate'], '.1%')} |"
        )
    imp = sorted(info["importances"].items(), key=lambda kv: -kv[1])[:6]
    if imp:
        print("importances (PED-ANOVA): " + ", ".join(f"{k} {v:.2f}" for k, v in imp))
    print(
        f"best: trial {info['best_trial']} ({info['best_role']}), composite "
        f"{info['best_objective']:.3f}"
        + (
            f", {info['improvement_vs_baseline']:+.0%} vs the live baseline (one run each)"
            if info["improvement_vs_baseline"] is not None
            else ""
        )
    )
    print()


# ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--params", type=Path, help="The winner's knob: value file (skip the study).")
    ap.add_argument("--budget", type=int, default=10, help="Study trials (default 10).")
    ap.add_argument("--trial-duration", type=float, default=20.0, help="Seconds per trial.")
    ap.add_argument("--space", help="A parameter space file for the study (default: the target's).")
    ap.add_argument(
        "--target", choices=list(TARGETS), help="Balancer (default: the cluster's own)."
    )
    ap.add_argument(
        "--study-seed", type=int, default=None, help="Study traffic + sampler seed (scenario's)."
    )
    ap.add_argument("--repeats", type=int, default=3, help="Runs per config (default 3).")
    ap.add_argument("--duration", type=float, default=30.0, help="Seconds per run (default 30).")
    ap.add_argument("--seed", type=int, default=None, help="Traffic seed of the comparison runs.")
    ap.add_argument("--scenario", default="mixed")
    ap.add_argument(
        "--cluster", help="Cluster preset or file (default: hetero4, or hetero4-TARGET)."
    )
    ap.add_argument("--bootstrap", type=int, default=2000, help="Bootstrap resamples.")
    ap.add_argument("--out", type=Path, help="Output dir (default /tmp/lbtune-headline-<time>).")
    ap.add_argument("--quick", action="store_true", help="Smoke run: budget 4, 1 x 15 s.")
    ap.add_argument(
        "--columns",
        action="store_true",
        help="The issue-10 columns: RR, LC, best stock HAProxy, tuned llm, tuned cache_aware.",
    )
    ap.add_argument(
        "--column",
        action="append",
        metavar="NAME=TARGET:SPEC",
        help="One column (repeatable; implies --columns): SPEC ref:round-robin|ref:least-conn, "
        "study:KNOB=A,B (a study over the space with KNOB cut to A,B) or a params file.",
    )
    ap.add_argument(
        "--study-budget", type=int, default=50, help="Trials of each --columns study (50)."
    )
    ap.add_argument(
        "--studies-only",
        action="store_true",
        help="Run the study: columns' studies, write <out>/params-<COL>.yaml, measure nothing.",
    )
    ap.add_argument(
        "--time-scale", type=float, help="Override the clusters' time scale (--columns only)."
    )
    ap.add_argument(
        "--pair",
        action="append",
        metavar="X/Y",
        help="Columns to compare paired, X over Y (repeatable; default LLM/STOCK, LLM/CA).",
    )
    ap.add_argument(
        "--from",
        dest="from_dir",
        type=Path,
        help="Re-analyse an earlier output dir (its results.json and records); runs nothing.",
    )
    args = ap.parse_args(argv)
    if args.cluster is None:
        own = f"hetero4-{args.target}"
        args.cluster = own if own in available_presets() else "hetero4"
    if args.quick:
        args.budget, args.repeats, args.duration, args.trial_duration = 4, 1, 15.0, 15.0
    scen = load_scenario(args.scenario)
    if args.study_seed is None:
        args.study_seed = scen.seed
    if args.seed is None:
        args.seed = scen.seed + 1  # traffic the study did not tune on
    if args.out is None:
        args.out = Path(f"/tmp/lbtune-headline-{time.strftime('%Y%m%d-%H%M%S')}")
    return args


@dataclass
class Outcome:
    """What the measurement phase produced (or what ``--from`` read back)."""

    cluster: str
    target: str
    time_scale: float
    replicas: list[str]
    params: dict[str, ParamSet]
    source: str
    study: dict[str, Any] | None
    runs: list[Run]
    wall_s: float


def run_all(args: argparse.Namespace, out: Path) -> Outcome:
    """Cluster up, winner, interleaved runs; the cluster is always brought down."""
    state = out / "cluster"
    cfg = load_config(args.cluster)[0]
    if args.target not in (None, cfg.balancer):
        raise SystemExit(f"--target {args.target}: cluster {cfg.name} runs {cfg.balancer}")
    args.target = cfg.balancer
    cfg = cfg.model_copy(
        update={"ports": PortsConfig(**dict.fromkeys(PortsConfig.model_fields, 0))}
    )
    t_start = time.monotonic()
    say(f"cluster {cfg.name} (time scale {cfg.time_scale:g}) in {state}, free ports")
    ep = api.up(cfg, state, progress=say)
    try:
        target = get_target(args.target, ep)
        space = target.space()
        rr, lc = space.reference("round-robin"), space.reference("least-conn")
        if rr is None or lc is None:
            raise SystemExit(f"{args.target}: its space declares no least-conn reference")
        study_info: dict[str, Any] | None = None
        if args.params is not None:
            w = space.complete(space.validate(load_params_file(args.params), str(args.params)), rr)
            source = f"file {args.params}"
        else:
            w, study_info = run_study(args, state, out)
            source = f"study {study_info['study']}, trial {study_info['best_trial']}"
        (out / "winner.yaml").write_text(
            yaml.safe_dump({"target": args.target, "params": w}, sort_keys=False),
            encoding="utf-8",
        )
        params = {"RR": rr, "LC": lc, "W": w}
        runs: list[Run] = []
        order = [(rep, c) for rep in range(args.repeats) for c in CONFIGS]
        say(
            f"comparison: {' '.join(c for _, c in order)}, {args.duration:g} s each, "
            f"seed {args.seed}"
        )
        for rep, c in order:
            applied = target.apply(params[c])
            run = measure(c, rep, args, state, out)
            runs.append(run)
            lo, hi = run.window
            ok = [r.e2e for r in run.records if r.outcome == "ok" and lo <= r.sent_at < hi]
            p99 = percentile(ok, 99) if len(ok) >= MIN_SAMPLES["p99"] else math.nan
            gpu = math.nan if run.gpu_sd is None else run.gpu_sd
            say(
                f"run {rep + 1}/{args.repeats} {c}: applied in {applied.seconds * 1000:.0f} ms"
                f"{' (reload)' if applied.reloaded else ''}; {len(ok)} ok, P99 e2e {p99:.2f} s "
                f"(n={len(ok)}), "
                f"GPU sd {gpu:.3f} ({run.seconds:.0f} s)"
                + (f"; GENERATOR BEHIND: {run.degraded}" if run.degraded else "")
            )
        target.apply(rr)  # leave the (temporary) cluster untuned before down
    finally:
        say("bringing the cluster down")
        api.down(state)
    return Outcome(
        cluster=cfg.name,
        target=args.target,
        time_scale=cfg.time_scale,
        replicas=[r.name for r in ep.replicas],
        params=params,
        source=source,
        study=study_info,
        runs=runs,
        wall_s=time.monotonic() - t_start,
    )


def load_outcome(out: Path) -> tuple[Outcome, dict[str, Any]]:
    """Read a previous output dir back: results.json plus every run's records."""
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    runs = []
    for r in doc["runs"]:
        recs = out / "runs" / f"{r['repeat'] + 1}-{r['config']}" / "requests.parquet"
        runs.append(
            Run(
                config=r["config"],
                repeat=r["repeat"],
                window=(r["window"][0], r["window"][1]),
                records=list(read_records(recs)),
                gpu_sd=r["gpu_sd"],
                kv_sd=r["kv_sd"],
                degraded=tuple(r["degraded"]),
                seconds=r["seconds"],
            )
        )
    params = doc["params"]
    replicas = doc.get("replicas") or [
        k.split(".", 1)[1] for k in params["RR"] if k.startswith("weight.")
    ]
    outcome = Outcome(
        cluster=doc.get("cluster", doc["args"]["cluster"]),
        target=doc.get("target", "haproxy"),
        time_scale=doc.get("time_scale", 1.0),
        replicas=replicas,
        params=params,
        source=doc["winner_source"],
        study=doc["study"],
        runs=runs,
        wall_s=doc["wall_s"],
    )
    return outcome, doc["args"]


def report(o: Outcome, args: argparse.Namespace, out: Path) -> None:
    """Print the tables (stdout) and write results.json."""
    module = importlib.import_module(TARGETS[o.target].split(":", 1)[0])
    own = Path(str(module.__file__)).with_name("space.yaml")
    space = ParameterSpace.load(args.space or own, replicas=o.replicas)
    rr, w = o.params["RR"], o.params["W"]
    a = analyse(o.runs, args.bootstrap)

    if o.study is not None:
        print_study(o.study)
    print(f"## Winner ({o.source})")
    diff, agent = knob_diff(space, rr, w)
    print("knobs that differ from round robin:")
    print("\n".join(diff) if diff else "  (none: the winner is round robin)")
    if agent:
        print(f"  + {agent} agent.* knobs, inert here (no feedback agent runs in this benchmark)")
    print(f"weight shares: RR {weight_shares(rr, o.replicas)}; W {weight_shares(w, o.replicas)}")
    print()
    lines = render(
        a, o.runs, args.cluster, args.scenario, args.duration, args.seed, same_params=(w == rr)
    )
    print("\n".join(lines))
    print()
    rounds = rounds_table(a, o.runs)
    print("\n".join(rounds))
    print()
    per_replica = {c: shares(a, c) for c in CONFIGS}
    print("## Per-replica share of the requests sent (and P99 e2e of each replica, s)")
    print("| replica | " + " | ".join(LABELS[c] for c in CONFIGS) + " |")
    print("|---|" + "---|" * len(CONFIGS))
    for name in sorted({k for share, _ in per_replica.values() for k in share}):
        cells = []
        for c in CONFIGS:
            share, p99s = per_replica[c]
            p = p99s.get(name)
            cells.append(f"{share.get(name, 0.0):.1%}" + (f" ({p:.1f} s)" if p is not None else ""))
        print(f"| {name} | " + " | ".join(cells) + " |")
    degraded = [f"{r.repeat + 1}-{r.config}: {'; '.join(r.degraded)}" for r in o.runs if r.degraded]
    n_rep = len({r.repeat for r in o.runs})
    print()
    print(
        f"conditions: target {o.target}, cluster {o.cluster} (time scale {o.time_scale:g}), "
        f"scenario {args.scenario}, {n_rep} x {args.duration:g} s per config interleaved, "
        f"seed {args.seed}"
        + ("" if o.study is None else f", study seed {args.study_seed}")
        + f", bootstrap {args.bootstrap}; wall {o.wall_s / 60:.1f} min"
    )
    print("generator fell behind in: " + (", ".join(degraded) if degraded else "no run"))
    print(f"output: {out}")

    doc = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "cluster": o.cluster,
        "target": o.target,
        "time_scale": o.time_scale,
        "replicas": o.replicas,
        "winner_source": o.source,
        "params": o.params,
        "study": o.study,
        "paired_rounds": [i + 1 for i in a.rounds],
        "figures": {
            c: {k: {"value": a.value(c, k), "ci95": list(a.spread(c, k))} for k in KEYS}
            for c in CONFIGS
        },
        "ratios_vs_rr": {
            c: {k: dict(zip(("value", "lo", "hi"), a.ratio(c, k), strict=True)) for k in KEYS}
            for c in ("LC", "W")
        },
        "samples": {c: {s: a.count(c, s) for s in ("e2e", "ttft", "ttft_all")} for c in CONFIGS},
        "share": {c: per_replica[c][0] for c in CONFIGS},
        "replica_p99_e2e_s": {c: per_replica[c][1] for c in CONFIGS},
        "runs": [
            {
                "config": r.config,
                "repeat": r.repeat,
                "window": list(r.window),
                "gpu_sd": r.gpu_sd,
                "kv_sd": r.kv_sd,
                "degraded": list(r.degraded),
                "seconds": r.seconds,
                "records": len(r.records),
            }
            for r in o.runs
        ],
        "table_md": [*lines, "", *rounds],
        "wall_s": o.wall_s,
    }
    (out / "results.json").write_text(json.dumps(clean(doc), indent=2), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    exit_on_sigterm()  # the cluster comes down however the run is stopped
    args = parse_args(argv)
    if args.columns or args.column:
        from _columns import render_columns, run_columns, run_studies, write_results

        if args.from_dir is not None:  # re-analyse: the saved runs, these --pair/--bootstrap
            from _columns import load_columns

            doc = load_columns(args.from_dir)
            for key in ("scenario", "duration", "seed"):
                setattr(args, key, doc["args"].get(key, getattr(args, key)))
            lines, _ = render_columns(doc, args)
            print("\n".join(lines))
            return
        args.out.mkdir(parents=True, exist_ok=True)
        if args.studies_only:
            run_studies(args, args.out, say)
            return
        doc = run_columns(args, args.out, measure, say)
        lines, summary = render_columns(doc, args)
        print("\n".join(lines))
        print(f"wall {doc['wall_s'] / 60:.1f} min; output: {args.out}")
        write_results(doc, summary, lines, args.out, args, clean)
        return
    if args.from_dir is not None:
        outcome, saved = load_outcome(args.from_dir)
        for key in ("scenario", "duration", "seed", "study_seed", "space", "cluster"):
            setattr(args, key, saved.get(key, getattr(args, key)))
        report(outcome, args, args.from_dir)
        return
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    report(run_all(args, out), args, out)


def clean(obj: Any) -> Any:
    """JSON-ready: NaN/inf → None, numpy scalars → Python, tuples → lists."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


if __name__ == "__main__":
    main()
