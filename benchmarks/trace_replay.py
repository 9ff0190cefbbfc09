"""Trace replay: how closely the generator keeps a trace's send schedule, and how closely a
fitted scenario reproduces the trace's shape.

For each format a 20 000-request trace is generated here (no downloads): lognormal prompt
and output lengths, bursty gamma gaps (CV 2) at ``--rate`` requests/s on the trace's clock,
Mooncake requests sharing two-block system prompts, BurstGPT with two models, ShareGPT
conversations of 1-3 turns, and an lbtune ``requests.parquet``. Each timed trace is
replayed with ``lbtune stress`` machinery (``run_stress``) against the embedded ``mini2``
cluster (own state dir, free ports, ``--time-scale``) at 1x, 4x and 16x speed. A replay is
bounded: it plays the trace's first ``--window`` seconds of *replay* time (so 16x plays
16 times more of the trace than 1x), and the table says how many requests that was.
Lateness is ``sent_at - scheduled_at`` per request, from the records (P50, P99, max).
ShareGPT has no times: it is replayed at ``--rate * 4`` req/s Poisson from the scenario.

Then ``fit_trace`` summarizes each whole trace and the fitted scenario's length quantiles
and gap CV are printed beside the trace's.

    .venv/bin/python benchmarks/trace_replay.py                 # ~5 min on 2 busy cores
    .venv/bin/python benchmarks/trace_replay.py --window 5 --formats azure,mooncake
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lbtune.cluster import api
from lbtune.cluster.config import PortsConfig, load_config
from lbtune.loadgen.recordio import read_records, write_parquet
from lbtune.records.quantiles import percentile
from lbtune.records.requests import RequestRecord
from lbtune.run.stress import StressOptions, run_stress
from lbtune.scenario.loader import trace_ref
from lbtune.scenario.traces.fit import fit_trace
from lbtune.scenario.traces.read import read_trace

N = 20_000
T0 = 1_700_000_000.0
FORMATS = ("azure", "mooncake", "burstgpt", "lbtune", "sharegpt")
SPEEDS = (1.0, 4.0, 16.0)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _shape(rate: float, seed: int = 11) -> list[tuple[float, int, int]]:
    """(time s, prompt tokens, output tokens) of N requests: gamma(CV 2) gaps."""
    rng = random.Random(seed)
    k = 1 / 2.0**2
    t = 0.0
    out = []
    for _ in range(N):
        t += rng.gammavariate(k, 1 / k) / rate
        prompt = max(8, min(8000, round(rng.lognormvariate(math.log(200), 0.8))))
        output = max(1, min(256, round(rng.lognormvariate(math.log(12), 0.6))))
        out.append((t, prompt, output))
    return out


def generate(d: Path, rate: float) -> dict[str, Path]:
    rows = _shape(rate)
    files: dict[str, Path] = {}
    p = files["azure"] = d / "azure.csv"
    with p.open("w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for t, a, b in rows:
            stamp = datetime.fromtimestamp(T0 + t, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
            f.write(f"{stamp}0,{a},{b}\n")
    p = files["burstgpt"] = d / "burstgpt.csv"
    with p.open("w") as f:
        f.write("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
        for i, (t, a, b) in enumerate(rows):
            model = "GPT-4" if i % 5 == 0 else "ChatGPT"
            f.write(f"{t:.6f},{model},{a},{b},{a + b},Conversation log\n")
    p = files["mooncake"] = d / "mooncake.jsonl"
    rng = random.Random(5)
    with p.open("w") as f:
        for i, (t, a, b) in enumerate(rows):
            own = [1_000_000 + 8 * i + j for j in range(a // 512 + 1)]
            if i % 2 == 0:  # half share one of 8 two-block system prompts
                g = rng.randrange(8)
                ids, length = [2 * g, 2 * g + 1, *own], 1024 + a
            else:
                ids, length = own, a
            rec = {
                "timestamp": round(t * 1000, 3),
                "input_length": length,
                "output_length": b,
                "hash_ids": ids,
            }
            f.write(json.dumps(rec) + "\n")
    p = files["lbtune"] = d / "run" / "requests.parquet"
    p.parent.mkdir()
    write_parquet(
        [
            RequestRecord(
                request_id=f"r{i}",
                index=i,
                model="llama-3.1-8b-instruct",
                api="chat",
                stream=True,
                sent_at=T0 + t,
                ended_at=T0 + t + 1,
                outcome="ok",
                scheduled_at=T0 + t,
                prompt_tokens=a,
                output_tokens=b,
            )
            for i, (t, a, b) in enumerate(rows)
        ],
        p,
    )
    p = files["sharegpt"] = d / "sharegpt.json"
    words = [
        "the",
        "load",
        "balancer",
        "sends",
        "each",
        "request",
        "to",
        "a",
        "replica",
        "with",
        "a",
        "free",
        "slot",
    ]
    convs: list[dict[str, object]] = []
    i = 0
    while i < N:
        turns = []
        for _ in range(1 + i % 3):
            if i >= N:
                break
            _, a, b = rows[i]
            q = " ".join(words[(i + j) % len(words)] for j in range(min(a, 400)))
            r = " ".join(words[(i + j + 3) % len(words)] for j in range(b))
            turns += [{"from": "human", "value": q}, {"from": "gpt", "value": r}]
            i += 1
        convs.append({"id": f"c{len(convs)}", "conversations": turns})
    p.write_text(json.dumps(convs))
    return files


def replay(
    fmt: str, path: Path, speed: float, window: float, state: Path, out: Path, rate: float
) -> dict[str, Any]:
    if fmt == "sharegpt":
        sc, rate_opt = trace_ref(path, fmt, limit=N), rate * 4
    else:
        sc, rate_opt = trace_ref(path, fmt, speed), None
    t = time.monotonic()
    res = run_stress(
        StressOptions(
            scenario=sc,
            duration_s=window,
            rate=rate_opt,
            state_dir=state,
            out_dir=out,
            write_report=False,
            request_timeout_s=30.0,
        )
    )
    recs = read_records(res.records_path)
    late = [r.sent_at - r.scheduled_at for r in recs if r.scheduled_at is not None]
    ok = sum(r.outcome == "ok" for r in recs)
    return {
        "format": fmt,
        "speed": speed if fmt != "sharegpt" else None,
        "window_s": window,
        "planned": res.plan.load.arrivals,
        "sent": len(recs),
        "ok": ok,
        "lateness_p50_ms": percentile(late, 50) * 1000 if late else None,
        "lateness_p99_ms": percentile(late, 99) * 1000 if late else None,
        "lateness_max_ms": max(late) * 1000 if late else None,
        "degraded": res.summary.generator.degraded,
        "wall_s": time.monotonic() - t,
    }


def fit_rows(fmt: str, path: Path) -> dict[str, Any]:
    doc = fit_trace(path, fmt)
    sc = load_scenario_from(doc)
    rows = read_trace(path, fmt)
    out: dict[str, Any] = {"format": fmt, "fit": doc["fitted"]["fit"]}
    tp = doc["fitted"]["percentiles"]
    for key, dist in (("prompt_tokens", sc.prompt_tokens), ("output_tokens", sc.output_tokens)):
        out[key] = {
            p: (tp[key][f"p{p:g}"], round(dist.quantile(p / 100), 1)) for p in (50.0, 90.0, 99.0)
        }
    if "arrival" in tp:
        out["gap_cv"] = (tp["arrival"]["cv"], sc.load.cv if sc.load.cv else 1.0)
        out["rate"] = (tp["arrival"]["rate"], doc["load"]["rate"])
    out["requests"] = len(rows)
    return out


def load_scenario_from(doc: dict[str, Any]) -> Any:
    from lbtune.scenario import scenario_from_dict

    return scenario_from_dict(doc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=10.0, help="Replay seconds per run.")
    ap.add_argument("--rate", type=float, default=4.0, help="Trace's mean req/s at 1x.")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--time-scale", type=float, default=8.0, help="Simulator speed-up.")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    formats = [f for f in args.formats.split(",") if f]
    out = args.out or Path(tempfile.mkdtemp(prefix="lbtune-trace-replay-"))
    out.mkdir(parents=True, exist_ok=True)
    say(f"generating {N}-request traces in {out}")
    files = generate(out, args.rate)
    cfg = load_config("mini2")[0]
    free = PortsConfig(**dict.fromkeys(PortsConfig.model_fields, 0))
    cfg = cfg.model_copy(update={"time_scale": args.time_scale, "ports": free})
    state = out / "cluster"
    results: list[dict[str, Any]] = []
    ep = api.up(cfg, state, progress=say)
    del ep
    try:
        for fmt in formats:
            for speed in SPEEDS if fmt != "sharegpt" else (1.0,):
                say(f"replay {fmt} x{speed:g}, {args.window:g} s")
                r = replay(
                    fmt, files[fmt], speed, args.window, state, out / f"{fmt}-x{speed:g}", args.rate
                )
                results.append(r)
                say(json.dumps(r))
    finally:
        api.down(state)
    fits = [fit_rows(f, files[f]) for f in formats]
    (out / "results.json").write_text(json.dumps({"replays": results, "fits": fits}, indent=1))
    print(
        f"\nSend lateness (sent_at - scheduled_at), {args.window:g} s of replay per run, "
        f"mini2 at time scale {args.time_scale:g}; trace mean rate {args.rate:g} req/s "
        "at 1x"
    )
    print(
        f"{'format':>9} {'speed':>6} {'planned':>8} {'sent':>6} {'ok':>6} "
        f"{'P50 ms':>8} {'P99 ms':>8} {'max ms':>8} degraded"
    )
    for r in results:
        sp = "-" if r["speed"] is None else f"x{r['speed']:g}"
        print(
            f"{r['format']:>9} {sp:>6} {r['planned']:>8} {r['sent']:>6} {r['ok']:>6} "
            f"{r['lateness_p50_ms'] or 0:8.2f} {r['lateness_p99_ms'] or 0:8.2f} "
            f"{r['lateness_max_ms'] or 0:8.2f} {r['degraded']}"
        )
    print("\nFitted scenario vs trace (trace, fit): length quantiles, gap CV, rate")
    for f in fits:
        parts = [
            f"{k} " + " ".join(f"P{p:g} {a:g}/{b:g}" for p, (a, b) in f[k].items())
            for k in ("prompt_tokens", "output_tokens")
        ]
        if "gap_cv" in f:
            parts.append(f"gap CV {f['gap_cv'][0]:.2f}/{f['gap_cv'][1]:.2f}")
        print(f"{f['format']:>9}: " + "; ".join(parts))
    print(f"\nresults: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
