"""``lbtune twin check``: how close the twin comes to the running cluster.

N configs of the balancer's space — the live one, round robin and least-conn where the
space has them, then draws of Optuna's random sampler — are each applied to the running
balancer (its direct path) and measured live by ``run_stress`` on the same scenario and
seed, one after another; each live run's recorded plan is then simulated with the same
params, the twin's engines carried from run to run as the live replicas keep their
prefix caches. With ``rounds`` > 1 the configs are measured again in interleaved rounds,
every other one in reverse order (ABBA: a live cluster that drifts by a steady amount
over the check shifts every config's mean alike) and each round on its own seed; a
config's figures and scores are then its rounds' means, live and twin alike. On the vLLM
CPU preset round robin served 8.9 req/s in one check and 11.7 in another 25 minutes
later: configs measured once, one after another, were ranked partly by the clock. Both
sides are scored the way a study scores a trial
(:func:`lbtune.tune.virtual.twin_figures`). The result: Spearman's rank correlation of
the composite scores and the median |relative error| of P99 E2E, P99 TTFT and req/s,
each with a 95 % bootstrap interval over the configs. The live config is put back at the
end, also on an error. Bounded: at most :data:`MAX_CONFIGS` configs of
:data:`MAX_DURATION_S`.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from lbtune.cluster import api
from lbtune.cluster.twin import TwinCluster, drop_inactive, running_twin
from lbtune.errors import ConfigError
from lbtune.loadgen.recordio import read_records
from lbtune.objective import Figures
from lbtune.records.quantiles import percentile
from lbtune.run.stress import StressOptions, run_stress
from lbtune.scenario.runplan import read_run_plan
from lbtune.search.study import reference_trials
from lbtune.targets import get_target
from lbtune.targets.params import ParamSet
from lbtune.targets.space import ParameterSpace
from lbtune.targets.targetbase import TargetBase
from lbtune.tune.screen import spearman
from lbtune.tune.virtual import twin_figures
from lbtune.twin.fitted import TwinProfile
from lbtune.twin.requests import RequestSource
from lbtune.twin.result import TwinRun
from lbtune.twin.run import Reuse, simulate

__all__ = [
    "METRICS",
    "CheckOptions",
    "CheckResult",
    "CheckRow",
    "check_twin",
    "config_means",
    "draw_configs",
    "round_order",
]

METRICS = ("p99_e2e_s", "p99_ttft_s", "requests_per_s")
MAX_CONFIGS = 20
MAX_DURATION_S = 60.0
MAX_ROUNDS = 4


@dataclass(frozen=True)
class CheckOptions:
    scenario: str = "mixed"
    configs: int = 6
    duration_s: float = 15.0
    seed: int | None = None
    """The request sequence's seed (the scenario's default when None)."""
    draw_seed: int = 0
    """The random sampler's seed for the drawn configs."""
    state_dir: Path | None = None
    profile: TwinProfile | None = None
    """A fitted profile: its replicas are simulated from their fits."""
    users: int | None = None
    """Closed-loop users (the scenario's load when None)."""
    rounds: int = 1
    """Times each config is measured (interleaved rounds, module docstring)."""


@dataclass(frozen=True)
class CheckRow:
    config: int
    params: ParamSet
    live: Figures
    twin: Figures
    live_score: float
    twin_score: float


@dataclass(frozen=True)
class CheckResult:
    cluster: str
    balancer: str
    scenario: str
    duration_s: float
    rows: tuple[CheckRow, ...]
    spearman: float | None
    spearman_ci: tuple[float, float] | None
    errors: dict[str, float]
    """Median |twin / live − 1| per metric."""
    errors_ci: dict[str, tuple[float, float]]
    rounds: int = 1


def round_order(configs: int, rounds: int) -> list[tuple[int, int]]:
    """``(round, config)`` in the order they are measured: forward, then backward, ..."""
    out: list[tuple[int, int]] = []
    for r in range(rounds):
        order = range(configs) if r % 2 == 0 else range(configs - 1, -1, -1)
        out += [(r, c) for c in order]
    return out


def draw_configs(space: ParameterSpace, live: ParamSet, n: int, seed: int) -> list[ParamSet]:
    """The live config and the references, then random draws, ``n`` distinct in all."""
    import optuna

    out = [p for _, p in reference_trials(space, live)][:n]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    for _ in range(50 * n):
        if len(out) >= n:
            break
        p = space.suggest(study.ask())
        if all(p != q for q in out):
            out.append(p)
    return out


def check_twin(opts: CheckOptions, say: Callable[[str], None]) -> CheckResult:
    """See the module docstring. ConfigError when nothing runs or the twin cannot model it."""
    if not 3 <= opts.configs <= MAX_CONFIGS:
        raise ConfigError(f"--configs: 3 to {MAX_CONFIGS}, got {opts.configs}")
    if not 5 <= opts.duration_s <= MAX_DURATION_S:
        raise ConfigError(f"--duration: 5 to {MAX_DURATION_S:g} s, got {opts.duration_s:g}")
    if not 1 <= opts.rounds <= MAX_ROUNDS:
        raise ConfigError(f"--rounds: 1 to {MAX_ROUNDS}, got {opts.rounds}")
    st = api.status(opts.state_dir)
    if not st.running or st.endpoints is None:
        raise ConfigError("twin check: no cluster running (lbtune cluster up)")
    tc = running_twin(st.endpoints.state_dir, opts.profile)
    target = get_target(tc.balancer, st.endpoints)
    live = target.read_live()
    configs = draw_configs(target.space(), live, opts.configs, opts.draw_seed)
    for p in configs:
        tc.routing(drop_inactive(tc, p)[0])  # no model: one line, before any load
    order = round_order(len(configs), opts.rounds)
    with tempfile.TemporaryDirectory(prefix="lbtune-twin-check-") as tmp:
        runs: list[LiveRun] = []
        seed = opts.seed
        try:
            for r, i in order:
                p = configs[i]
                if r and seed is None:  # the scenario's seed, as the first round ran it
                    seed = read_run_plan(runs[0].run_dir).seed
                at = None if seed is None else seed + r
                out = Path(tmp) / f"r{r}-c{i}"
                _live(opts, st.endpoints.state_dir, p, out, target, at)
                runs.append(LiveRun(i, out))
                rnd = f" round {r + 1}/{opts.rounds}" if opts.rounds > 1 else ""
                say(f"config {i} ({p.get('algorithm')}){rnd} measured live")
        finally:
            target.apply(live)
        rows = _replay(tc, configs, runs, say)
    return _result(tc, opts, config_means(rows))


