"""A capacity search's report (:mod:`lbtune.capacity.frame`) written out: ``capacity.json``,
its plot ``capacity.png`` (:mod:`lbtune.capacity.plot`) and its text."""

from __future__ import annotations

from pathlib import Path

from pydantic import TypeAdapter

from lbtune.capacity.frame import CapacityReport, SearchFrame, replica_probe
from lbtune.capacity.plot import capacity_plot
from lbtune.capacity.search import ProbeLatency, amount
from lbtune.records.quantiles import MIN_SAMPLES
from lbtune.records.slo import Slo

__all__ = ["describe", "describe_replicas", "dumps", "write"]


_ADAPTER = TypeAdapter(CapacityReport)


def dumps(report: CapacityReport) -> str:
    return _ADAPTER.dump_json(report, indent=2).decode()


def write(report: CapacityReport, out_dir: Path) -> Path:
    """``capacity.json`` in ``out_dir``, and its plot ``capacity.png`` beside it; the
    JSON's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "capacity.json"
    path.write_text(dumps(report) + "\n")
    (out_dir / "capacity.png").write_bytes(capacity_plot(report))
    return path


def _ms(s: float | None) -> str:
    return "-" if s is None else (f"{s * 1000:.3g}ms" if s < 1 else f"{s:.3g}s")


def describe_slo(slo: Slo, share: float) -> str:
    bounds = [
        f"{name} ≤ {_ms(v)}"
        for name, v in (("TTFT", slo.ttft_s), ("TPOT", slo.tpot_s), ("E2E", slo.e2e_s))
        if v is not None
    ]
    return f"{', '.join(bounds) or 'no latency bound'} for {share:.4g} of requests"


def describe_capacity(f: SearchFrame, confidence: float) -> str:
    """One line: the capacity and its CI, or what the search could say instead."""
    level = "user count" if f.unit == "users" else "rate"
    if f.kind == "below" or f.capacity is None:
        head = f"capacity: none found (the SLO was not met at any {level} probed)"
    elif f.kind == "above":
        head = (
            f"capacity: at least {amount(f.capacity, f.unit, '.4g')} (every {level} probed met "
            "the SLO)"
        )
    else:
        assert f.ci is not None
        hi = "open" if f.ci[1] is None else f"{f.ci[1]:.4g}"
        head = (
            f"capacity: {amount(f.capacity, f.unit, '.4g')} "
            f"({confidence:.0%} CI {f.ci[0]:.4g}–{hi})"
        )
    state = "converged" if f.converged else "not converged"
    spread = ""
    if f.spread is not None and f.spread_probes:
        spread = (
            f"; runs differ by ±{f.spread:.0%} of load ({f.spread_probes} probe"
            f"{'s' if f.spread_probes > 1 else ''} near it)"
        )
    return f"{head}{spread}; {state}, {len(f.probes)} {f.source} probes in {f.wall_s:.0f} s"


def describe(report: CapacityReport) -> list[str]:
    """The report as text lines: the table, the capacity, the cliff, the stop, the live
    search's figures per replica, the twin."""
    lines = [
        f"capacity at SLO: {report.scenario} against {report.target}; "
        f"{describe_slo(report.slo, report.attainment)}"
    ]
    ci_head = f"{report.confidence:.0%} CI"
    for f in (report.twin, report.live):
        if f is None:
            continue
        fitted = dict(f.curve)
        level = "users" if f.unit == "users" else "rate/s"
        lines.append(
            f"  {f.source:<5} {level:>8} {'attained':>9} {ci_head:>15} {'fitted':>8} "
            f"{'judged':>7} {'TTFT p50/p99':>15} {'TPOT p50/p99':>15}"
        )
        for p in sorted(f.probes, key=lambda p: p.rate):
            att = "-" if p.attainment is None else f"{p.attainment:.2%}"
            fit = "behind" if p.behind else f"{fitted.get(p.rate, float('nan')):.2%}"
            ci = f"{p.ci[0]:.1%}–{p.ci[1]:.1%}"
            lat = p.latency or ProbeLatency()
            ttft = f"{_ms(lat.ttft_p50)}/{_ms(lat.ttft_p99)}"
            tpot = f"{_ms(lat.tpot_p50)}/{_ms(lat.tpot_p99)}"
            lines.append(
                f"  {'':<5} {p.rate:>8.4g} {att:>9} {ci:>15} {fit:>8} {p.judged:>7} "
                f"{ttft:>15} {tpot:>15}"
            )
        lines.append(describe_capacity(f, report.confidence))
        if f.cliff is not None:
            lines.append(
                f"cliff: attainment collapsed between {f.cliff[0]:.4g} and "
                f"{amount(f.cliff[1], f.unit, '.4g')}, within one step: no margin above the "
                "capacity"
            )
        if f.stopped:
            lines.append(f"{f.source} search stopped: {f.stopped}")
        if f.source == "live":
            lines += describe_replicas(f, report.attainment)
    if report.twin_error is not None:
        lines.append(f"twin: its capacity was {report.twin_error:+.0%} from the live one")
    return lines


def describe_replicas(f: SearchFrame, target: float) -> list[str]:
    """Attainment and TTFT/TPOT P99 per replica at one probe (:func:`replica_probe`):
    whether one replica is what breaks the SLO. No lines without attribution."""
    chosen = replica_probe(f, target)
    if chosen is None:
        return []
    p, why = chosen
    where = "" if p.run_dir is None else f"; {Path(p.run_dir).name}"
    width = max(7, *(len(r.replica) for r in p.replicas))
    lines = [
        f"per replica at the {f.source} probe of {amount(p.rate, f.unit, '.4g')} ({why}{where}):",
        f"  {'replica':<{width}} {'judged':>7} {'attained':>9} {'TTFT p99':>9} {'TPOT p99':>9}",
    ]
    for r in p.replicas:
        att = "-" if r.attainment is None else f"{r.attainment:.2%}"
        lines.append(
            f"  {r.replica:<{width}} {r.judged:>7} {att:>9} {_ms(r.ttft_p99):>9} "
            f"{_ms(r.tpot_p99):>9}"
        )
    if any(r.ttft_p99 is None or r.tpot_p99 is None for r in p.replicas):
        need = MIN_SAMPLES["p99"]
        lines.append(f"  (-: too few samples on that replica for a P99, which needs {need})")
    return lines
