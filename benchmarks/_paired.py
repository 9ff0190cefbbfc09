"""The headline benchmark's analysis (pure: no cluster): per-run arrays, paired rounds, tables.

``headline.py`` runs ``RR LC W`` once per repeat; a repeat is a **round** in the sense of
:mod:`lbtune.search.paired`, the same machinery lbtune's confirmation uses: every figure
of a config pools its requests over the rounds in which all three configs were measured,
every percentile is :func:`lbtune.records.quantiles.percentile`, and every interval is
the paired two-level bootstrap (draw the rounds with replacement, the same rounds for all
configs, then the requests within each drawn run). Throughput resamples ~2.5 s bins of
completed requests / output tokens (resampling requests would keep their count fixed);
the GPU-util and KV-usage std-devs are one value per run, so only the round level varies
them. Imported by ``headline.py``; runs nothing on its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from lbtune.records.quantiles import MIN_SAMPLES, percentile
from lbtune.records.requests import RequestRecord
from lbtune.search.paired import Draws, paired_draws

CONFIGS = ("RR", "LC", "W")
LABELS = {"RR": "round robin", "LC": "least-conn", "W": "tuned winner"}
BIN_S = 2.5
KEYS = (
    "p99_e2e",
    "ttft_p50",
    "ttft_p99",
    "ttft_p99_all",
    "fail",
    "rps",
    "tok_s",
    "gpu_sd",
    "kv_sd",
    "hit",
    "p50_e2e",
)
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
EXTRA = frozenset({"ttft_p99_all", "kv_sd", "hit", "p50_e2e"})
"""Rows shown for context, not compared with the source."""
SAMPLES_OF = {"p99_e2e": "e2e", "ttft_p99": "ttft", "ttft_p99_all": "ttft_all"}
"""P99 rows and the samples behind them (their counts are printed beside them)."""
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
Array = np.ndarray[tuple[int], np.dtype[np.float64]]


@dataclass
class Run:
    """One measured run of one config in one repeat (round), records kept."""

    config: str
    repeat: int
    window: tuple[float, float]
    records: list[RequestRecord]
    gpu_sd: float | None
    kv_sd: float | None
    degraded: tuple[str, ...]
    seconds: float
    hit: float | None = None
    """Server-side prefix-cache hit rate over the run (vllm:prefix_cache_hits/queries)."""


@dataclass(frozen=True, eq=False)
class RunArrays:
    """One run's per-request arrays (those sent in its window) and its per-run values."""

    e2e: Array
    ttft: Array
    """Streamed requests only: a non-streamed response's first chunk is the whole body."""
    ttft_all: Array
    failed: Array
    """1.0 per failed request, 0.0 per success, over judged requests (cancelled excluded)."""
    bins_done: Array
    bins_tokens: Array
    bins_s: Array
    gpu_sd: float
    kv_sd: float
    hit: float = math.nan
    sent: int = 0
    sent_by: dict[str, int] = field(default_factory=dict)
    e2e_by: dict[str, list[float]] = field(default_factory=dict)


def arrays(run: Run) -> RunArrays:
    start, end = run.window
    edges = np.linspace(start, end, max(1, round((end - start) / BIN_S)) + 1)
    done = np.zeros(len(edges) - 1)
    tokens = np.zeros(len(edges) - 1)
    e2e: list[float] = []
    ttft: list[float] = []
    ttft_all: list[float] = []
    failed: list[float] = []
    sent_by: dict[str, int] = {}
    e2e_by: dict[str, list[float]] = {}
    sent = 0
    for r in run.records:
        if r.outcome == "ok" and start <= r.ended_at < end:
            i = min(int(np.searchsorted(edges, r.ended_at, side="right")) - 1, len(done) - 1)
            done[i] += 1
            tokens[i] += r.output_tokens or 0
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
    nan = math.nan
    return RunArrays(
        e2e=np.array(e2e),
        ttft=np.array(ttft),
        ttft_all=np.array(ttft_all),
        failed=np.array(failed),
        bins_done=done,
        bins_tokens=tokens,
        bins_s=np.diff(edges),
        gpu_sd=nan if run.gpu_sd is None else run.gpu_sd,
        kv_sd=nan if run.kv_sd is None else run.kv_sd,
        hit=nan if run.hit is None else run.hit,
        sent=sent,
        sent_by=sent_by,
        e2e_by=e2e_by,
    )


def _pct(values: Array, q: float) -> float:
    return percentile(values, q) if values.size else math.nan


def _mean(values: Sequence[float]) -> float:
    ok = [v for v in values if math.isfinite(v)]
    return sum(ok) / len(ok) if ok else math.nan


