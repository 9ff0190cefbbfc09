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
   failed requests, each with a 95 % bootstrap CI; then winner/RR and LC/RR next to the
   source's ratios, the knobs where the winner differs from RR and the per-replica
   request share of each config.

Confidence intervals (``--bootstrap`` resamples, percentile method):

* latencies and failures: requests pooled over the repeats (those sent in each run's
  measurement window, warm-up and cool-down excluded), resampled with replacement;
* throughput: each run's window is cut into ~2.5 s bins of completed requests / output
  tokens, and the bins are resampled (resampling requests would keep their count fixed);
* GPU-util std-dev (and the KV-cache-usage std-dev shown beside it): one value per run
  from Prometheus, resampled over the repeats (with 3 repeats: a rough interval);
* ratios: the two configs are resampled independently and the ratio taken per resample;
* "runs+requests" (ratio table): resample the runs, then the requests (bins) within each
  drawn run — it carries run-to-run variance, which the request-level interval misses
  (an A/A comparison showed it; see docs/results.md). "beats source? yes (CI)" uses it.

The cluster is always brought down at the end (``finally``). Everything is written to
``--out`` (default ``/tmp/lbtune-headline-<time>/``): ``results.json``, ``winner.yaml``,
the per-request records of every run and the study's SQLite file; ``--from DIR``
re-analyses such a directory without running anything. Results: docs/results.md.

    .venv/bin/python benchmarks/headline.py            # ~10.5 min: 10-trial study + 3x3x30 s
    .venv/bin/python benchmarks/headline.py --quick    # ~3 min: budget 4, 1 repeat of 15 s
    .venv/bin/python benchmarks/headline.py --params winner.yaml --repeats 5
    .venv/bin/python benchmarks/headline.py --from /tmp/lbtune-headline-<time>
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lbtune.cluster import api
from lbtune.cluster.config import PortsConfig, load_config
from lbtune.loadgen.recordio import read_records
from lbtune.loadgen.records import RequestRecord
from lbtune.scenario import load_scenario
from lbtune.stress import StressOptions, run_stress
from lbtune.targets import get_target
from lbtune.targets.base import ParamSet
from lbtune.targets.space import ParameterSpace, load_params_file

CONFIGS = ("RR", "LC", "W")
LABELS = {"RR": "round robin", "LC": "least-conn", "W": "tuned winner"}
BIN_S = 2.5
# The source material's figures: (round robin, least-conn or None, tuned).
SOURCE: dict[str, tuple[float, float | None, float]] = {
    "p99_e2e": (2140, 1890, 960),
    "ttft_p50": (120, None, 58),
    "ttft_p99": (120, None, 58),
    "rps": (180, None, 252),
    "tok_s": (180, None, 252),
    "gpu_sd": (0.42, 0.35, 0.11),
    "fail": (3.7, 2.1, 0.3),
}
NEAR_ZERO_SD = 0.01
"""Below this, RR's std-dev is ~0 and ratios to it are not shown."""
EXTRA = frozenset({"ttft_p99_all", "kv_sd"})
"""Rows shown for context, not compared with the source."""
# key, row label, unit, display scale, higher is better
ROWS: tuple[tuple[str, str, str, float, bool], ...] = (
    ("p99_e2e", "P99 latency (end to end)", "s", 1.0, False),
    ("ttft_p50", "TTFT P50 (streamed requests)", "ms", 1000.0, False),
    ("ttft_p99", "TTFT P99 (streamed requests)", "ms", 1000.0, False),
    ("ttft_p99_all", "  (TTFT P99, all requests, extra)", "ms", 1000.0, False),
    ("rps", "throughput, requests/s", "req/s", 1.0, True),
    ("tok_s", "throughput, output tokens/s", "tok/s", 1.0, True),
    ("gpu_sd", "GPU balance: std-dev of SM activity across replicas", "", 1.0, False),
    ("kv_sd", "  (KV-cache-usage std-dev, extra)", "", 1.0, False),
    ("fail", "failed requests", "%", 100.0, False),
)


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Measurement: one run per (repeat, config), records kept.


