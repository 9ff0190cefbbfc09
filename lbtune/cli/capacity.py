"""`lbtune capacity` — the highest offered rate (or, ``--users``, the most closed-loop
users) at which the SLO holds for a share of requests, with a CI. Thin: parse, build the
probes, call :mod:`lbtune.capacity`, render."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from lbtune.cli.options import (
    JsonOpt,
    MaxTwinErrorOpt,
    OutOpt,
    ScenarioOpt,
    SeedOpt,
    StateDirOpt,
    TwinProfileOpt,
)

if TYPE_CHECKING:
    from lbtune.capacity.probes import TwinCase
    from lbtune.capacity.run import CapacityOptions
    from lbtune.capacity.search import ProbeResult, Unit
    from lbtune.records.slo import Slo
    from lbtune.run.stress import StressOptions
    from lbtune.twin.fitted import TwinProfile

    TwinChoice = tuple[bool, str | None, TwinProfile | None]
    """Whether the twin places the bracket, the cluster it models, a fitted profile."""

__all__ = ["capacity_command", "fraction"]


def fraction(text: str, flag: str) -> float:
    """``10%`` or ``0.1`` as 0.1; a one-line ConfigError otherwise."""
    from lbtune.errors import ConfigError

    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected a share like 10% or 0.1") from None
    if not 0 < v < 1:
        raise ConfigError(f"{flag} {text!r}: must be between 0 and 100 % (exclusive)")
    return v


def capacity_command(
    scenario: ScenarioOpt[str] = "chat",
    slo: Annotated[
        str | None,
        typer.Option(
            "--slo",
            help="Per-request bounds, e.g. ttft=1s,tpot=100ms,e2e=20s (default: the "
            "scenario's ttft and e2e).",
        ),
    ] = None,
    attainment: Annotated[
        str, typer.Option("--attainment", help="Share of requests that must meet the SLO.")
    ] = "0.99",
    precision: Annotated[
        str, typer.Option("--precision", help="Stop when the CI is narrower than this share.")
    ] = "10%",
    target: Annotated[
        str | None,
        typer.Option("--target", help="Balancer base URL. Default: the embedded cluster."),
    ] = None,
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="Allow load against a non-loopback target.")
    ] = False,
    duration: Annotated[
        float | None,
        typer.Option("--probe-duration", "-d", help="Seconds per probe (default: the scenario's)."),
    ] = None,
    samples: Annotated[
        int | None,
        typer.Option(
            "--probe-samples",
            help="Requests each open-loop probe's window should hold (sets its length; "
            "more: a narrower CI per probe). Default 200.",
        ),
    ] = None,
    max_duration: Annotated[
        float, typer.Option("--probe-max-duration", help="The longest a probe may last (s).")
    ] = 120.0,
    start_rate: Annotated[
        float | None,
        typer.Option("--start-rate", help="First probe's req/s without a twin bracket (1)."),
    ] = None,
    users: Annotated[
        bool,
        typer.Option(
            "--users",
            help="Search over the number of closed-loop users instead of the rate: the most "
            "concurrent users at which the SLO holds.",
        ),
    ] = False,
    start_users: Annotated[
        int | None,
        typer.Option("--start-users", help="With --users: the first probe's users (1)."),
    ] = None,
    max_probes: Annotated[int, typer.Option("--max-probes", help="Live probes at most.")] = 12,
    twin: Annotated[
        bool,
        typer.Option(
            "--twin/--no-twin",
            help="Place the bracket with the twin first (embedded cluster, a modeled balancer).",
        ),
    ] = True,
    config: Annotated[
        str | None,
        typer.Option("--config", "-c", help="Cluster the twin models (default: the running one)."),
    ] = None,
    seed: SeedOpt = None,
    compare: Annotated[
        tuple[Path, Path] | None,
        typer.Option(
            "--compare",
            help="Two balancer param files (A B): their capacities, probed in turn, and B/A.",
        ),
    ] = None,
    baseline: Annotated[
        Path | None,
        typer.Option("--baseline", help="An earlier capacity.json to gate against."),
    ] = None,
    fail_on: Annotated[
        str | None,
        typer.Option(
            "--fail-on",
            help="capacity=-5%: exit 1 when the capacity (B/A, or against --baseline) fell "
            "by more than 5 %, its whole CI below that.",
        ),
    ] = None,
    twin_profile: TwinProfileOpt = None,
    max_twin_error: MaxTwinErrorOpt = 0.25,
    out: OutOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Search the capacity at SLO: probes are ordinary stress runs (open loop) at rates
    the search picks, or closed-loop runs at user counts with --users; it stops when the
    capacity's CI is narrower than --precision, and reports attainment vs rate (or
    users), the fitted curve and the capacity (capacity.json). With the embedded cluster,
    the twin's search places the first bracket.

    Example: lbtune capacity -s mixed --slo ttft=1s,tpot=100ms,e2e=20s --attainment 0.95
    """
    from lbtune.capacity.compare import parse_gate
    from lbtune.capacity.probes import ProbeShape
    from lbtune.capacity.run import CapacityOptions, check_load, check_slo
    from lbtune.capacity.search import SearchOptions
    from lbtune.errors import ConfigError
    from lbtune.run.stress import StressOptions, default_out_dir
    from lbtune.run.target import check_target_allowed

    if target is not None:
        check_target_allowed(target, allow_remote)  # before anything starts
    share = fraction(attainment, "--attainment")
    limit = None if fail_on is None else parse_gate(fail_on)
    if limit is not None and compare is None and baseline is None:
        raise ConfigError("--fail-on needs --baseline CAPACITY.json or --compare A B")
    unit, start, low, high = _levels(users, start_rate, start_users)
    if users and samples is not None:
        raise ConfigError(
            "--probe-samples sets an open-loop probe's length from its rate; with --users a "
            "probe lasts the scenario's duration: give --probe-duration S instead"
        )
    base = StressOptions(
        scenario=scenario,
        target_url=target,
        allow_remote=allow_remote,
        duration_s=duration,
        seed=seed,
        state_dir=state_dir,
        write_report=False,
    )
    the_slo = _slo(base, slo)
    check_slo(the_slo, share)
    search = SearchOptions(
        attainment=share,
        precision=fraction(precision, "--precision"),
        start_rate=start,
        min_rate=low,
        max_rate=high,
        max_probes=max_probes,
        unit=unit,
    )
    out_dir = out or default_out_dir(Path("reports"), f"capacity-{scenario}")
    shape = ProbeShape(max_duration_s=max_duration)
    if samples is not None:
        shape = ProbeShape(samples, max_duration)
    opts = CapacityOptions(base, the_slo, out_dir, search, shape=shape)
    check_load(opts)
    use_twin = twin and target is None
    profile = None
    if use_twin and twin_profile is not None:  # refused before any load when untrusted
        from lbtune.twin.fitted import trusted_profile

        profile = trusted_profile(twin_profile, max_twin_error, "search live only: --no-twin")
    if compare is not None:
        _compare(opts, compare, (use_twin, config, profile), limit, as_json)
    else:
        _single(opts, (use_twin, config, profile), (baseline, limit), as_json)