def stat(runs: Sequence[RunArrays]) -> list[float]:
    """Every figure of :data:`KEYS` over ``runs`` pooled (the one estimator)."""

    def cat(name: str) -> Array:
        return np.concatenate([getattr(r, name) for r in runs])

    e2e, ttft, ttft_all, failed = cat("e2e"), cat("ttft"), cat("ttft_all"), cat("failed")
    secs = float(cat("bins_s").sum())
    return [
        _pct(e2e, 99),
        _pct(ttft, 50),
        _pct(ttft, 99),
        _pct(ttft_all, 99),
        float(failed.mean()) if failed.size else math.nan,
        float(cat("bins_done").sum()) / secs if secs else math.nan,
        float(cat("bins_tokens").sum()) / secs if secs else math.nan,
        _mean([r.gpu_sd for r in runs]),
        _mean([r.kv_sd for r in runs]),
        _mean([r.hit for r in runs]),
        _pct(e2e, 50),
    ]


def resample(r: RunArrays, rng: np.random.Generator) -> RunArrays:
    """The run's requests drawn with replacement (its throughput bins together)."""

    def draw(a: Array) -> Array:
        return a[rng.integers(0, a.size, a.size)] if a.size else a

    j = rng.integers(0, r.bins_s.size, r.bins_s.size)
    return RunArrays(
        e2e=draw(r.e2e),
        ttft=draw(r.ttft),
        ttft_all=draw(r.ttft_all),
        failed=draw(r.failed),
        bins_done=r.bins_done[j],
        bins_tokens=r.bins_tokens[j],
        bins_s=r.bins_s[j],
        gpu_sd=r.gpu_sd,
        kv_sd=r.kv_sd,
        hit=r.hit,
    )


@dataclass(frozen=True, eq=False)
class Analysis:
    """The paired draws of every config over the complete rounds."""

    draws: Draws[RunArrays]
    rounds: tuple[int, ...]
    """Repeat numbers (0-based) in which every config was measured."""
    dropped: tuple[int, ...]
    per_run: dict[tuple[int, str], RunArrays]
    configs: tuple[str, ...] = CONFIGS
    """The arms, in draw order; ratios are against the first (round robin)."""

    def value(self, config: str, key: str) -> float:
        return float(self.draws.point[self.configs.index(config), KEYS.index(key)])

    def spread(self, config: str, key: str) -> tuple[float, float]:
        lo, hi = self.draws.spread(self.configs.index(config), KEYS.index(key))
        return float(lo), float(hi)

    def ratio(self, config: str, key: str, over: str | None = None) -> tuple[float, float, float]:
        """``config / over`` (default: the first arm, RR) of ``key``, paired 95 % interval."""
        base = self.configs.index(over) if over is not None else 0
        r, lo, hi = self.draws.ratio(self.configs.index(config), base, KEYS.index(key))
        return float(r), float(lo), float(hi)

    def count(self, config: str, samples: str) -> int:
        return sum(getattr(self.per_run[(i, config)], samples).size for i in self.rounds)


def analyse(
    runs: Sequence[Run], n_boot: int, seed: int = 20261129, configs: Sequence[str] = CONFIGS
) -> Analysis:
    per_run = {(r.repeat, r.config): arrays(r) for r in runs}
    repeats = sorted({r.repeat for r in runs})
    complete = tuple(i for i in repeats if all((i, c) in per_run for c in configs))
    dropped = tuple(i for i in repeats if i not in complete)
    rounds = [tuple(per_run[(i, c)] for c in configs) for i in complete]
    draws = paired_draws(rounds, stat, resample, n_boot=n_boot, seed=seed)
    return Analysis(draws, complete, dropped, per_run, tuple(configs))


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


def _n_note(n: int) -> str:
    return f"n={n}" + ("" if n >= MIN_SAMPLES["p99"] else ": < 100, not a P99")


