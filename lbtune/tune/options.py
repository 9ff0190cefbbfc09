"""What ``lbtune optimize`` runs with: its options, resolved (stored in the study on
``--resume``, else the defaults; the target is the tuned cluster's own balancer), the
objective they define, and the progress snapshot the CLI shows."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lbtune.cluster import api
from lbtune.cluster.config import load_config
from lbtune.errors import ConfigError
from lbtune.objective import ObjectiveSpec, make_spec
from lbtune.records.addresses import without_userinfo
from lbtune.records.slo import Slo, parse_slo
from lbtune.search.harness import Harness
from lbtune.search.study import sqlite_dir
from lbtune.twin.fitted import MAX_ERROR

__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_SCENARIO",
    "DEFAULT_TRIAL_DURATION_S",
    "STORED",
    "OptimizeOptions",
    "StudyProgress",
    "cluster_balancer",
    "objective_spec",
    "resolve_options",
]

log = logging.getLogger(__name__)

DEFAULT_SCENARIO = "mixed"
DEFAULT_TRIAL_DURATION_S = 25.0
"""10 s warm-up + 10 s measured + 5 s cool-down of ``mixed``: ~30 s a trial with the
apply and the summary, so ``--budget 50`` takes about 25–30 minutes with confirmation."""
DEFAULT_BUDGET = 50
STORED = (
    "budget",
    "scenario",
    "target",
    "objective",
    "weights",
    "slo",
    "trial_duration_s",
    "seed",
    "attainment",
    "rate",
)


@dataclass(frozen=True)
class OptimizeOptions:
    budget: int | None = None
    """Trials in all (references included); None: the study's own on ``resume``, else 50."""
    scenario: str | None = None
    target: str | None = None
    space: str | None = None
    objective: str | None = None
    sampler: str = "tpe"
    pruner: str = "median"
    trial_duration_s: float | None = None
    study: str | None = None
    storage: str = "sqlite:///reports/studies.db"
    resume: bool = False
    apply: bool = True
    confirm_runs: int = 2
    """Confirmation rounds at least (every arm once per round)."""
    confirm_top: int = 2
    confirm_max_rounds: int = 6
    """More rounds are added while an arm has fewer pooled samples than a P99 needs,
    up to this many rounds and ``confirm_max_s`` seconds."""
    confirm_max_s: float = 900.0
    seed: int | None = None
    slo: str | None = None
    weights: str | None = None
    state_dir: Path | None = None
    cluster_config: str | None = None
    inventory: str | None = None
    reports_root: Path = Path("reports")
    out_dir: Path | None = None
    window_s: float = 5.0
    write_report: bool = True
    screen: int | None = None
    """Virtual trials in the twin before the live ones (:mod:`lbtune.tune.screen`); None:
    its default where the twin models the cluster; 0: none."""
    attainment: float | None = None
    """``--objective capacity``: the share of requests that must meet the SLO (0.99)."""
    rate: float | None = None
    """``--objective capacity``: the offered rate (req/s) every trial runs at, open loop;
    None: placed by the twin (:func:`lbtune.tune.capacity_study.trial_rate`)."""
    twin_profile: Path | None = None
    """A fitted profile (``lbtune twin fit``): the twin simulates its replicas from it."""
    max_twin_error: float = MAX_ERROR
    """A profile whose validation missed a figure by more is refused for screening."""


@dataclass
class StudyProgress:
    """A snapshot for the progress display (mutated in place by :func:`run_optimize`)."""

    study: str = ""
    phase: str = "starting"
    budget: int = 0
    done: int = 0
    trial: int | None = None
    role: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    started_at: float = field(default_factory=time.monotonic)
    trial_started_at: float = field(default_factory=time.monotonic)
    last_value: float | None = None
    best: float | None = None
    best_trial: int | None = None
    baseline: float | None = None
    pruned: int = 0
    failed: int = 0
    message: str = ""

    @property
    def improvement(self) -> float | None:
        if self.best is None or not self.baseline:
            return None
        return self.best / self.baseline - 1


