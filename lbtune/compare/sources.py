"""What ``lbtune compare`` compares: one side of a comparison, read from a report.

A side is read from

* a **stress report** directory (``summary.json``; records from ``requests.parquet``,
  or the ``records-*.jsonl`` files, beside it) or its ``summary.json`` itself;
* a **study report** directory (``study.json``; records from ``runs/<label>/``) or its
  ``study.json``. Which configuration of the study stands for it:

  - ``baseline``: the live configuration the study started from, measured in the
    confirmation's ``A`` runs (pooled), else in its own trial;
  - ``result``: the confirmed winner (its confirmation runs, pooled), or the baseline
    when no winner was confirmed or the rollout rolled it back: what the study leaves
    live (with ``--no-apply``, what it recommends);
  - ``best``: the confirmed winner, else the best trial even though not confirmed.

  A study's run directories hold no summary: their measurement window, scenario name and
  SLO are read from each run's ``run.json`` (:mod:`lbtune.scenario.runplan`), never recomputed
  from the scenario file; a run directory without one (written before lbtune recorded
  its plan) falls back to the figures in ``study.json`` and says why.

Everything a side needs for the comparison is kept: its figures as the report states
them, and its per-request arrays (:class:`~lbtune.metrics.bootstrap.RunArrays`) when
the records are there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, InstanceOf, computed_field, field_serializer

from lbtune.errors import ConfigError
from lbtune.loadgen.recordio import read_records
from lbtune.metrics.bootstrap import RunArrays
from lbtune.metrics.summary import Window
from lbtune.metrics.summary_file import read_summary
from lbtune.records.jsonform import key_order
from lbtune.safety.files import MAX_REPORT_BYTES, read_bytes
from lbtune.scenario.runplan import read_run_plan

if TYPE_CHECKING:
    from lbtune.metrics.summary import RunSummary
    from lbtune.records.slo import Slo
    from lbtune.scenario.runplan import RunPlan

Pick = Literal["baseline", "result", "best"]
_STUDY_FIGURES = {
    "ttft_p50": "p50_ttft_s",
    "ttft_p99": "p99_ttft_s",
    "e2e_p99": "p99_e2e_s",
    "requests_per_s": "requests_per_s",
    "output_tokens_per_s": "output_tokens_per_s",
    "goodput_per_s": "goodput_per_s",
    "error_rate": "error_rate",
}


@dataclass(frozen=True, eq=False)
class Side:
    """One side (A or B) of a comparison.

    Its JSON form (in ``lbtune compare --format json``) says whether it had
    :attr:`records` instead of holding its arrays, and its :attr:`slo` as an object.
    """

    name: str
    label: str
    path: str
    kind: Literal["stress", "study"]
    scenario: str
    figures: Mapping[str, float | None]
    """As the report states them (keys of :data:`lbtune.metrics.bootstrap.FIGURE_KEYS`)."""
    # JSON quirk kept from the hand-written form: the arrays left out, the computed ``records``
    # said instead (below), this key order, ``slo`` as an object.
    arrays: Annotated[InstanceOf[RunArrays] | None, Field(exclude=True)] = None
    runs: int = 1
    requests: int = 0
    """Requests sent in the measurement window(s), over all runs."""
    slo: tuple[float | None, float | None] | None = None
    """``(ttft_s, e2e_s)`` that goodput was judged against."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    _json = key_order("name", "label", "path", "kind", "scenario", "runs", "requests", "records")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def records(self) -> bool:
        """Whether the side has per-request records (its :attr:`arrays`)."""
        return self.arrays is not None

    @field_serializer("slo")
    def _slo_object(
        self, slo: tuple[float | None, float | None] | None
    ) -> dict[str, float | None] | None:
        """``{"ttft_s": ..., "e2e_s": ...}``, the SLO's own names."""
        return None if slo is None else {"ttft_s": slo[0], "e2e_s": slo[1]}


def load_pair(a: str | Path, b: str | Path | None) -> tuple[Side, Side]:
    """Two reports; or, with ``b`` omitted, one study's baseline (A) against its best (B)."""
    if b is not None:
        return load_side(a, "A"), load_side(b, "B")
    path, kind = _locate(Path(a))
    if kind != "study":
        raise ConfigError(
            f"{a}: a single report compares only for a study (baseline against winner); "
            "give a second report to compare a stress run with"
        )
    return load_side(path, "A", pick="baseline"), load_side(path, "B", pick="best")


def load_side(path: str | Path, name: str = "A", *, pick: Pick = "result") -> Side:
    """Read one side; a missing or unreadable report is a :class:`ConfigError` naming it."""
    p, kind = _locate(Path(path))
    if kind == "stress":
        return _stress_side(p, name)
    return _study_side(p, name, pick)