@dataclass
class Run:
    config: str
    repeat: int
    window: tuple[float, float]
    records: list[RequestRecord]
    gpu_sd: float | None
    kv_sd: float | None
    degraded: tuple[str, ...]
    seconds: float


@dataclass
class Pooled:
    """One config's data pooled over its runs."""

    e2e: np.ndarray
    ttft: np.ndarray
    """Streamed requests only: a non-streamed response's first chunk is the whole body."""
    ttft_all: np.ndarray
    failed: np.ndarray
    """1.0 per failed request, 0.0 per success, over judged requests (cancelled excluded)."""
    bins_done: np.ndarray
    bins_tokens: np.ndarray
    bins_s: np.ndarray
    gpu_sd: np.ndarray
    kv_sd: np.ndarray
    sent: int
    share: dict[str, float] = field(default_factory=dict)
    replica_p99: dict[str, float] = field(default_factory=dict)


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
    )


def pool(runs: Sequence[Run]) -> Pooled:
    e2e: list[float] = []
    ttft: list[float] = []
    ttft_all: list[float] = []
    failed: list[float] = []
    done: list[float] = []
    tokens: list[float] = []
    secs: list[float] = []
    sent_by: dict[str, int] = {}
    e2e_by: dict[str, list[float]] = {}
    sent = 0
    for run in runs:
        start, end = run.window
        edges = np.linspace(start, end, max(1, round((end - start) / BIN_S)) + 1)
        d = np.zeros(len(edges) - 1)
        tk = np.zeros(len(edges) - 1)
        for r in run.records:
            if r.outcome == "ok" and start <= r.ended_at < end:
                i = min(int(np.searchsorted(edges, r.ended_at, side="right")) - 1, len(d) - 1)
                d[i] += 1
                tk[i] += r.output_tokens or 0
            if not start <= r.sent_at < end:
                continue
            sent += 1
            name = r.replica or "unknown"
            sent_by[name] = sent_by.get(name, 0) + 1
            if r.outcome == "cancelled":  # cut off by the test's end: no verdict
                continue
            failed.append(0.0 if r.outcome == "ok" else 1.0)
            if r.outcome == "ok":
                e2e.append(r.e2e)
                e2e_by.setdefault(name, []).append(r.e2e)
                if r.ttft is not None:
                    ttft_all.append(r.ttft)
                    if r.stream:
                        ttft.append(r.ttft)
        done += list(d)
        tokens += list(tk)
        secs += list(np.diff(edges))
    return Pooled(
        e2e=np.array(e2e),
        ttft=np.array(ttft),
        ttft_all=np.array(ttft_all),
        failed=np.array(failed),
        bins_done=np.array(done),
        bins_tokens=np.array(tokens),
        bins_s=np.array(secs),
        gpu_sd=np.array([r.gpu_sd for r in runs if r.gpu_sd is not None]),
        kv_sd=np.array([r.kv_sd for r in runs if r.kv_sd is not None]),
        sent=sent,
        share={k: v / sent for k, v in sorted(sent_by.items())} if sent else {},
        replica_p99={k: float(np.percentile(v, 99)) for k, v in sorted(e2e_by.items())},
    )


# ---------------------------------------------------------------------------------------
# Statistics: point value and bootstrap distribution of every figure.

Stat = Callable[[np.ndarray], np.ndarray]  # (B, n) resampled values -> (B,) statistics


