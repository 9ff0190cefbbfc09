"""Options several commands share, each declared once (``typing.Annotated`` with Typer).

A command names its parameter and default and takes the flag, short form and help from
here, so ``lbtune stress --seed`` and ``lbtune optimize --seed`` cannot drift apart::

    def stress_command(seed: SeedOpt = None, as_json: JsonOpt = False) -> None: ...

Options only one command has stay with that command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

import typer

__all__ = [
    "DEFAULT_STUDY_STORAGE",
    "CiOpt",
    "DirectOpt",
    "InventoryOpt",
    "JsonOpt",
    "JunitOpt",
    "OutOpt",
    "PrometheusOpt",
    "ScenarioOpt",
    "SeedOpt",
    "SloOpt",
    "SpaceOpt",
    "SpeedupOpt",
    "StateDirOpt",
    "StorageOpt",
    "TargetNameOpt",
    "TraceFormatOpt",
    "TraceOpt",
    "check_outputs",
    "scenario_or_trace",
]

DEFAULT_STUDY_STORAGE = "sqlite:///reports/studies.db"

S = TypeVar("S", str, str | None)

# -- what load: the scenario, or a trace replayed in its place ---------------------------

ScenarioOpt = Annotated[
    S,
    typer.Option(
        "--scenario",
        "-s",
        help="Built-in scenario (see `lbtune scenarios list`) or a YAML file.",
    ),
]
"""``ScenarioOpt[str]`` with a default scenario, ``ScenarioOpt[str | None]`` without."""
TraceOpt = Annotated[
    str | None,
    typer.Option(
        "--trace", help="Replay this trace file instead of --scenario (docs/scenarios.md)."
    ),
]
TraceFormatOpt = Annotated[
    str | None,
    typer.Option(
        "--trace-format",
        help="With --trace: azure, mooncake, burstgpt, sharegpt, lbtune, or the agentic weka, "
        "otel or copilot (default: from the file).",
    ),
]
SpeedupOpt = Annotated[
    float | None,
    typer.Option("--speedup", help="With --trace: replay K times faster than recorded."),
]
SeedOpt = Annotated[
    int | None,
    typer.Option(
        "--seed", help="Seed of the traffic (and of a study's sampler); default: the scenario's."
    ),
]
SloOpt = Annotated[
    str | None,
    typer.Option(
        "--slo",
        help="SLO overrides, e.g. ttft=350ms,e2e=800ms,errors=1% (in a study also the score's "
        "references and its error limit).",
    ),
]

# -- where: the cluster, its balancer, its Prometheus ----------------------------------

StateDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="The embedded cluster's state dir (default: $LBTUNE_STATE_DIR, else the one running).",
    ),
]
TargetNameOpt = Annotated[
    str | None,
    typer.Option(
        "--target",
        "-t",
        help="Balancer target: haproxy, envoy, nginx or vllm-router (default: the cluster's own).",
    ),
]
PrometheusOpt = Annotated[
    str | None,
    typer.Option("--prometheus", help="Prometheus URL (default: the running embedded cluster's)."),
]
SpaceOpt = Annotated[
    Path | None,
    typer.Option("--space", help="Parameter-space YAML (default: the target's own)."),
]
StorageOpt = Annotated[
    str,
    typer.Option(
        "--storage", help="The studies' Optuna storage: an RDB URL (SQLite, PostgreSQL, ...)."
    ),
]
InventoryOpt = Annotated[
    Path | None,
    typer.Option(
        "--inventory",
        "-i",
        help="Ansible inventory of the rollout (default: lbtune's inventory/local.yml, this "
        "machine).",
    ),
]
DirectOpt = Annotated[
    bool, typer.Option("--direct", help="Skip Ansible: apply through lbtune's Python directly.")
]

# -- output -------------------------------------------------------------------------------

OutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        "-o",
        help="Report directory (default: reports/<time>-<scenario>/; a study's "
        "reports/<time>-optimize-<study>/).",
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Machine-readable output only: JSON on stdout.")
]
CiOpt = Annotated[
    bool,
    typer.Option(
        "--ci",
        envvar="LBTUNE_CI",
        help="CI mode: plain lines, no colour or live display; exit codes a pipeline can act "
        "on (see above and docs/ci.md).",
    ),
]
JunitOpt = Annotated[
    Path | None,
    typer.Option(
        "--junit",
        help="Write JUnit XML to this file, a test case per check (stress: SLO check; compare: "
        "figure; optimize: trial, confirmation and rollout step).",
    ),
]


def scenario_or_trace(
    scenario: S, trace: str | None, trace_format: str | None, speedup: float | None
) -> S | str:
    """The scenario reference to run: ``--trace``'s replay when given, else ``--scenario``."""
    if trace is not None:
        from lbtune.scenario.loader import trace_ref

        return trace_ref(trace, trace_format, speedup)
    if trace_format is not None or speedup is not None:
        raise typer.BadParameter("--trace-format and --speedup apply to --trace")
    return scenario


def check_outputs(
    out: Path | None, reports: Path = Path("reports"), *, state_dir: Path | None = None
) -> None:
    """Before any work: ``--out`` must be a new or empty directory that can be written (a
    report is never overwritten silently), else the reports dir its default lies in must
    be a usable directory; a ``--state-dir`` must be a directory (or not exist yet); one
    line naming the path and the problem."""
    from lbtune.safety.files import check_out_dir

    if out is not None:
        check_out_dir(out, "--out")
    else:
        check_out_dir(reports, "the reports dir", fresh=False)
    if state_dir is not None:
        check_out_dir(state_dir, "--state-dir", fresh=False, writable=False)


TwinProfileOpt = Annotated[
    Path | None,
    typer.Option(
        "--twin-profile",
        help="A fitted profile (lbtune twin fit): the twin simulates its replicas from their "
        "measured rates.",
    ),
]
MaxTwinErrorOpt = Annotated[
    float,
    typer.Option(
        "--max-twin-error",
        help="Refuse a --twin-profile whose validation missed a figure by more (0.25 = 25 %).",
        min=0.0,
    ),
]