@dataclass(frozen=True)
class LiveRun:
    """One live run of a check: which config, where its records are."""

    config: int
    run_dir: Path


def _live(
    opts: CheckOptions,
    state_dir: str,
    params: ParamSet,
    out: Path,
    target: TargetBase,
    seed: int | None,
) -> None:
    target.apply(params)
    sopts = StressOptions(
        scenario=opts.scenario,
        duration_s=opts.duration_s,
        users=opts.users,
        seed=seed,
        state_dir=Path(state_dir),
        out_dir=out,
        write_report=False,
    )
    run_stress(sopts, say=lambda m: None)


def live_figures(run_dir: Path) -> tuple[Figures, float]:
    """A study trial's figures and score of a recorded live run."""
    plan = read_run_plan(run_dir)
    assert plan.started_at is not None and plan.window_end is not None
    records = tuple(read_records(run_dir / "requests.parquet"))
    ended = max([plan.window_end, *(r.ended_at for r in records)])
    return twin_figures(
        TwinRun(records=records, plan=plan, ended_at=ended, run_start=plan.started_at)
    )


def _replay(
    tc: TwinCluster,
    configs: Sequence[ParamSet],
    runs: Sequence[LiveRun],
    say: Callable[[str], None],
) -> list[CheckRow]:
    """Each live run's plan and config simulated, the engines carried in the live order:
    one row per run."""
    rows: list[CheckRow] = []
    src: RequestSource | None = None
    engines = None
    for m in runs:
        i, run_dir, params = m.config, m.run_dir, configs[m.config]
        plan = read_run_plan(run_dir)
        if src is None or src.plan.load != plan.load or src.plan.seed != plan.seed:
            src = RequestSource(plan, tc.config.seed)
        model = tc.routing(drop_inactive(tc, params)[0])
        run = simulate(src.plan, tc.replicas, model, tc.options(), Reuse(src, engines))
        engines = run.engines
        twin, twin_score = twin_figures(run)
        live, live_score = live_figures(run_dir)
        rows.append(CheckRow(i, dict(params), live, twin, live_score, twin_score))
        algo = params.get("algorithm")
        say(f"config {i} ({algo}): score live {live_score:.3f}, twin {twin_score:.3f}")
    return rows


def config_means(rows: Sequence[CheckRow]) -> list[CheckRow]:
    """One row per config, in config order: its runs' mean scores and figures (of
    :data:`METRICS`; the rest are its first run's)."""
    out = []
    for c in sorted({r.config for r in rows}):
        mine = [r for r in rows if r.config == c]
        out.append(
            CheckRow(
                c,
                mine[0].params,
                _mean_figures([r.live for r in mine]),
                _mean_figures([r.twin for r in mine]),
                statistics.fmean(r.live_score for r in mine),
                statistics.fmean(r.twin_score for r in mine),
            )
        )
    return out


def _mean_figures(figs: Sequence[Figures]) -> Figures:
    def mean(name: str) -> float:
        return statistics.fmean(getattr(f, name) for f in figs)

    return replace(
        figs[0],
        p99_e2e_s=mean("p99_e2e_s"),
        p99_ttft_s=mean("p99_ttft_s"),
        requests_per_s=mean("requests_per_s"),
    )


def _rel_errors(rows: Sequence[CheckRow], metric: str) -> list[float]:
    out = []
    for r in rows:
        a, b = getattr(r.twin, metric), getattr(r.live, metric)
        if a is not None and b:
            out.append(abs(a / b - 1))
    return out


def _result(tc: TwinCluster, opts: CheckOptions, rows: list[CheckRow]) -> CheckResult:
    rng = np.random.default_rng(0)
    n = len(rows)
    draws = [rng.integers(0, n, n) for _ in range(1000)]
    twin, live = [r.twin_score for r in rows], [r.live_score for r in rows]
    rhos = [spearman([twin[i] for i in d], [live[i] for i in d]) for d in draws]
    ok = [x for x in rhos if x is not None]
    errors, errors_ci = {}, {}
    for m in METRICS:
        e = _rel_errors(rows, m)
        if e:
            errors[m] = percentile(e, 50)
            boot = [
                percentile([e[i] for i in rng.integers(0, len(e), len(e))], 50) for _ in range(1000)
            ]
            errors_ci[m] = (percentile(boot, 2.5), percentile(boot, 97.5))
    return CheckResult(
        cluster=tc.config.name,
        balancer=tc.balancer,
        scenario=opts.scenario,
        duration_s=opts.duration_s,
        rows=tuple(rows),
        spearman=spearman(twin, live),
        spearman_ci=(percentile(ok, 2.5), percentile(ok, 97.5)) if ok else None,
        errors=errors,
        errors_ci=errors_ci,
        rounds=opts.rounds,
    )
