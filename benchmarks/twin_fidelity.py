"""Twin fidelity: configs drawn from the HAProxy space, each measured live and in the twin.

On the embedded ``hetero4`` cluster (its own state dir, free loopback ports, the cluster's
time scale raised with ``--time-scale``), for each scenario (``mixed`` and ``prefix``):

1. ``--configs`` parameter sets: round robin, least-conn, the ``llm`` scheduler's
   defaults, then draws of Optuna's random sampler over the HAProxy space (``algorithm``
   cycling over every choice, ``llm`` included; the ``agent.*`` knobs left out: hetero4
   runs no agent);
2. **live**: ``--rounds`` interleaved rounds (every config once per round, the order
   rotated each round), each config applied through the target's direct path and
   measured by ``run_stress`` for ``--duration`` s; its figures are a study trial's
   (the summary's, with the censored samples' P99s);
3. **twin**: the same recorded plan (``run.json``), the same params, simulated
   (``lbtune.twin``), figures computed the same way;
4. per scenario: Spearman's rank correlation of the composite score (pooled over the
   rounds: the mean of a config's live scores against its twin score) and the median
   |relative error| of P99 E2E, P99 TTFT and req/s over every live run, with the
   conditions printed beside them.

Everything goes to ``--out`` (``results.json`` and the live run directories);
``--from DIR`` re-runs only the twin against the recorded live runs (``--to-replica-s``,
``--step-extra-s`` ... change the twin's settings): the way to tune the twin without new
live runs. Run the live part under the machine's lock::

    flock /tmp/lbtune-live.lock .venv/bin/python benchmarks/twin_fidelity.py --quick
    .venv/bin/python benchmarks/twin_fidelity.py --from /tmp/lbtune-twin-fidelity-<time>
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _sigterm import exit_on_sigterm

from lbtune.cluster.twin import space_path, twin_cluster, twin_params
from lbtune.records.quantiles import percentile
from lbtune.scenario.runplan import read_run_plan
from lbtune.targets.params import ParamSet
from lbtune.tune.screen import spearman as rank_corr
from lbtune.tune.twincheck import live_figures as run_figures
from lbtune.tune.virtual import twin_figures
from lbtune.twin.options import TwinOptions
from lbtune.twin.requests import RequestSource
from lbtune.twin.run import Reuse, simulate

METRICS = ("p99_e2e_s", "p99_ttft_s", "requests_per_s")


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def draw_configs(cluster: str, n: int, seed: int) -> list[ParamSet]:
    """Round robin, least-conn, llm defaults, then random draws (algorithm cycling)."""
    import optuna

    from lbtune.targets.space import ParameterSpace

    tc = twin_cluster(cluster)
    base, _ = twin_params(tc)
    full = ParameterSpace.load(space_path("haproxy"), [r.name for r in tc.replicas])
    specs = {
        k: v.model_copy(update={"fixed": True}) if k == "algorithm" else v
        for k, v in full.params.items()
        if not k.startswith("agent.")
    }
    space = ParameterSpace(full.target, specs)
    out: list[ParamSet] = [
        dict(base),
        {**base, "algorithm": "leastconn"},
        {**base, "algorithm": "llm"},
    ]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    choices = ("roundrobin", "leastconn", "random", "hash", "llm")
    while len(out) < n:
        algorithm = choices[(len(out) - 3) % len(choices)]
        out.append(space.suggest(study.ask(), {**base, "algorithm": algorithm}))
    return out


def live_runs(args: argparse.Namespace, configs: list[ParamSet], out: Path) -> list[dict[str, Any]]:
    """Cluster up; every scenario x round x config measured live; cluster down."""
    from lbtune.cluster import api
    from lbtune.cluster.config import PortsConfig, load_config
    from lbtune.run.stress import StressOptions, run_stress
    from lbtune.targets import get_target

    cfg = load_config(args.cluster)[0]
    ports = PortsConfig(**dict.fromkeys(PortsConfig.model_fields, 0))
    cfg = cfg.model_copy(update={"ports": ports, "time_scale": args.time_scale})
    state = out / "cluster"
    say(f"cluster {cfg.name} at time scale {cfg.time_scale:g} in {state}")
    ep = api.up(cfg, state, progress=say)
    runs: list[dict[str, Any]] = []
    try:
        target = get_target("haproxy", ep)
        for scenario in args.scenarios:
            for rnd in range(args.rounds):
                order = list(range(len(configs)))
                shift = rnd % len(order)
                for c in order[shift:] + order[:shift]:
                    target.apply(configs[c])
                    run_dir = out / "runs" / f"{scenario}-{rnd}-{c}"
                    t0 = time.monotonic()
                    run_stress(
                        StressOptions(
                            scenario=scenario,
                            duration_s=args.duration,
                            state_dir=state,
                            out_dir=run_dir,
                            write_report=False,
                        ),
                        say=lambda m: None,
                    )
                    runs.append(
                        {"scenario": scenario, "round": rnd, "config": c, "dir": str(run_dir)}
                    )
                    say(f"{scenario} round {rnd} config {c}: {time.monotonic() - t0:.1f} s")
    finally:
        api.down(state)
    return runs


def live_figures(run_dir: Path, scenario: str) -> dict[str, float]:
    """A study trial's figures of a recorded live run."""
    fig, score = run_figures(run_dir)
    return {**{m: getattr(fig, m) for m in METRICS}, "score": score, "samples": fig.samples}