def _levels(
    users: bool, start_rate: float | None, start_users: int | None
) -> tuple[Unit, float, float, float]:
    """The search's unit, first level and range: req/s from ``--start-rate``, or
    closed-loop users from ``--start-users`` (``--users``); a flag of the other unit, or a
    level out of range, is a one-line ConfigError."""
    from lbtune.capacity.search import SearchOptions
    from lbtune.errors import ConfigError
    from lbtune.scenario.limits import MAX_USERS

    low, high = SearchOptions.min_rate, SearchOptions.max_rate
    if not users:
        if start_users is not None:
            raise ConfigError(
                "--start-users counts closed-loop users: add --users to search over them "
                "(or give --start-rate for the open-loop rate)"
            )
        rate = 1.0 if start_rate is None else start_rate
        if not low <= rate <= high:
            raise ConfigError(f"--start-rate: must be {low:g} to {high:g} req/s, got {rate:g}")
        return "req/s", rate, low, high
    if start_rate is not None:
        raise ConfigError(
            "--start-rate is a rate (req/s) and --users searches users: start with "
            "--start-users N instead (default 1)"
        )
    n = 1 if start_users is None else start_users
    if not 1 <= n <= MAX_USERS:
        raise ConfigError(f"--start-users: a whole number of users, 1 to {MAX_USERS}, got {n}")
    return "users", float(n), 1.0, float(MAX_USERS)


def _say(text: str) -> None:
    typer.echo(text, err=True)


def _progress(unit: Unit) -> Callable[[ProbeResult], None]:
    """Says each probe's attainment on stderr, its level in ``unit``."""
    from lbtune.capacity.search import amount

    def on_probe(p: ProbeResult) -> None:
        att = f"{p.met / p.judged:.2%}" if p.judged else "-"
        behind = f" (generator behind: {'; '.join(p.behind)})" if p.behind else ""
        level = amount(p.rate, unit, ".4g")
        _say(f"{p.source} probe {level}: {att} of {p.judged} met the SLO{behind}")

    return on_probe


