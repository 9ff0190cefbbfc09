"""How the suite is spread over pytest-xdist workers (``scripts/test.sh`` runs ``pytest -n N
--dist loadgroup``; a plain serial ``pytest`` uses none of this).

Most of the suite's time is spent waiting: the long integration tests drive load for
seconds at a time against simulated replicas, with the CPU mostly idle, so a few workers
run at once. A *unit* is a set of tests that runs on one worker, in collection order
(:func:`unit_of`):

* a test module, whole, by default: its module-scoped fixtures (clusters, servers) start
  once, and its tests run in file order, as they do serially;
* a :data:`GROUPS` entry: modules that share a session-scoped fixture of their package's
  conftest (the conformance suite's vLLM server, pinned to the last CPU, starts once;
  the robustness package's ``mini2`` cluster) or a fixed machine-wide resource;
* a test of its own, for the modules of :data:`SPLIT` (long, independent studies).

:func:`check` holds these tables to the fixtures the tests really use (in
``tests/test_workers.py``, over every test collected with it: it fails, naming the fix, when
a new test breaks them).

Units are handed out longest first (:data:`LONGEST_FIRST`, :func:`rank`), so that no worker
is left with a two-minute study while the others are done. This decides where and when a
test runs, never whether it passes: every unit still sets up everything it uses.

(xdist's own ``loadgroup`` groups by ``xdist_group`` marks through the node id, which
pytest 9.2 no longer lets it change: pytest-dev/pytest-xdist#1386. So the grouping is done
by :class:`UnitScheduling`, chosen by ``tests/conftest.py`` for ``--dist loadgroup``.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPLIT = frozenset(
    {
        "tests/tune/test_optimize_e2e.py",
        "tests/targets/test_optimize_targets.py",
    }
)
"""Modules whose tests may run on different workers at once: each long test is a study of
its own on its own cluster in ``tmp_path``."""

GROUPS: dict[str, tuple[str, ...]] = {
    # The vLLM server (tests/conformance/conftest.py, session-scoped, pinned to one CPU).
    "conformance": ("tests/conformance/",),
    # The session's mini2 cluster (tests/robustness/conftest.py).
    "robustness-mini2": (
        "tests/robustness/test_apply_safety.py",
        "tests/robustness/test_attribution.py",
        "tests/robustness/test_faults.py",
        "tests/robustness/test_inputs.py",
        "tests/robustness/test_nothing_started.py",
        "tests/robustness/test_preflight.py",
    ),
}
"""Unit name -> the modules (or directories, ending in ``/``) it holds."""

LONGEST_FIRST: tuple[str, ...] = (
    "tests/cli/test_ci_e2e.py",
    "tests/tune/test_optimize_e2e.py::test_study_killed_mid_trial_resumes_confirms_and_rolls_out",
    "tests/tune/test_optimize_e2e.py",
    "conformance",
    "tests/run/test_stress.py",
    "tests/test_nightly_workflow.py",
    "robustness-mini2",
    "tests/targets/test_optimize_targets.py::test_nightly_steps_on_the_balancer",
    "tests/test_wheel.py",
    "tests/robustness/test_remote_everywhere.py",
    "tests/tune/test_screen.py",
    "tests/search/test_study.py",
    "tests/metrics/test_recompute.py",
    "tests/cli/test_piped_progress.py",
    "tests/compare/test_verdict.py",
    "tests/twin/test_live_vs_twin.py",
    "tests/robustness/test_fleet.py",
    "tests/dashboards/test_dashboards.py",
    "tests/robustness/test_apply_transaction.py",
    "tests/run/test_failures.py",
    "tests/robustness/test_prometheus_loss.py",
    "tests/cluster/test_keeper.py",
    "tests/cluster/test_agent_cluster.py",
    "tests/agent/test_agent_e2e.py",
    "tests/run/test_until.py",
)
"""Units (a unit's name, or a test's node id without its parameters), longest first: seconds
of the suite on three workers with a busy loop on one core (2026-12-06) were 168 (the CI
jobs' module), 129 (the killed study's resume), 132 (the before/after study), ... Units named
by none come after these, the ones with more tests first."""


PORTS_FROM = 20000
"""Workers' port ranges start here: below the OS's ephemeral range (32768 on Linux)."""


def port_range(worker: str, count: int, ephemeral_low: int | None = None) -> str | None:
    """``LOW-HIGH`` for xdist worker ``gwN`` of ``count``, or ``None`` (the OS picks ports).

    Servers in the tests bind ports picked free a moment before (``free_port``); picked by
    the OS from its ephemeral range, such a port can be taken in between by another
    worker's pick or by an outgoing connection. A range of its own, below the ephemeral
    range, is taken by neither.
    """
    if ephemeral_low is None:
        try:
            text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
            ephemeral_low = int(text.split()[0])
        except (OSError, ValueError, IndexError):
            return None
    index = worker.removeprefix("gw")
    size = min(2000, (ephemeral_low - PORTS_FROM) // max(count, 1))
    if not index.isdigit() or int(index) >= count or size < 200:
        return None
    low = PORTS_FROM + int(index) * size
    return f"{low}-{low + size - 1}"


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def group_of(module: str) -> str | None:
    for name, members in GROUPS.items():
        if any(module == m or (m.endswith("/") and module.startswith(m)) for m in members):
            return name
    return None


def unit_of(nodeid: str) -> str:
    """The unit a test belongs to (its own node id when it is a unit of its own)."""
    module = module_of(nodeid)
    group = group_of(module)
    if group is not None:
        return group
    if module in SPLIT:
        return nodeid
    return module


def rank(unit: str, nodeids: Iterable[str]) -> int:
    """The unit's place in :data:`LONGEST_FIRST` (``len`` of it when not named there)."""
    names = {unit, *(n.split("[", 1)[0] for n in nodeids), *(module_of(n) for n in nodeids)}
    return next((i for i, name in enumerate(LONGEST_FIRST) if name in names), len(LONGEST_FIRST))