def objective_spec(
    kind: str,
    slo: Slo,
    weights: str | None,
    *,
    slo_text: str | None = None,
    attainment: float | None = None,
    rate: float | None = None,
) -> ObjectiveSpec:
    """The objective of ``--objective``/``--weights`` over the study's SLO: its run plan's
    (the scenario's, with ``--slo``; derived once, by :func:`lbtune.run.plan.plan_run`).
    ``capacity`` reads ``--slo`` (``slo_text``) again with its TPOT bound over that SLO,
    and takes the share and the trials' rate."""
    bounds = parse_slo(slo_text, slo, tpot=True) if kind == "capacity" else None
    return make_spec(
        kind,
        weights=weights,
        ttft_ref_s=slo.ttft_s,
        e2e_ref_s=slo.e2e_s,
        max_error_rate=slo.max_error_rate,
        slo=bounds,
        attainment=attainment,
        rate=rate,
    )


def _stored_attrs(storage: str, name: str | None) -> tuple[str | None, dict[str, Any]]:
    """(study name, its user attributes) for ``--resume``: the newest study if unnamed."""
    import optuna

    sqlite_dir(storage)
    summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    if name is None:
        dated = [s for s in summaries if s.datetime_start is not None]
        if not dated:
            raise ConfigError(f"--resume: no study in {without_userinfo(storage)} to resume")
        name = max(dated, key=lambda s: s.datetime_start).study_name  # type: ignore[arg-type,return-value]
    found = next((s for s in summaries if s.study_name == name), None)
    return name, dict(found.user_attrs) if found is not None else {}


def cluster_balancer(state_dir: Path | None, cluster_config: str | None) -> str:
    """The balancer of the cluster optimize tunes: the one running in ``state_dir``,
    else the one ``cluster_config`` (or the default preset) would start."""
    st = api.status(state_dir)
    if st.running and st.endpoints is not None:
        return st.endpoints.balancer
    return load_config(cluster_config)[0].balancer


def resolve_options(opts: OptimizeOptions, harness: Harness | None = None) -> OptimizeOptions:
    """Fill unset options: stored in the study on ``--resume``, else the defaults (the
    target defaults to the tuned cluster's own balancer: ``harness``'s, else
    :func:`cluster_balancer`; another ``--target`` than that balancer is a ConfigError)."""
    stored: dict[str, Any] = {}
    name = opts.study
    if opts.resume:
        name, attrs = _stored_attrs(opts.storage, opts.study)
        stored = dict(attrs.get("options", {}))
    changes: dict[str, Any] = {"study": name}
    for key in STORED:
        if getattr(opts, key) is None and stored.get(key) is not None:
            changes[key] = stored[key]
    out = replace(opts, **changes)
    defaults: dict[str, Any] = {
        "scenario": DEFAULT_SCENARIO,
        "objective": "composite",
        "trial_duration_s": DEFAULT_TRIAL_DURATION_S,
        "budget": DEFAULT_BUDGET,
    }
    out = replace(out, **{k: v for k, v in defaults.items() if getattr(out, k) is None})
    if harness is not None:
        out = replace(out, target=out.target or harness.target.name)
    else:
        running = cluster_balancer(out.state_dir, out.cluster_config)
        if out.target not in (None, running):
            raise ConfigError(
                f"--target {out.target}: the cluster optimize tunes runs {running}; "
                f"pass --target {running} (or leave --target out)"
            )
        out = replace(out, target=running)
    if out.study is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        part = _name_part(out.scenario or DEFAULT_SCENARIO)
        out = replace(out, study=f"{part}-{out.target}-{stamp}")
    if out.budget is None or out.budget < 1:
        raise ConfigError(f"--budget: must be >= 1, got {out.budget}")
    if out.screen is not None and out.screen < 0:
        raise ConfigError(f"--screen: must be >= 0, got {out.screen}")
    if out.confirm_runs < 0 or out.confirm_top < 1:
        raise ConfigError("--confirm-runs must be >= 0")
    if out.confirm_max_rounds < out.confirm_runs:
        raise ConfigError(
            f"--confirm-max-rounds ({out.confirm_max_rounds}) must be >= --confirm-runs "
            f"({out.confirm_runs})"
        )
    return out


def _name_part(scenario: str) -> str:
    """A scenario reference as a study/report name part: a path's or trace's file stem
    (``trace:/x/az.csv?speedup=4`` -> ``trace-az``), anything but ``[A-Za-z0-9._-]`` as
    ``-`` (a study name becomes a directory name and a URL path segment)."""
    ref = scenario.split("?", 1)[0]
    kind, _, rest = ref.partition(":") if ref.startswith("trace:") else ("", "", ref)
    stem = Path(rest).stem if "/" in rest or rest.endswith((".yaml", ".yml")) else rest
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{kind}-{stem}" if kind else stem).strip("-")
    return name[:60] or "scenario"
