"""Twin speed: virtual seconds simulated per CPU second, one trial and a pool of trials.

For ``hetero4``/``mixed`` and ``mini2``/``chat`` (each cluster at its own time scale unless
``--time-scale``), one virtual run of ``--duration`` s (default 600: a 10-minute window)
under round robin and under the ``llm`` scheduler: CPU seconds, virtual s per CPU s,
events, requests, and the same with chunk times off. Then ``--trials`` independent trials
(hetero4/mixed, configs alternating) through :class:`lbtune.twin.pool.TwinPool` on every
core, against the same trials in one process: trials per wall minute. The conditions
(machine, Python, time scale, duration) are printed beside the figures. No cluster, no
sockets: safe to run without the machine's lock (it does load both cores for the pool
part)::

    .venv/bin/python benchmarks/twin_speed.py                 # ~1-2 min
    .venv/bin/python benchmarks/twin_speed.py --duration 120 --trials 4
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Sequence

from lbtune.cluster.twin import twin_cluster, twin_params
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions
from lbtune.twin.options import TwinOptions
from lbtune.twin.pool import TwinJob, TwinPool
from lbtune.twin.requests import RequestSource
from lbtune.twin.run import Reuse, simulate

FACTORY = "lbtune.targets.haproxy.twin:routing_model"


def one(cluster: str, scenario: str, args: argparse.Namespace) -> list[str]:
    tc = twin_cluster(cluster)
    scale = args.time_scale or tc.config.time_scale
    plan = plan_run(StressOptions(scenario=scenario, duration_s=args.duration))
    src = RequestSource(plan, tc.config.seed)
    lines = [f"{cluster}/{scenario}: time scale {scale:g}, {args.duration:g} virtual s"]
    base, _ = twin_params(tc)
    for algorithm in ("roundrobin", "roundrobin", "llm"):
        for chunks in (True, False):
            params = {**base, "algorithm": algorithm}
            model = tc.routing(params)
            opts = TwinOptions(time_scale=scale, host_seed=tc.config.seed, chunk_times=chunks)
            run = simulate(plan, tc.replicas, model, opts, Reuse(src))
            cold = "(requests built)" if len(lines) == 1 else "(requests shared)"
            lines.append(
                f"  {algorithm:10} chunk times {'on ' if chunks else 'off'} {cold}: "
                f"{run.cpu_s:6.2f} CPU s, {run.virtual_s / run.cpu_s:6.0f} virtual s per CPU s, "
                f"{run.events} events, {len(run.records)} requests"
            )
    return lines


def pool(args: argparse.Namespace) -> list[str]:
    tc = twin_cluster("hetero4")
    base, _ = twin_params(tc)
    plan = plan_run(StressOptions(scenario="mixed", duration_s=args.pool_duration))
    opts = TwinOptions(time_scale=tc.config.time_scale, host_seed=tc.config.seed)
    algos = ("roundrobin", "leastconn", "random", "llm")
    jobs = [
        TwinJob(plan, tuple(tc.replicas), FACTORY, {**base, "algorithm": algos[i % 4]}, opts)
        for i in range(args.trials)
    ]
    out = []
    for workers in (1, os.cpu_count() or 1):
        t0 = time.monotonic()
        with TwinPool(workers) as p:
            runs = p.map(jobs)
        wall = time.monotonic() - t0
        out.append(
            f"  {args.trials} trials of {args.pool_duration:g} virtual s on {workers} "
            f"process(es): {wall:.1f} s wall, {60 * args.trials / wall:.1f} trials per minute "
            f"(CPU in the trials {sum(r.cpu_s for r in runs):.1f} s)"
        )
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--duration", type=float, default=600.0, help="Virtual seconds per run.")
    ap.add_argument("--time-scale", type=float, help="Override the clusters' time scales.")
    ap.add_argument("--trials", type=int, default=8, help="Pool part: trials (0: skip).")
    ap.add_argument("--pool-duration", type=float, default=120.0)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    print(
        f"conditions: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.2f}"
    )
    for cluster, scenario in (("hetero4", "mixed"), ("mini2", "chat")):
        print("\n".join(one(cluster, scenario, args)))
    if args.trials:
        print("pool (hetero4/mixed, configs alternating):")
        print("\n".join(pool(args)))


if __name__ == "__main__":
    main()
