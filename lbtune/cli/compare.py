"""`lbtune compare` — B against A, figure by figure, with bootstrap CIs: the CI regression gate."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from lbtune.cli.options import CiOpt, JunitOpt

if TYPE_CHECKING:
    from rich.console import Console

    from lbtune.compare.verdict import CompareResult

FORMATS = ("table", "md", "json")


def compare_command(
    a: Path = typer.Argument(
        ..., help="Report A (the reference): a stress or optimize report dir, or its JSON."
    ),
    b: Path | None = typer.Argument(
        None, help="Report B (the candidate). Omitted: A must be a study (baseline vs winner)."
    ),
    fail_on: str | None = typer.Option(
        None,
        "--fail-on",
        help="Limits of a significant regression, e.g. p99=+10%,goodput=-5% "
        "(default: p99=+10%,ttft=+10%,goodput=-5%,errors=+1%; see docs/ci.md).",
    ),
    fmt: str = typer.Option("table", "--format", "-f", help="table, md or json."),
    ci: CiOpt = False,
    junit: JunitOpt = None,
    level: float = typer.Option(
        0.95, "--level", help="Confidence level, family-wise over the figures."
    ),
    resamples: int = typer.Option(2000, "--resamples", help="Bootstrap resamples."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed (same seed, same intervals)."),
) -> None:
    """Compare report B against report A and fail on a significant regression.

    Each figure (P50/P99 TTFT, P99 E2E, P50 ITL, throughput, output tokens/s, goodput,
    error rate) gets B's change against A with a bootstrap confidence interval from the
    per-request records, and is marked a significant improvement, a significant
    regression or noise. Exit 0 unless a figure regressed significantly AND beyond its
    --fail-on limit (exit 1); a missing or unreadable report exits 2. With
    GITHUB_STEP_SUMMARY set, the Markdown summary is appended to that file.

    Example: lbtune compare reports/last-night reports/tonight --fail-on p99=+10% --format md
    """
    from lbtune.cli import ci as ci_mode
    from lbtune.compare.verdict import compare, load_pair, parse_fail_on
    from lbtune.errors import ConfigError
    from lbtune.report.compare import render_json, render_markdown

    if fmt not in FORMATS:
        raise ConfigError(f"--format: unknown format {fmt!r}. Available: {', '.join(FORMATS)}")
    gates = parse_fail_on(fail_on) if fail_on is not None else None
    ci_mode.start(ci, junit)
    began = time.monotonic()
    try:
        side_a, side_b = load_pair(a, b)
        result = compare(side_a, side_b, fail_on=gates, level=level, resamples=resamples, seed=seed)
    except Exception as exc:
        ci_mode.junit_on_error(junit, "compare", exc)
        raise
    md = render_markdown(result)
    if fmt == "json":
        sys.stdout.write(render_json(result))
    elif fmt == "md":
        sys.stdout.write(md)
    else:
        print_table(result, ci_mode.console() if ci else None)
    if junit is not None:
        from lbtune.report.junit import compare_suite, write_junit

        write_junit(junit, [compare_suite(result, time.monotonic() - began)])
    ci_mode.append_step_summary(md)
    if result.failed:
        raise typer.Exit(1)


def print_table(result: CompareResult, out: Console | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    from lbtune.report.compare import frame, headline

    console = out or Console()
    if out is None and not console.is_terminal:
        console = Console(width=140)
    style = {"REGRESSION": "bold red", "regression": "yellow", "improvement": "green"}
    t = Table(title=f"B against A: {result.verdict}")
    data = frame(result)
    for i, col in enumerate(data.columns):
        t.add_column(col, justify="left" if i == 0 else "right")
    for row in data.rows:
        verdict = str(row[-1])
        key = next((k for k in style if verdict.startswith(k)), None)
        t.add_row(*(str(c) for c in row), style=style[key] if key else None)
    console.print(f"A: {result.a.label}  ({result.a.path})", markup=False)
    console.print(f"B: {result.b.label}  ({result.b.path})", markup=False)
    console.print(t)
    console.print(headline(result), markup=False)
    for n in result.notes:
        console.print(f"note: {n}", markup=False)