def _locate(p: Path) -> tuple[Path, Literal["stress", "study"]]:
    """The JSON file of a report and its kind."""
    if not p.exists():
        raise ConfigError(f"{p}: no such report directory or file")
    if p.is_dir():
        for fname, kind in (("summary.json", "stress"), ("study.json", "study")):
            if (p / fname).is_file():
                return p / fname, kind  # type: ignore[return-value]
        raise ConfigError(f"{p}: neither summary.json (stress) nor study.json (optimize) in it")
    data = _json(p)
    if "trials" in data and "study" in data:
        return p, "study"
    if "latency" in data and "window" in data:
        return p, "stress"
    raise ConfigError(f"{p}: neither a stress summary.json nor an optimize study.json")


def _json(p: Path) -> dict[str, Any]:
    try:
        data = json.loads(read_bytes(p, max_bytes=MAX_REPORT_BYTES))
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deeply
        raise ConfigError(f"{p}: not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a JSON object")
    return data


def summary_figures(s: RunSummary) -> dict[str, float | None]:
    lat, thr = s.latency, s.throughput
    return {
        "ttft_p50": lat.ttft.p50,
        "ttft_p99": lat.ttft.p99,
        "e2e_p99": lat.e2e.p99,
        "itl_p50": lat.itl.p50,
        "requests_per_s": thr.requests_per_s,
        "output_tokens_per_s": thr.output_tokens_per_s,
        "goodput_per_s": thr.goodput_per_s,
        "error_rate": s.outcomes.error_rate,
    }


def _few(ok: int) -> tuple[str, ...]:
    if ok >= 100:
        return ()
    return (f"{ok} successful requests in the window: P99s rest on fewer than 100 samples",)


def _stress_side(p: Path, name: str) -> Side:
    s = read_summary(p)
    notes: list[str] = []
    arrays = None
    records = read_records(p.parent) if _has_records(p.parent) else []
    if records:
        arrays = RunArrays.from_records(records, s.window, s.slo)
        notes.extend(_few(int((arrays.ok & arrays.in_window).sum())))
    else:
        notes.append(f"no per-request records next to {p.name}")
    if s.generator.degraded:
        notes.append("the load generator fell behind: " + "; ".join(s.generator.reasons))
    if s.incomplete:
        notes.append("the run is incomplete (stopped early or Prometheus lost)")
    return Side(
        name=name,
        label=f"{p.parent.name} (stress, {s.scenario})",
        path=str(p.parent),
        kind="stress",
        scenario=s.scenario,
        figures=summary_figures(s),
        arrays=arrays,
        requests=s.outcomes.sent,
        slo=None if s.slo is None else (s.slo.ttft_s, s.slo.e2e_s),
        notes=tuple(notes),
    )


def _has_records(d: Path) -> bool:
    return (d / "requests.parquet").is_file() or any(d.glob("records-*.jsonl"))


def _study_side(p: Path, name: str, pick: Pick) -> Side:
    try:
        return _study_side_of(p, _json(p), name, pick)
    except (KeyError, TypeError, AttributeError, StopIteration) as exc:
        raise ConfigError(f"{p}: malformed study.json ({type(exc).__name__}: {exc})") from None


