"""What an apply costs per optimizer trial: direct runtime call vs ansible-runner.

Starts a mini2 cluster in a temp state dir and times, ``--repeats`` times each (median):

  (a)  the playbook-free runtime call: ``set weight`` for every server (one socket connection)
  (a') the direct target path, weights only (validate, render, runtime API, read-back)
  (b)  ``lbtune apply`` through ansible-runner, weights only
  (c)  a structural change with a hitless reload: direct, and through ansible-runner

With ``--envoy``, the same rows for the Envoy target (mini2-envoy): weights through EDS
files, structure through CDS/RDS files after ``envoy --mode validate`` (docs/envoy.md).
With ``--nginx``, the rows for the nginx target (mini2-nginx): no runtime API, so weights
and structure alike render nginx.conf, pass ``nginx -t`` and reload gracefully (docs/nginx.md).

and, to say where the Ansible time goes: an empty play (runner + ansible-playbook
start-up), the same play with fact gathering on, and a play with one no-op task.

    .venv/bin/python benchmarks/apply_latency.py [--repeats 5] [--json] [--envoy | --nginx]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from lbtune.apply import apply_params
from lbtune.apply.runner import run_playbook
from lbtune.cluster import api
from lbtune.cluster.config import load_config
from lbtune.records.quantiles import percentile
from lbtune.targets.haproxy.target import HaproxyTarget

PLAYS = {
    "empty play (startup)": "gather_facts: false\n  tasks: []",
    "empty play + gather_facts": "gather_facts: true\n  tasks: []",
    "one no-op task": "gather_facts: false\n  tasks:\n    - ansible.builtin.meta: noop",
}


def median_s(fn: Callable[[int], object], repeats: int) -> float:
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    return percentile(times, 50)


def envoy_rows(n: int) -> dict[str, float]:
    """Envoy (mini2-envoy): weights through EDS files, structure through CDS/RDS files
    (after ``envoy --mode validate``), direct and through ansible-runner."""
    from lbtune.targets import get_target
    from lbtune.targets.envoy import deploy

    res: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="lbt-bench-") as tmp:
        state = Path(tmp)
        ep = api.up(load_config("mini2-envoy")[0], state)
        try:
            t = get_target("envoy", ep)
            t.apply(t.space().baseline())
            servers = [r.name for r in ep.replicas]
            policies = ["LEAST_REQUEST", "ROUND_ROBIN"]
            res["(a') direct apply, weights (EDS)"] = median_s(
                lambda i: t.apply({f"weight.{s}": 60 + i for s in servers}), n * 4
            )
            res["(b) ansible apply, weights (EDS)"] = median_s(
                lambda i: apply_params(
                    t, {f"weight.{s}": 90 + i for s in servers}, via="ansible", record=False
                ),
                n,
            )
            layout = deploy.read_layout(state)
            res["envoy --mode validate alone"] = median_s(
                lambda i: deploy.validate(layout, t.read_live()), n
            )
            res["(c) direct apply, structural (CDS+RDS)"] = median_s(
                lambda i: t.apply({"lb_policy": policies[i % 2]}), n * 2
            )
            res["(c) ansible apply, structural (CDS+RDS)"] = median_s(
                lambda i: apply_params(
                    t, {"lb_policy": policies[i % 2]}, via="ansible", record=False
                ),
                n,
            )
        finally:
            api.down(state)
    return res


def nginx_rows(n: int) -> dict[str, float]:
    """nginx (mini2-nginx): every change renders nginx.conf, passes ``nginx -t`` and
    reloads gracefully (no runtime API), direct and through ansible-runner."""
    from lbtune.targets.nginx import process
    from lbtune.targets.nginx.balancer import BALANCER

    res: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="lbt-bench-") as tmp:
        state = Path(tmp)
        ep = api.up(load_config("mini2-nginx")[0], state)
        try:
            t = BALANCER.target(ep)
            t.apply(t.space().baseline())
            servers = [r.name for r in ep.replicas]
            algos = ["least_conn", "round_robin"]
            res["(a') direct apply, weights (reload)"] = median_s(
                lambda i: t.apply({f"weight.{s}": 20 + i for s in servers}), n * 4
            )
            res["(b) ansible apply, weights (reload)"] = median_s(
                lambda i: apply_params(
                    t, {f"weight.{s}": 60 + i for s in servers}, via="ansible", record=False
                ),
                n,
            )
            res["nginx -t alone"] = median_s(lambda i: process.test_config(t.site, t.site.conf), n)
            res["(c) direct apply, structural (reload)"] = median_s(
                lambda i: t.apply({"algorithm": algos[i % 2]}), n * 2
            )
            res["(c) ansible apply, structural (reload)"] = median_s(
                lambda i: apply_params(t, {"algorithm": algos[i % 2]}, via="ansible", record=False),
                n,
            )
        finally:
            api.down(state)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--envoy", action="store_true", help="measure the Envoy target instead")
    ap.add_argument("--nginx", action="store_true", help="measure the nginx target instead")
    args = ap.parse_args()
    n = args.repeats
    if args.envoy or args.nginx:
        rows = envoy_rows(n) if args.envoy else nginx_rows(n)
        first = next(iter(rows.values()))
        if args.json:
            print(json.dumps({k: {"median_s": v, "ratio": v / first} for k, v in rows.items()}))
            return
        print(f"{'what':45} {'median':>12} {'x (a)':>10}")
        for k, v in rows.items():
            print(f"{k:45} {v * 1000:10.2f}ms {v / first:10.1f}")
        return
    with tempfile.TemporaryDirectory(prefix="lbt-bench-") as tmp:
        state = Path(tmp)
        ep = api.up(load_config("mini2")[0], state)
        try:
            t = HaproxyTarget(ep)
            t.apply(t.space().baseline())
            servers = [r.name for r in ep.replicas]
            live = [(s.backend, s.server) for s in t.runtime.servers_state()]
            algos = ["leastconn", "roundrobin"]
            res: dict[str, float] = {}
            res["(a) runtime call, weights"] = median_s(
                lambda i: t.runtime.set_weights({r: 50 + i for r in live}), n * 10
            )
            res["(a') direct apply, weights"] = median_s(
                lambda i: t.apply({f"weight.{s}": 60 + i for s in servers}), n * 4
            )
            res["(b) ansible apply, weights"] = median_s(
                lambda i: apply_params(
                    t, {f"weight.{s}": 90 + i for s in servers}, via="ansible", record=False
                ),
                n,
            )
            res["(c) direct apply, structural + reload"] = median_s(
                lambda i: t.apply({"algorithm": algos[i % 2]}), n * 2
            )
            res["(c) ansible apply, structural + reload"] = median_s(
                lambda i: apply_params(t, {"algorithm": algos[i % 2]}, via="ansible", record=False),
                n,
            )
            for name, body in PLAYS.items():
                pb = state / f"bench-{len(res)}.yml"
                pb.write_text(f"- hosts: balancers\n  {body}\n")

                def play(i: int, pb: Path = pb) -> object:
                    return run_playbook(str(pb), state_dir=state, extravars={})

                res[f"ansible: {name}"] = median_s(play, n)
        finally:
            api.down(state)
    base = res["(a) runtime call, weights"]
    if args.json:
        print(json.dumps({k: {"median_s": v, "ratio": v / base} for k, v in res.items()}))
        return
    print(f"{'what':45} {'median':>12} {'x (a)':>10}")
    for k, v in res.items():
        print(f"{k:45} {v * 1000:10.2f}ms {v / base:10.0f}")


if __name__ == "__main__":
    main()
