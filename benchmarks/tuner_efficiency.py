"""Tuner efficiency: TPE (and GP when torch+scipy are installed) against random search.

Real trials cost ~30 s each, so the comparison runs on a cheap synthetic objective over
the *real* HAProxy space (``lbtune/targets/haproxy/space.yaml`` expanded for the four
replicas of ``hetero4``: 4 weights, 4 maxconn, algorithm and its conditional knobs,
queue timeout, length routing, 13 agent coefficients — 26 knobs). The model is
calibrated on real trials of the embedded cluster (``mini2``, a short chat scenario:
live round robin 0.164, least-conn 0.154, best sampled 0.125 — a ~25 % spread, and a
run-to-run noise of ~3 %):

* weights: the score grows with the squared gap between each replica's share of the
  weight and its share of capacity (H100 1.0, A100 0.7, L4 0.25); dynamic algorithms
  (least-conn, random(N), bounded-load hash) forgive part of the gap;
* algorithm: round robin 1.0, least-conn 0.90, random(N) 0.93 − 0.01·N, hash 0.96 with
  an optimum balance factor ~150;
* maxconn: a per-server cap near 2× capacity×16 trims the tail, too low queues;
* ``queue_timeout_s`` < 5 adds errors (penalty); agent knobs are noise dimensions;
* multiplicative log-normal measurement noise, sigma 0.03.

For each seed and method the same three references are enqueued first (as a study
does), then ``--budget`` trials. Reported: trials needed until the incumbent's *true*
score is within 5 % of the best true score any method found for that seed (budget+1
when never), median over seeds, and the random/TPE ratio.

``--pruning``: the same TPE study with the study's pruner (:mod:`lbtune.search.pruning`:
interval low end above the median, never on window 1) against none, each trial
reporting three cumulative window values (noise sigma 0.08, 0.05, 0.03, each with its
95 % interval ``value * exp(±1.96 sigma)``): time spent (windows measured + a fixed
1-window overhead per trial) and whether the final winner is still within 5 % of the
unpruned study's winner.

    .venv/bin/python benchmarks/tuner_efficiency.py --seeds 10 --budget 50 --pruning
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

import numpy as np
import optuna

from lbtune.records.quantiles import percentile
from lbtune.search.pruning import INTERVAL_ATTR, make_pruner
from lbtune.search.study import make_sampler
from lbtune.targets.haproxy.target import SPACE_FILE
from lbtune.targets.space import ParameterSpace

REPLICAS = {"h100-0": 1.0, "h100-1": 1.0, "a100-0": 0.7, "l4-0": 0.25}
SPACE = ParameterSpace.load(SPACE_FILE, replicas=list(REPLICAS))
ALGO = {"roundrobin": 1.0, "leastconn": 0.90, "random": 0.93, "hash": 0.96}
FORGIVE = {"roundrobin": 1.0, "leastconn": 0.35, "random": 0.5, "hash": 0.6}
BASE = 0.164


def true_score(p: dict[str, Any]) -> float:
    algo = str(p["algorithm"])
    w = np.array([float(p[f"weight.{r}"]) for r in REPLICAS])
    cap = np.array(list(REPLICAS.values()))
    share = w / w.sum() if w.sum() > 0 else np.full(len(w), 1 / len(w))
    gap = float(((share - cap / cap.sum()) ** 2).sum()) * 6.0 * FORGIVE[algo]
    s = ALGO[algo] * (1 + gap)
    if algo == "random":
        s -= 0.01 * int(p["random_draws"])
    if algo == "hash":
        s += 0.04 * ((int(p["hash_balance_factor"]) - 150) / 250) ** 2
    for r, c in REPLICAS.items():
        mc = int(p[f"maxconn.{r}"])
        if mc:
            s *= 1 + 0.01 * math.log(mc / (32 * c)) ** 2 - 0.02
    if int(p["queue_timeout_s"]) < 5:
        s *= 1.15
    if int(p["long_request_bytes"]):
        s *= 0.99 if 8192 <= int(p["long_request_bytes"]) <= 65536 else 1.01
    return BASE * s


def references() -> list[dict[str, Any]]:
    rr = SPACE.baseline()
    return [rr, {**rr, "algorithm": "leastconn"}, {**rr, "weight.l4-0": 40}]


def run(method: str, seed: int, budget: int, pruning: bool = False) -> tuple[list[float], float]:
    """True scores of every trial in order (pruned ones as inf) and windows spent."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rng = np.random.default_rng(seed + 1000)
    study = optuna.create_study(
        sampler=make_sampler(method, seed, n_startup=len(references()) + 5),
        pruner=make_pruner("median" if pruning else "none", n_references=3),
    )
    for p in references():
        study.enqueue_trial(p)
    scores: list[float] = []
    windows = 0.0
    for _ in range(budget):
        trial = study.ask()
        p = SPACE.suggest(trial)
        t = true_score(p)
        windows += 1  # apply, warm-up and summary overhead ~ one window
        pruned = False
        found: dict[str, list[float]] = {}
        for step, sigma in enumerate((0.08, 0.05, 0.03), start=1):
            windows += 1
            value = t * math.exp(rng.normal(0, sigma))
            found[str(step)] = [value * math.exp(-1.96 * sigma), value * math.exp(1.96 * sigma)]
            trial.set_user_attr(INTERVAL_ATTR, dict(found))
            trial.report(value, step)
            if pruning and trial.should_prune():
                pruned = True
                break
        if pruned:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            scores.append(math.inf)
            continue
        study.tell(trial, t * math.exp(rng.normal(0, 0.03)))
        scores.append(t)
    return scores, windows