def twin_runs(
    args: argparse.Namespace, configs: list[ParamSet], runs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each recorded run's plan and config, simulated."""
    tc = twin_cluster(args.cluster)
    opts = TwinOptions(
        time_scale=args.time_scale,
        host_seed=tc.config.seed,
        to_replica_s=args.to_replica_s,
        to_client_s=args.to_client_s,
        server_extra_s=args.server_extra_s,
        step_extra_s=args.step_extra_s,
    )
    factory = tc.factory()
    sources: dict[str, RequestSource] = {}
    out = []
    engines = None  # the live cluster's replicas keep their prefix caches between runs
    for r in runs:
        plan = read_run_plan(r["dir"])
        src = sources.get(r["scenario"])
        if src is None or src.plan.load != plan.load or src.plan.seed != plan.seed:
            src = sources[r["scenario"]] = RequestSource(plan, opts.host_seed)
        model = factory(configs[r["config"]], tc.replicas, seed=r["round"])
        run = simulate(src.plan, tc.replicas, model, opts, Reuse(src, engines))
        engines = None if args.cold else run.engines
        fig, score = twin_figures(run)
        twin = {**{m: getattr(fig, m) for m in METRICS}, "score": score, "cpu_s": run.cpu_s}
        out.append({**r, "live": live_figures(Path(r["dir"]), r["scenario"]), "twin": twin})
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when undefined."""
    rho = rank_corr(a, b)
    return float("nan") if rho is None else rho


def analyse(rows: list[dict[str, Any]], configs: list[ParamSet]) -> dict[str, Any]:
    """Per scenario: rank correlation of the score, median |relative error| per metric."""
    out: dict[str, Any] = {}
    for scenario in sorted({r["scenario"] for r in rows}):
        mine = [r for r in rows if r["scenario"] == scenario]
        errors = {
            m: percentile([abs(r["twin"][m] / r["live"][m] - 1) for r in mine], 50) for m in METRICS
        }
        by_config: dict[int, list[dict[str, Any]]] = {}
        for r in mine:
            by_config.setdefault(r["config"], []).append(r)
        live = [statistics.mean(x["live"]["score"] for x in v) for v in by_config.values()]
        twin = [statistics.mean(x["twin"]["score"] for x in v) for v in by_config.values()]
        out[scenario] = {
            "spearman_score": spearman(live, twin),
            "median_abs_rel_error": errors,
            "configs": len(by_config),
            "runs": len(mine),
        }
    return out


def render(doc: dict[str, Any]) -> str:
    a = doc["args"]
    lines = [
        f"conditions: cluster {a['cluster']} at time scale {a['time_scale']:g}, "
        f"{a['duration']:g} s runs, {a['rounds']} round(s), {len(doc['configs'])} configs, "
        f"twin to_replica {a['to_replica_s'] * 1e3:g} ms, to_client {a['to_client_s'] * 1e3:g} "
        f"ms, server_extra {a['server_extra_s'] * 1e3:g} ms, step_extra "
        f"{a['step_extra_s'] * 1e6:g} µs",
        "",
        f"{'scenario':8} {'cfg':>3} {'algorithm':10} {'P99 E2E live/twin':>20} "
        f"{'P99 TTFT live/twin':>20} {'req/s live/twin':>16} {'score live/twin':>16}",
    ]
    for r in doc["rows"]:
        lv, tw = r["live"], r["twin"]
        algo = doc["configs"][r["config"]]["algorithm"]
        lines.append(
            f"{r['scenario']:8} {r['config']:>3} {algo:10} "
            f"{lv['p99_e2e_s']:9.2f} {tw['p99_e2e_s']:9.2f}  "
            f"{lv['p99_ttft_s']:9.3f} {tw['p99_ttft_s']:9.3f}  "
            f"{lv['requests_per_s']:7.2f} {tw['requests_per_s']:7.2f}  "
            f"{lv['score']:7.3f} {tw['score']:7.3f}"
        )
    lines.append("")
    for scenario, s in doc["analysis"].items():
        e = s["median_abs_rel_error"]
        lines.append(
            f"{scenario}: Spearman(score) {s['spearman_score']:.2f} over {s['configs']} configs; "
            f"median |error| P99 E2E {e['p99_e2e_s']:.0%}, P99 TTFT {e['p99_ttft_s']:.0%}, "
            f"req/s {e['requests_per_s']:.0%} ({s['runs']} live runs)"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--cluster", default="hetero4")
    ap.add_argument("--scenarios", default="mixed,prefix")
    ap.add_argument("--configs", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--time-scale", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=11, help="Seed of the config draws.")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--from", dest="source", type=Path, help="Re-run the twin on a result dir.")
    ap.add_argument("--quick", action="store_true", help="6 configs, mixed only, 15 s runs.")
    ap.add_argument(
        "--cold", action="store_true", help="Twin runs start cold (no cache from the run before)."
    )
    defaults = TwinOptions()
    for name in ("to_replica_s", "to_client_s", "server_extra_s", "step_extra_s"):
        flag = "--" + name.replace("_", "-")
        ap.add_argument(flag, type=float, default=getattr(defaults, name))
    args = ap.parse_args(argv)
    if args.quick:
        args.configs, args.scenarios, args.duration = 6, "mixed", 15.0
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    exit_on_sigterm()
    t0 = time.monotonic()
    if args.source is not None:
        prev = json.loads((args.source / "results.json").read_text())
        out, configs, runs = args.source, prev["configs"], prev["live_runs"]
        for key in ("cluster", "time_scale", "duration", "rounds"):
            setattr(args, key, prev["args"][key])
    else:
        out = args.out or Path(f"/tmp/lbtune-twin-fidelity-{time.strftime('%Y%m%d-%H%M%S')}")
        out.mkdir(parents=True, exist_ok=True)
        configs = draw_configs(args.cluster, args.configs, args.seed)
        runs = live_runs(args, configs, out)
    rows = twin_runs(args, configs, runs)
    saved = {k: v for k, v in vars(args).items() if k not in ("source", "out")}
    doc = {
        "args": saved,
        "configs": configs,
        "live_runs": runs,
        "rows": rows,
        "analysis": analyse(rows, configs),
        "wall_s": time.monotonic() - t0,
    }
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    print(render(doc))
    say(f"results: {out / 'results.json'} ({doc['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