@dataclass(frozen=True, slots=True)
class Fixture:
    """What :func:`check` needs of one fixture that a test uses."""

    name: str
    scope: str
    """``function``, ``class``, ``module``, ``package`` or ``session``."""
    baseid: str
    """Where it is defined: a module's node id, a conftest's directory, or ``""``."""


def check(uses: Mapping[str, Sequence[Fixture]], root: str) -> list[str]:
    """What is wrong with the tables for these tests (node id -> the fixtures it uses).

    A test that uses a module- or class-scoped fixture must not be a unit of its own, and
    the users of one session- or package-scoped fixture of a package's conftest must all be
    in one unit. ``root`` is the top conftest's directory (``tests``): its fixtures (a
    temporary history database) are cheap and may be set up once per worker.
    """
    problems: list[str] = []
    users: dict[tuple[str, str], set[str]] = {}
    for nodeid, fixtures in uses.items():
        unit = unit_of(nodeid)
        for f in fixtures:
            if f.baseid in ("", root) or f.scope == "function":
                continue
            if f.scope in ("session", "package") and not f.baseid.endswith(".py"):
                users.setdefault((f.baseid, f.name), set()).add(unit)
            elif unit == nodeid:
                problems.append(
                    f"{nodeid} uses the {f.scope}-scoped fixture {f.name!r}: take "
                    f"{module_of(nodeid)} out of SPLIT in tests/workers.py"
                )
    for (baseid, name), units in sorted(users.items()):
        if len(units) > 1:
            problems.append(
                f"the {name!r} fixture of {baseid}/conftest.py is used by the units "
                f"{sorted(units)}: put them in one GROUPS entry of tests/workers.py"
            )
    return problems


def scheduler(config: Any, log: Any) -> Any:
    """The xdist scheduler of :class:`UnitScheduling` (xdist imported only here)."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's scope scheduling with :func:`unit_of` as the scope, longest unit first."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            queue = self.workqueue
            first = min(queue, key=lambda unit: rank(unit, queue[unit]))
            queue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return UnitScheduling(config, log)