def _single(
    opts: CapacityOptions,
    twin: TwinChoice,
    gate_on: tuple[Path | None, float | None],
    as_json: bool,
) -> None:
    """One search; with ``--baseline`` and ``--fail-on``, gated against the earlier one."""
    from dataclasses import replace

    from lbtune.capacity.compare import gate, load_report, ratio
    from lbtune.capacity.report import describe, dumps
    from lbtune.capacity.run import run_capacity
    from lbtune.errors import ConfigError

    baseline, limit = gate_on
    before = None if baseline is None else load_report(baseline)
    unit = opts.search.unit
    if before is not None and before.live is not None and before.live.unit != unit:
        how = "with" if unit == "users" else "without"
        raise ConfigError(
            f"--baseline {baseline}: its capacity is in {before.live.unit} and this search's "
            f"in {unit}; gate against a capacity.json searched {how} --users"
        )
    if twin[0]:
        opts = replace(opts, twin=_twin_case(opts.stress, twin, None))
    report = run_capacity(opts, on_probe=_progress(unit), say=_say)
    typer.echo(dumps(report) if as_json else "\n".join(describe(report)))
    if not as_json:
        typer.echo(f"report: {opts.out_dir / 'capacity.json'}")
    if before is None or before.live is None or report.live is None:
        return
    r = ratio(before.live, report.live, opts.search.attainment, opts.search.ci)
    if r.value is not None and r.ci is not None:
        hi = "open" if r.ci[1] is None else f"{r.ci[1]:.3g}"
        _say(f"against {baseline}: {r.value:.3g}x ({r.confidence:.0%} CI {r.ci[0]:.3g}–{hi})")
    why = None if limit is None else gate(r, limit)
    if why is not None:
        _say(f"FAILED: {why}")
        raise typer.Exit(1)


def _compare(
    opts: CapacityOptions,
    files: tuple[Path, Path],
    twin: TwinChoice,
    limit: float | None,
    as_json: bool,
) -> None:
    """Two param files on the running embedded cluster, probed in turn; B/A gated."""
    from lbtune.capacity.compare import (
        Applied,
        CompareReport,
        Side,
        SideReport,
        compare_searches,
        describe_compare,
        dumps_compare,
        gate,
        ratio,
    )
    from lbtune.capacity.frame import twin_error
    from lbtune.capacity.probes import LiveProbe, Probes, TwinProbe

    sides, restore = [], _config_restorer(opts.stress.state_dir)
    unit = opts.search.unit
    for i, path in enumerate(files):
        label = f"{'AB'[i]}:{path.stem}"
        probes = Probes(opts.stress, opts.shape, unit)
        inner = LiveProbe(probes, opts.slo, opts.out_dir / "AB"[i], _say)
        case = _twin_case(opts.stress, twin, path) if twin[0] else None
        tp = (
            None
            if case is None
            else TwinProbe(Probes(opts.stress, opts.shape, unit), opts.slo, case)
        )
        sides.append(Side(label, Applied(_applier(opts.stress.state_dir, path), inner), tp))
    try:
        frames = compare_searches(sides, opts.search, opts.twin_margin, _progress(unit))
    finally:
        restore()
    reports = tuple(
        SideReport(s.label, lf, tf, twin_error(lf, tf))
        for s, (tf, lf) in zip(sides, frames, strict=True)
    )
    r = ratio(reports[0].live, reports[1].live, opts.search.attainment, opts.search.ci)
    why = None if limit is None else gate(r, limit)
    report = CompareReport(
        opts.stress.scenario,
        opts.stress.target_url or "the embedded cluster",
        opts.slo,
        opts.search.attainment,
        opts.search.precision,
        opts.search.ci.confidence,
        reports,
        r,
        why,
    )
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    (opts.out_dir / "capacity-compare.json").write_text(dumps_compare(report) + "\n")
    typer.echo(dumps_compare(report) if as_json else "\n".join(describe_compare(report)))
    if why is not None:
        raise typer.Exit(1)


def _applier(state_dir: Path | None, path: Path) -> Callable[[], None]:
    """Applies the param file to the running cluster's balancer (direct, not recorded as
    the last known good): before each of its side's probes."""
    from lbtune.apply import apply_params
    from lbtune.apply.paramfile import read_params_for
    from lbtune.cli.apply import _target

    t = _target(None, state_dir)
    values = t.space().validate(read_params_for(path, t.name), str(path))

    def apply() -> None:
        apply_params(t, values, via="direct", record=False, source=f"file:{path}")

    return apply


def _config_restorer(state_dir: Path | None) -> Callable[[], None]:
    """Puts back the balancer config that was live before the comparison."""
    from lbtune.apply import apply_params
    from lbtune.cli.apply import _target

    t = _target(None, state_dir)
    live = dict(t.read_live())

    def restore() -> None:
        if live:
            apply_params(t, live, via="direct", record=False, source="before --compare")

    return restore


def _slo(base: StressOptions, text: str | None) -> Slo:
    """The scenario's SLO with ``--slo``'s per-request bounds over it (TPOT included)."""
    from lbtune.records.slo import parse_slo
    from lbtune.run.plan import plan_run

    return parse_slo(text, plan_run(base).slo_value(), tpot=True)


def _twin_case(base: StressOptions, twin: TwinChoice, params: Path | None) -> TwinCase | None:
    """The twin of the embedded cluster (:func:`lbtune.capacity.twincase.twin_case`);
    None, said, when it has none."""
    from lbtune.capacity.twincase import twin_case
    from lbtune.errors import ConfigError

    try:
        return twin_case(base.state_dir, twin[1], params, twin[2])
    except ConfigError as exc:
        typer.echo(f"note: no twin bracket ({exc})", err=True)
        return None