def trials_to(scores: list[float], target: float) -> int:
    best = math.inf
    for i, s in enumerate(scores, start=1):
        best = min(best, s)
        if best <= target:
            return i
    return len(scores) + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budget", type=int, default=50)
    ap.add_argument("--pruning", action="store_true")
    a = ap.parse_args()
    methods = ["tpe", "random"]
    try:
        import scipy  # noqa: F401
        import torch  # noqa: F401

        methods.insert(1, "gp")
    except ImportError:
        print("GP skipped: needs torch and scipy (pip install torch scipy)")
    t0 = time.monotonic()
    need: dict[str, list[int]] = {m: [] for m in methods}
    finals: dict[str, list[float]] = {m: [] for m in methods}
    for seed in range(a.seeds):
        runs = {m: run(m, seed, a.budget)[0] for m in methods}
        best_any = min(min(s) for s in runs.values())
        for m, s in runs.items():
            need[m].append(trials_to(s, best_any * 1.05))
            finals[m].append(min(s) / best_any - 1)
    print(f"budget {a.budget}, {a.seeds} seeds, 26-knob HAProxy space, synthetic objective")
    print(f"{'method':8} {'median trials to 5 %':>21} {'mean':>6} {'reached':>8} {'final gap':>10}")
    for m in methods:
        reached = sum(n <= a.budget for n in need[m])
        print(
            f"{m:8} {percentile(need[m], 50):21.1f} {statistics.mean(need[m]):6.1f} "
            f"{reached:5d}/{a.seeds} {statistics.mean(finals[m]):9.1%}"
        )
    ratio = percentile(need["random"], 50) / percentile(need["tpe"], 50)
    print(f"random / TPE trials-to-5 % ratio: {ratio:.2f} (aim: >= 2)")
    if a.pruning:
        spent, kept, saved = [], 0, []
        for seed in range(a.seeds):
            full, w_full = run("tpe", seed, a.budget, pruning=False)
            part, w_part = run("tpe", seed, a.budget, pruning=True)
            kept += min(part) <= min(full) * 1.05
            saved.append(1 - w_part / w_full)
            spent.append(sum(math.isinf(s) for s in part))
        print(
            "pruning (interval vs median, window 1 protected): "
            f"{statistics.mean(saved):.0%} of measurement time saved, "
            f"{statistics.mean(spent):.1f} trials pruned per study, winner within 5 % of the "
            f"unpruned study's in {kept}/{a.seeds} seeds"
        )
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