def _resample(values: np.ndarray, stat: Stat, b: int, rng: np.random.Generator) -> np.ndarray:
    n = len(values)
    if n == 0:
        return np.full(b, np.nan)
    out = np.empty(b)
    step = max(1, 4_000_000 // n)  # keep each (chunk, n) matrix small
    for lo in range(0, b, step):
        hi = min(b, lo + step)
        out[lo:hi] = stat(values[rng.integers(0, n, size=(hi - lo, n))])
    return out


def per_run(values: np.ndarray, b: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap of the mean over runs; no interval (NaN) from a single run."""
    if len(values) < 2:
        return np.full(b, np.nan)
    return _resample(values, lambda m: np.asarray(m.mean(axis=1)), b, rng)


def figures(p: Pooled, b: int, rng: np.random.Generator) -> dict[str, tuple[float, np.ndarray]]:
    """``{key: (point value, bootstrap draws)}``; NaN where there is nothing to compute."""

    def pct(q: float) -> Stat:
        return lambda m: np.percentile(m, q, axis=1)

    def mean(m: np.ndarray) -> np.ndarray:
        return np.asarray(m.mean(axis=1))

    def point(values: np.ndarray, fn: Callable[[np.ndarray], float]) -> float:
        return fn(values) if len(values) else math.nan

    out: dict[str, tuple[float, np.ndarray]] = {
        "p99_e2e": (point(p.e2e, lambda v: float(np.percentile(v, 99))),
                    _resample(p.e2e, pct(99), b, rng)),
        "ttft_p50": (point(p.ttft, lambda v: float(np.percentile(v, 50))),
                     _resample(p.ttft, pct(50), b, rng)),
        "ttft_p99": (point(p.ttft, lambda v: float(np.percentile(v, 99))),
                     _resample(p.ttft, pct(99), b, rng)),
        "ttft_p99_all": (point(p.ttft_all, lambda v: float(np.percentile(v, 99))),
                         _resample(p.ttft_all, pct(99), b, rng)),
        "fail": (point(p.failed, lambda v: float(v.mean())), _resample(p.failed, mean, b, rng)),
        "gpu_sd": (point(p.gpu_sd, lambda v: float(v.mean())), per_run(p.gpu_sd, b, rng)),
        "kv_sd": (point(p.kv_sd, lambda v: float(v.mean())), per_run(p.kv_sd, b, rng)),
    }  # fmt: skip
    # Throughput: resample time bins (rows of [completed, tokens, seconds]) together.
    n = len(p.bins_s)
    if n:
        idx = rng.integers(0, n, size=(b, n))
        secs = p.bins_s[idx].sum(axis=1)
        total = p.bins_s.sum()
        out["rps"] = (float(p.bins_done.sum() / total), p.bins_done[idx].sum(axis=1) / secs)
        out["tok_s"] = (float(p.bins_tokens.sum() / total), p.bins_tokens[idx].sum(axis=1) / secs)
    else:
        out["rps"] = out["tok_s"] = (math.nan, np.full(b, np.nan))
    return out


def two_level(runs: Sequence[Pooled], b: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Bootstrap draws that also carry run-to-run variance: resample the runs, then the
    requests (or throughput bins) within each drawn run, and pool."""
    keys = ("p99_e2e", "ttft_p50", "ttft_p99", "ttft_p99_all", "fail", "rps", "tok_s")
    out = {k: np.full(b, np.nan) for k in keys}
    k = len(runs)
    if k == 0:
        return out

    def draw(a: np.ndarray) -> np.ndarray:
        return a[rng.integers(0, len(a), len(a))] if len(a) else a

    for i in range(b):
        chosen = [runs[j] for j in rng.integers(0, k, k)]
        e2e = np.concatenate([draw(r.e2e) for r in chosen])
        ttft = np.concatenate([draw(r.ttft) for r in chosen])
        ttft_all = np.concatenate([draw(r.ttft_all) for r in chosen])
        failed = np.concatenate([draw(r.failed) for r in chosen])
        done = tokens = secs = 0.0
        for r in chosen:
            if len(r.bins_s):
                j = rng.integers(0, len(r.bins_s), len(r.bins_s))
                done += r.bins_done[j].sum()
                tokens += r.bins_tokens[j].sum()
                secs += r.bins_s[j].sum()
        if len(e2e):
            out["p99_e2e"][i] = np.percentile(e2e, 99)
        if len(ttft):
            out["ttft_p50"][i], out["ttft_p99"][i] = np.percentile(ttft, [50, 99])
        if len(ttft_all):
            out["ttft_p99_all"][i] = np.percentile(ttft_all, 99)
        if len(failed):
            out["fail"][i] = failed.mean()
        if secs:
            out["rps"][i], out["tok_s"][i] = done / secs, tokens / secs
    return out


def ci(draws: np.ndarray) -> tuple[float, float]:
    ok = draws[np.isfinite(draws)]
    if len(ok) == 0:
        return math.nan, math.nan
    lo, hi = np.percentile(ok, [2.5, 97.5])
    return float(lo), float(hi)


def ratio(
    num: tuple[float, np.ndarray], den: tuple[float, np.ndarray]
) -> tuple[float, float, float]:
    """(point ratio, CI low, CI high); NaN when the denominator is 0 or missing."""
    if not den[0] or not math.isfinite(den[0]) or not math.isfinite(num[0]):
        return math.nan, math.nan, math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        lo, hi = ci(num[1] / den[1])
    return num[0] / den[0], lo, hi


# ---------------------------------------------------------------------------------------
# Rendering.


def fmt(value: float, scale: float, unit: str) -> str:
    if not math.isfinite(value):
        return "n/a"
    v = value * scale
    if unit == "s":
        return f"{v:.2f} s"
    if unit == "ms":
        return f"{v:.0f} ms"
    if unit == "%":
        return f"{v:.1f} %"
    if unit in ("req/s", "tok/s"):
        return f"{v:.2f}" if v < 100 else f"{v:.0f}"
    return f"{v:.3f}"


def fmt_ci(lo: float, hi: float, scale: float, unit: str) -> str:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return ""
    return f"[{fmt(lo, scale, unit).split()[0]}, {fmt(hi, scale, unit).split()[0]}]"


def pct_change(r: float) -> str:
    return "n/a" if not math.isfinite(r) else f"{(r - 1) * 100:+.0f} %"


def source_ratio(key: str, which: int) -> float:
    rr, lc, tuned = SOURCE[key]
    other = lc if which == 1 else tuned
    return math.nan if other is None else other / rr


def band(r: float, lo: float, hi: float) -> str:
    if not (math.isfinite(r) and math.isfinite(lo) and math.isfinite(hi)):
        return ""
    return f"[{(lo - 1) * 100:+.0f}, {(hi - 1) * 100:+.0f}]"


def verdict(r: float, hi: float, lo: float, src: float, higher_better: bool) -> str:
    if not (math.isfinite(r) and math.isfinite(src)):
        return "n/a"
    if higher_better:
        beats, sure = r > src, math.isfinite(lo) and lo > src
    else:
        beats, sure = r < src, math.isfinite(hi) and hi < src
    return "yes (CI)" if sure else ("yes (point)" if beats else "no")


def render(
    figs: dict[str, dict[str, tuple[float, np.ndarray]]],
    figs2: dict[str, dict[str, np.ndarray]],
    pooled: dict[str, Pooled],
    runs: Sequence[Run],
    args: argparse.Namespace,
    same_params: bool,
) -> list[str]:
    lines = []
    n_rep = len({r.repeat for r in runs})
    lines.append(
        f"## Round robin vs least-conn vs tuned winner — {args.cluster} / {args.scenario}, "
        f"{n_rep} x {args.duration:g} s per config, seed {args.seed}"
    )
    lines.append("")
    head = (
        "| figure | "
        + " | ".join(f"{LABELS[c]} (n={len(pooled[c].e2e)})" for c in CONFIGS)
        + " | source RR → tuned |"
    )
    lines += [head, "|---|" + "---|" * (len(CONFIGS) + 1)]
    for key, label, unit, scale, _hb in ROWS:
        cells = []
        for c in CONFIGS:
            v, draws = figs[c][key]
            lo, hi = ci(draws)
            cells.append(f"{fmt(v, scale, unit)} {fmt_ci(lo, hi, scale, unit)}".strip())
        src = SOURCE.get(key)
        src_txt = ""
        if src is not None:
            su = {"p99_e2e": " ms", "ttft_p50": " ms", "ttft_p99": " ms", "fail": " %"}.get(key, "")
            src_txt = f"{src[0]:g}{su} → {src[2]:g}{su}"
            if key in ("rps", "tok_s"):
                src_txt = f"{src[0]:g} → {src[2]:g} req/s"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {src_txt} |")
    lines.append("")
    lines.append(
        "| figure | winner / RR | CI: requests | CI: runs+requests | source tuned / RR "
        "| beats source? | LC / RR | CI: requests | CI: runs+requests | source LC / RR |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for key, label, _unit, _scale, hb in ROWS:
        if key in EXTRA:
            continue
        cells = []
        for c in ("W", "LC"):
            r, lo, hi = ratio(figs[c][key], figs["RR"][key])
            two = figs2[c].get(key)
            r2, lo2, hi2 = (
                (r, lo, hi)
                if two is None
                else ratio((figs[c][key][0], two), (figs["RR"][key][0], figs2["RR"][key]))
            )
            src_r = source_ratio(key, 2 if c == "W" else 1)
            rr_v = figs["RR"][key][0]
            if key == "gpu_sd" and math.isfinite(rr_v) and rr_v < NEAR_ZERO_SD:
                r = math.nan  # a ratio to a std-dev of ~0 says nothing
            if not math.isfinite(r):
                why = "n/a (RR is 0)" if rr_v == 0 else "n/a (RR ≈ 0)" if key == "gpu_sd" else "n/a"
                cells += [why, "", ""]
            else:
                cells += [pct_change(r), band(r, lo, hi), band(r2, lo2, hi2)]
            cells.append(pct_change(src_r))
            if c == "W":
                cells.append(verdict(r, hi2, lo2, src_r, hb))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "CIs are 95 % percentile bootstraps: 'requests' resamples the pooled requests (bins "
        "for throughput, runs for the std-devs); 'runs+requests' resamples the runs first, so "
        "it also carries run-to-run variance. 'beats source? yes (CI)' needs the "
        "runs+requests interval to lie beyond the source's ratio."
    )
    if same_params:
        lines.append(
            "The winner's parameters equal round robin's: its column is an A/A test of the "
            "noise; any CI there that excludes 0 % is noise the interval did not cover."
        )
    for c in CONFIGS:
        n = len(pooled[c].failed)
        if n and not pooled[c].failed.any():
            lines.append(
                f"{LABELS[c]}: 0 failures in {n} requests; the bootstrap CI of a zero count is "
                f"degenerate, the rule-of-three 95 % upper bound is {3 / n:.1%}."
            )
    lines.append(
        "Source TTFT and throughput come from another study with no least-conn column; its "
        "TTFT percentile is not stated (compared with both P50 and P99 here). TTFT rows count "
        "streamed requests only: for a non-streamed response (10 % of `mixed`) the first "
        "content chunk is the whole body, so its 'TTFT' is its end-to-end time; the extra row "
        "shows TTFT P99 over all requests, as lbtune's run summary computes it."
    )
    return lines


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
    from lbtune.optimize import OptimizeOptions, run_optimize

    say(f"study: {args.budget} trials of {args.trial_duration:g} s (TPE, no confirmation)")
    res = run_optimize(
        OptimizeOptions(
            budget=args.budget,
            scenario=args.scenario,
            target="haproxy",
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
    ap.add_argument("--space", help="A parameter space file for the study (default: HAProxy's).")
    ap.add_argument(
        "--study-seed", type=int, default=None, help="Study traffic + sampler seed (scenario's)."
    )
    ap.add_argument("--repeats", type=int, default=3, help="Runs per config (default 3).")
    ap.add_argument("--duration", type=float, default=30.0, help="Seconds per run (default 30).")
    ap.add_argument("--seed", type=int, default=None, help="Traffic seed of the comparison runs.")
    ap.add_argument("--scenario", default="mixed")
    ap.add_argument("--cluster", default="hetero4", help="Cluster preset or file.")
    ap.add_argument("--bootstrap", type=int, default=2000, help="Bootstrap resamples.")
    ap.add_argument("--out", type=Path, help="Output dir (default /tmp/lbtune-headline-<time>).")
    ap.add_argument("--quick", action="store_true", help="Smoke run: budget 4, 1 x 15 s.")
    ap.add_argument(
        "--from",
        dest="from_dir",
        type=Path,
        help="Re-analyse an earlier output dir (its results.json and records); runs nothing.",
    )
    args = ap.parse_args(argv)
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
    cfg = cfg.model_copy(
        update={"ports": PortsConfig(**dict.fromkeys(PortsConfig.model_fields, 0))}
    )
    t_start = time.monotonic()
    say(f"cluster {cfg.name} (time scale {cfg.time_scale:g}) in {state}, free ports")
    ep = api.up(cfg, state, progress=say)
    try:
        target = get_target("haproxy", ep)
        space = target.space()
        rr = space.baseline()
        lc = {**rr, "algorithm": "leastconn"}
        study_info: dict[str, Any] | None = None
        if args.params is not None:
            w = space.complete(space.validate(load_params_file(args.params), str(args.params)), rr)
            source = f"file {args.params}"
        else:
            w, study_info = run_study(args, state, out)
            source = f"study {study_info['study']}, trial {study_info['best_trial']}"
        (out / "winner.yaml").write_text(
            yaml.safe_dump({"target": "haproxy", "params": w}, sort_keys=False), encoding="utf-8"
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
            p99 = float(np.percentile(ok, 99)) if ok else math.nan
            gpu = math.nan if run.gpu_sd is None else run.gpu_sd
            say(
                f"run {rep + 1}/{args.repeats} {c}: applied in {applied.seconds * 1000:.0f} ms"
                f"{' (reload)' if applied.reloaded else ''}; {len(ok)} ok, P99 e2e {p99:.2f} s, "
                f"GPU sd {gpu:.3f} ({run.seconds:.0f} s)"
                + (f"; GENERATOR BEHIND: {run.degraded}" if run.degraded else "")
            )
        target.apply(rr)  # leave the (temporary) cluster untuned before down
    finally:
        say("bringing the cluster down")
        api.down(state)
    return Outcome(
        cluster=cfg.name,
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
    from lbtune.targets.haproxy.target import SPACE_FILE

    space = ParameterSpace.load(args.space or SPACE_FILE, replicas=o.replicas)
    rr, w = o.params["RR"], o.params["W"]
    rng = np.random.default_rng(20261129)
    pooled = {c: pool([r for r in o.runs if r.config == c]) for c in CONFIGS}
    figs = {c: figures(pooled[c], args.bootstrap, rng) for c in CONFIGS}
    per_run_pools = {c: [pool([r]) for r in o.runs if r.config == c] for c in CONFIGS}
    figs2 = {c: two_level(per_run_pools[c], args.bootstrap, rng) for c in CONFIGS}

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
    lines = render(figs, figs2, pooled, o.runs, args, same_params=(w == rr))
    print("\n".join(lines))
    print()
    print("## Per-replica share of the requests sent (and P99 e2e of each replica, s)")
    print("| replica | " + " | ".join(LABELS[c] for c in CONFIGS) + " |")
    print("|---|" + "---|" * len(CONFIGS))
    for name in sorted({k for p in pooled.values() for k in p.share}):
        cells = []
        for c in CONFIGS:
            share = pooled[c].share.get(name, 0.0)
            p = pooled[c].replica_p99.get(name)
            cells.append(f"{share:.1%}" + (f" ({p:.1f} s)" if p is not None else ""))
        print(f"| {name} | " + " | ".join(cells) + " |")
    degraded = [f"{r.repeat + 1}-{r.config}: {'; '.join(r.degraded)}" for r in o.runs if r.degraded]
    n_rep = len({r.repeat for r in o.runs})
    print()
    print(
        f"conditions: cluster {o.cluster} (time scale {o.time_scale:g}), "
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
        "time_scale": o.time_scale,
        "replicas": o.replicas,
        "winner_source": o.source,
        "params": o.params,
        "study": o.study,
        "figures": {
            c: {
                k: {"value": v, "ci95": list(ci(d)), "ci95_runs": list(ci(figs2[c].get(k, d)))}
                for k, (v, d) in figs[c].items()
            }
            for c in CONFIGS
        },
        "share": {c: pooled[c].share for c in CONFIGS},
        "replica_p99_e2e_s": {c: pooled[c].replica_p99 for c in CONFIGS},
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
        "table_md": lines,
        "wall_s": o.wall_s,
    }
    (out / "results.json").write_text(json.dumps(clean(doc), indent=2), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
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
