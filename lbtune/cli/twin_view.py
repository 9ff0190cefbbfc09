"""What ``lbtune twin check`` and ``lbtune twin fit`` print: their text and JSON."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lbtune.tune.twincheck import CheckResult
    from lbtune.twin.fitted import Measured, TwinProfile

__all__ = ["check_json", "check_lines", "fit_lines"]


def check_json(res: CheckResult) -> dict[str, Any]:
    from lbtune.objective import FIGURES
    from lbtune.records.jsonform import json_data

    return {
        "cluster": res.cluster,
        "balancer": res.balancer,
        "scenario": res.scenario,
        "duration_s": res.duration_s,
        "rounds": res.rounds,
        "spearman": res.spearman,
        "spearman_ci95": res.spearman_ci,
        "median_rel_error": res.errors,
        "median_rel_error_ci95": res.errors_ci,
        "configs": [
            {
                "config": r.config,
                "params": dict(r.params),
                "live_score": r.live_score,
                "twin_score": r.twin_score,
                "live": json_data(FIGURES, r.live),
                "twin": json_data(FIGURES, r.twin),
            }
            for r in res.rows
        ],
    }


def check_lines(res: CheckResult) -> list[str]:
    lines = [
        f"{res.cluster} ({res.balancer}), {res.scenario}, {len(res.rows)} configs of "
        f"{res.duration_s:g} s"
        + (f" x {res.rounds} interleaved rounds (their means)" if res.rounds > 1 else "")
        + "; live vs twin:",
        f"{'config':>6} {'algorithm':<11} {'score':>15} {'P99 E2E s':>15} "
        f"{'P99 TTFT s':>15} {'req/s':>15}",
    ]
    for r in res.rows:
        lines.append(
            f"{r.config:>6} {r.params.get('algorithm', ''):<11} "
            f"{r.live_score:>7.3f} {r.twin_score:<7.3f} "
            f"{r.live.p99_e2e_s:>7.2f} {r.twin.p99_e2e_s:<7.2f} "
            f"{r.live.p99_ttft_s:>7.2f} {r.twin.p99_ttft_s:<7.2f} "
            f"{r.live.requests_per_s or 0:>7.2f} {r.twin.requests_per_s or 0:<7.2f}"
        )
    ci = res.spearman_ci
    rho = "n/a" if res.spearman is None else f"{res.spearman:.2f}"
    lines.append(
        f"rank correlation (Spearman, scores): {rho}"
        + ("" if ci is None else f" (95 % CI {ci[0]:.2f} … {ci[1]:.2f})")
    )
    for m, e in res.errors.items():
        lo, hi = res.errors_ci[m]
        lines.append(f"median |error| {m}: {e:.1%} (95 % CI {lo:.1%} … {hi:.1%})")
    return lines


def _engine_lines(profile: TwinProfile) -> list[str]:
    """What each replica's own histograms said while kept busy, beside the client."""
    views = [(f.name, f.engine_view) for f in profile.replicas if f.engine_view is not None]
    if not views:
        return []

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1e3:.1f} ms"

    lines = ["kept busy, by the replica's own histograms (means) against the client's:"]
    for name, e in views:
        tokens = "-" if e.iteration_tokens is None else f"{e.iteration_tokens:.0f}"
        lines.append(
            f"  {name}: TTFT {ms(e.ttft_s)} (client {ms(e.client_ttft_s)}: front end "
            f"{ms(max(0.0, e.client_ttft_s - e.ttft_s))}), queue {ms(e.queue_s)}, prefill "
            f"{ms(e.prefill_s)}, decode {ms(e.decode_s)}, token interval {ms(e.itl_s)}, "
            f"{tokens} tokens a step; {e.requests} requests"
        )
    return lines


def fit_lines(profile: TwinProfile, path: Path) -> list[str]:
    lines = [
        f"{'replica':<10} {'prefill tok/s':>16} {'decode step':>16} {'+ per request':>16} "
        f"{'+ per ctx token':>16} {'overhead':>14} {'busy overhead':>14} {'KV tokens':>10} "
        f"{'tokens':>7}"
    ]

    def pm(x: Measured, scale: float, unit: str, fmt: str) -> str:
        return f"{x.value * scale:{fmt}}{unit} ±{x.rel_uncertainty:.0%}"

    for f in profile.replicas:
        lines.append(
            f"{f.name:<10} {pm(f.prefill_tokens_per_s, 1, '', ',.0f'):>16} "
            f"{pm(f.step_s, 1e3, ' ms', '.2f'):>16} "
            f"{pm(f.step_per_seq_s, 1e3, ' ms', '.3f'):>16} "
            f"{pm(f.kv_s_per_token, 1e6, ' us', '.3f'):>16} "
            f"{pm(f.overhead_s, 1e3, ' ms', '.1f'):>14} "
            f"{pm(f.busy_overhead_s, 1e3, ' ms', '.1f') if f.busy_overhead_s else '-':>14} "
            f"{f.kv_tokens if f.kv_tokens is not None else 'unknown':>10} "
            f"{f'x{f.prompt_token_ratio:.2f}':>7}"
        )
    lines += _engine_lines(profile)
    v = profile.validation
    if v is not None:
        lines.append(
            f"validation ({v.runs} x {v.scenario}, {v.duration_s:g} s live; the fitted twin "
            "on the same plans):"
        )
        for m, e in v.errors.items():
            spread = v.live_spread.get(m)
            noise = "" if spread is None else f" (live runs differed by {spread:.0%})"
            lines.append(f"  {m}: live {v.live[m]:.3g}, twin {v.twin[m]:.3g}: error {e:.0%}{noise}")
        why = profile.trusted()
        lines.append(
            "trusted for screening" if why is None else f"NOT trusted for screening: {why}"
        )
    lines.append(f"profile: {path}")
    return lines