def render(
    a: Analysis,
    runs: Sequence[Run],
    cluster: str,
    scenario: str,
    duration: float,
    seed: int,
    same_params: bool,
) -> list[str]:
    """The source material's table per config, then the paired ratios against RR."""
    lines = [
        f"## Round robin vs least-conn vs tuned winner — {cluster} / {scenario}, "
        f"{len(a.rounds)} paired round(s) x {duration:g} s per config, seed {seed}",
        "",
    ]
    if a.dropped:
        lines += [
            "rounds left out (a config was not measured in them): "
            + ", ".join(str(i + 1) for i in a.dropped),
            "",
        ]
    lines += [
        "| figure | " + " | ".join(LABELS[c] for c in CONFIGS) + " | source RR → tuned |",
        "|---|" + "---|" * (len(CONFIGS) + 1),
    ]
    for key, label, unit, scale, _hb in ROWS:
        cells = []
        for c in CONFIGS:
            lo, hi = a.spread(c, key)
            cell = f"{fmt(a.value(c, key), scale, unit)} {fmt_ci(lo, hi, scale, unit)}".strip()
            if key in SAMPLES_OF:
                cell += f" ({_n_note(a.count(c, SAMPLES_OF[key]))})"
            cells.append(cell)
        src = SOURCE.get(key)
        src_txt = ""
        if src is not None:
            su = {"p99_e2e": " ms", "ttft_p50": " ms", "ttft_p99": " ms", "fail": " %"}.get(key, "")
            src_txt = f"{src[0]:g}{su} → {src[2]:g}{su}"
            if key in ("rps", "tok_s"):
                src_txt = f"{src[0]:g} → {src[2]:g} req/s"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {src_txt} |")
    lines += [
        "",
        "| figure | winner / RR | CI (paired rounds) | source tuned / RR | beats source? "
        "| LC / RR | CI (paired rounds) | source LC / RR |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, label, _unit, _scale, hb in ROWS:
        if key in EXTRA:
            continue
        cells = []
        for c in ("W", "LC"):
            r, lo, hi = a.ratio(c, key)
            src_r = source_ratio(key, 2 if c == "W" else 1)
            rr_v = a.value("RR", key)
            if key == "gpu_sd" and math.isfinite(rr_v) and rr_v < NEAR_ZERO_SD:
                r = math.nan  # a ratio to a std-dev of ~0 says nothing
            if not math.isfinite(r):
                why = "n/a (RR is 0)" if rr_v == 0 else "n/a (RR ≈ 0)" if key == "gpu_sd" else "n/a"
                cells += [why, ""]
            else:
                cells += [pct_change(r), band(r, lo, hi)]
            cells.append(pct_change(src_r))
            if c == "W":
                cells.append(verdict(r, hi, lo, src_r, hb))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "CIs are 95 % paired bootstraps (lbtune.search.paired, as in lbtune's confirmation): "
        "each replicate draws the rounds with replacement, the same rounds for every config, "
        "then the requests (throughput: 2.5 s bins) within each drawn run. 'beats source? yes "
        "(CI)' needs the interval to lie beyond the source's ratio. P99 cells show the pooled "
        "sample count; below 100 the 'P99' is within the sample's top few values.",
    ]
    if same_params:
        lines.append(
            "The winner's parameters equal round robin's: its column is an A/A test of the "
            "noise; any CI there that excludes 0 % is noise the interval did not cover."
        )
    for c in CONFIGS:
        n = sum(a.per_run[(i, c)].failed.size for i in a.rounds)
        fails = sum(float(a.per_run[(i, c)].failed.sum()) for i in a.rounds)
        if n and not fails:
            lines.append(
                f"{LABELS[c]}: 0 failures in {n} requests; the bootstrap CI of a zero count is "
                f"degenerate, the rule-of-three 95 % upper bound is {3 / n:.1%}."
            )
    lines.append(
        "Source TTFT and throughput come from another study with no least-conn column; its "
        "TTFT percentile is not stated (compared with both P50 and P99 here). TTFT rows count "
        "streamed requests only: for a non-streamed response (10 % of `mixed`) the first "
        "content chunk is the whole body, so its 'TTFT' is its end-to-end time; the extra row "
        "shows TTFT P99 over all requests."
    )
    return lines


def rounds_table(a: Analysis, runs: Sequence[Run]) -> list[str]:
    """Per round and config: the run's samples and its own P99s (when it has 100)."""
    lines = [
        "## Rounds (each config once per round, interleaved, same traffic)",
        "| round | config | requests (E2E) | streamed (TTFT) | P99 e2e s | P99 TTFT ms "
        "| req/s | generator |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        ra = a.per_run[(run.repeat, run.config)]
        secs = float(ra.bins_s.sum())
        e2e = _pct(ra.e2e, 99) if ra.e2e.size >= MIN_SAMPLES["p99"] else math.nan
        ttft = _pct(ra.ttft, 99) if ra.ttft.size >= MIN_SAMPLES["p99"] else math.nan
        used = "" if run.repeat in a.rounds else " (not paired)"
        lines.append(
            f"| {run.repeat + 1}{used} | {run.config} | {ra.e2e.size} | {ra.ttft.size} | "
            f"{fmt(e2e, 1.0, 's')} | {fmt(ttft, 1000.0, 'ms')} | "
            f"{fmt(float(ra.bins_done.sum()) / secs if secs else math.nan, 1.0, 'req/s')} | "
            f"{'behind: ' + '; '.join(run.degraded) if run.degraded else 'ok'} |"
        )
    return lines


def shares(a: Analysis, config: str) -> tuple[dict[str, float], dict[str, float]]:
    """Per replica: share of the requests sent, and P99 e2e (when it has 100 samples)."""
    sent: dict[str, int] = {}
    e2e: dict[str, list[float]] = {}
    for i in a.rounds:
        ra = a.per_run[(i, config)]
        for k, v in ra.sent_by.items():
            sent[k] = sent.get(k, 0) + v
        for k, vals in ra.e2e_by.items():
            e2e.setdefault(k, []).extend(vals)
    total = sum(sent.values())
    share = {k: v / total for k, v in sorted(sent.items())} if total else {}
    p99 = {k: percentile(v, 99) for k, v in sorted(e2e.items()) if len(v) >= MIN_SAMPLES["p99"]}
    return share, p99