def _study_side_of(p: Path, data: dict[str, Any], name: str, pick: Pick) -> Side:
    if not isinstance(data.get("schema_version"), int) or data["schema_version"] > 1:
        raise ConfigError(f"{p}: study schema_version {data.get('schema_version')!r} not supported")
    trials = {t["number"]: t for t in data.get("trials", [])}
    conf = data.get("confirmation") or {}
    base = data.get("baseline_trial")
    if base is None:
        raise ConfigError(f"{p}: the study has no measured baseline trial to compare")
    winner = conf.get("winner")
    confirmed = bool(conf.get("runs_per_arm"))
    study = data.get("study", p.parent.name)
    notes: list[str] = []
    if winner is not None and pick == "result" and (data.get("rollout") or {}).get("rolled_back"):
        notes.append(f"the winner (trial {winner}) was rolled back after its verification")
        winner = None
    # A confirmed winner and the baseline are compared over the rounds both ran in
    # (the comparison's own rounds and figures), never over the baseline's every round.
    paired = next(
        ((i, c) for i, c in enumerate(conf.get("comparisons", [])) if c["trial"] == winner),
        None,
    )
    rounds = None if paired is None or not paired[1].get("rounds") else paired[1]["rounds"]
    if winner is not None and pick in ("result", "best") and paired is not None:
        i, comparison = paired
        trial, figs = winner, comparison["figures"]
        what = f"winner (trial {winner}, confirmed)"
        labels = _confirm_dirs(p, comparison.get("arm") or f"B{i + 1}", rounds)  # R: the reference
    elif pick == "best" and data.get("best_trial") not in (None, base):
        trial = data["best_trial"]
        figs = trials[trial]["figures"]
        what, labels = f"best trial {trial} (not confirmed)", [_trial_dir(p, trial)]
        notes.append(f"trial {trial} was not confirmed against the baseline")
    else:
        trial = base
        if pick == "best":
            notes.append("the baseline is the study's best: A and B are the same configuration")
        if confirmed and paired is not None and paired[1].get("baseline_figures"):
            figs, labels = paired[1]["baseline_figures"], _confirm_dirs(p, "A", rounds)
        elif confirmed and conf.get("baseline_figures"):
            figs, labels = conf["baseline_figures"], _confirm_dirs(p, "A")
        else:
            figs, labels = trials[base]["figures"], [_trial_dir(p, base)]
        what = f"baseline (trial {base})"
        if pick == "result" and winner is None:
            what += ", no confirmed winner"
    figures = {k: (figs or {}).get(v) for k, v in _STUDY_FIGURES.items()}
    figures["itl_p50"] = None
    plan = _first_plan(labels)
    slo = _plan_slo(plan) if figures["goodput_per_s"] is not None else None
    arrays, runs, why = _study_arrays(labels, slo)
    if arrays is None:
        notes.append(f"per-request records of trial {trial} not used: {why}")
    else:
        notes.extend(_few(int((arrays.ok & arrays.in_window).sum())))
    return Side(
        name=name,
        label=f"study {study}: {what}",
        path=str(p.parent),
        kind="study",
        scenario=_scenario_name(str(data.get("scenario", "")), plan),
        figures=figures,
        arrays=arrays,
        runs=max(1, runs),
        requests=0 if arrays is None else int(arrays.in_window.sum()),
        slo=None if slo is None else (slo.ttft_s, slo.e2e_s),
        notes=tuple(notes),
    )


def _scenario_name(ref: str, plan: RunPlan | None) -> str:
    """A study stores the scenario as given (a name or a YAML path); its runs' ``run.json``
    records its name. Without one: the file name of a path, else the reference itself."""
    if plan is not None:
        return plan.scenario_name
    return Path(ref).stem if ref.endswith((".yaml", ".yml")) else ref


def _first_plan(dirs: list[Path]) -> RunPlan | None:
    for d in dirs:
        try:
            return read_run_plan(d)
        except ConfigError:
            continue
    return None


def _trial_dir(p: Path, n: int) -> Path:
    return p.parent / "runs" / f"trial-{n:04d}"


def _confirm_dirs(p: Path, arm: str, rounds: list[int] | None = None) -> list[Path]:
    """``runs/confirm-K-<arm>`` per round K (only ``rounds``, when given); the ``-retry``
    one when the first failed."""
    runs = p.parent / "runs"
    out = []
    for d in sorted(runs.glob(f"confirm-*-{arm}")):
        if rounds is not None and d.name.split("-")[1] not in {str(r) for r in rounds}:
            continue
        retry = d.with_name(d.name + "-retry")
        out.append(retry if retry.is_dir() else d)
    return out


def _plan_slo(plan: RunPlan | None) -> Slo | None:
    """The latency SLO the runs' goodput was judged against, as their ``run.json`` records
    it (the scenario's SLO with the study's ``--slo``); ``None`` without a recorded plan."""
    if plan is None:
        return None
    return plan.slo_value()


def _study_arrays(dirs: list[Path], slo: Slo | None) -> tuple[RunArrays | None, int, str]:
    if not dirs:
        return None, 0, "no run directory"
    parts = []
    for d in dirs:
        if not _has_records(d):
            return None, 0, f"no records in {d}"
        records = read_records(d)
        window, why = _run_window(d)
        if window is None:
            return None, 0, why
        parts.append(RunArrays.from_records(records, window, slo))
    return RunArrays.concat(parts), len(parts), ""


def _run_window(d: Path) -> tuple[Window | None, str]:
    """The measurement window recorded in ``d/run.json`` (absolute, as the run used it)."""
    try:
        plan = read_run_plan(d)
    except ConfigError as exc:
        return None, str(exc)
    if plan.window_start is None or plan.window_end is None:
        return None, f"{d}/run.json holds no measured window (the run did not finish)"
    return Window(plan.window_start, plan.window_end), ""
