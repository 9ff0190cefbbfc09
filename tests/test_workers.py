"""tests/workers.py: how the suite is cut into units for the parallel workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtune.cluster.resolve import PORTS_ENV, free_port
from lbtune.errors import ConfigError
from tests import workers
from tests.workers import Fixture, check, port_range, rank, unit_of

ROOT = Path(__file__).resolve().parents[1]


def test_a_module_is_one_unit_unless_split_or_grouped() -> None:
    assert unit_of("tests/run/test_stress.py::test_report_directory") == "tests/run/test_stress.py"
    killed = (
        "tests/tune/test_optimize_e2e.py::"
        "test_study_killed_mid_trial_resumes_confirms_and_rolls_out"
    )
    assert unit_of(killed) == killed
    assert unit_of("tests/conformance/test_api.py::test_health[vllm]") == "conformance"
    assert unit_of("tests/conformance/test_vllm_cluster.py::t") == "conformance"
    assert unit_of("tests/robustness/test_faults.py::t") == "robustness-mini2"
    assert unit_of("tests/robustness/test_fleet.py::t") == "tests/robustness/test_fleet.py"


def test_every_named_module_exists() -> None:
    named = [*workers.SPLIT, *(m for ms in workers.GROUPS.values() for m in ms)]
    named += [n.split("::", 1)[0] for n in workers.LONGEST_FIRST if n.startswith("tests/")]
    assert [n for n in named if not (ROOT / n).exists()] == []
    assert {n for n in workers.LONGEST_FIRST if not n.startswith("tests/")} <= set(workers.GROUPS)


def test_longest_first_ranks_units_and_tests() -> None:
    first = workers.LONGEST_FIRST[0]
    assert rank(first.split("::")[0], [first]) == 0
    study = "tests/targets/test_optimize_targets.py::test_nightly_steps_on_the_balancer"
    assert rank(study + "[mini2-nginx-nginx]", [study + "[mini2-nginx-nginx]"]) > 0
    assert rank("conformance", []) < rank("robustness-mini2", [])
    after = (
        "tests/tune/test_optimize_e2e.py::test_study_before_after_equals_a_same_round_recomputation"
    )
    assert rank(after, [after]) == workers.LONGEST_FIRST.index("tests/tune/test_optimize_e2e.py")
    assert rank("tests/test_objective.py", ["tests/test_objective.py::t"]) == len(
        workers.LONGEST_FIRST
    )


def test_check_names_a_split_module_with_a_module_fixture() -> None:
    killed = (
        "tests/tune/test_optimize_e2e.py::"
        "test_study_killed_mid_trial_resumes_confirms_and_rolls_out"
    )
    shared = Fixture("cluster", "module", "tests/tune/test_optimize_e2e.py")
    problems = check({killed: [shared, Fixture("tmp_path", "function", "")]}, "tests")
    assert len(problems) == 1 and "take tests/tune/test_optimize_e2e.py out of SPLIT" in problems[0]
    assert (
        check(
            {"tests/run/test_stress.py::t": [Fixture("c", "module", "tests/run/test_stress.py")]},
            "tests",
        )
        == []
    )


def test_check_names_a_session_fixture_used_across_units() -> None:
    mini2 = Fixture("mini2", "session", "tests/robustness")
    uses = {
        "tests/robustness/test_faults.py::a": [mini2],
        "tests/robustness/test_fleet.py::b": [mini2],
    }
    problems = check(uses, "tests")
    assert len(problems) == 1 and "put them in one GROUPS entry" in problems[0], problems
    # the top conftest's session fixtures (a history database) may run once per worker
    history = Fixture("_history_db", "session", "tests")
    assert check({"tests/a.py::x": [history], "tests/b.py::y": [history]}, "tests") == []


def test_the_tables_fit_the_fixtures_the_collected_tests_use(
    request: pytest.FixtureRequest,
) -> None:
    """No shared fixture of this session's tests is set up twice, or split from its users."""
    root = Path(__file__).parent.relative_to(request.config.rootpath).as_posix()
    uses = {}
    for item in request.session.items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.items() if info is not None else ()
        uses[item.nodeid] = [Fixture(n, d[-1].scope, d[-1].baseid) for n, d in defs if d]
    assert len(uses) == len(request.session.items)
    assert check(uses, root) == []


def test_each_worker_has_its_own_ports_below_the_ephemeral_range() -> None:
    assert port_range("gw0", 2, 32768) == "20000-21999"
    assert port_range("gw1", 2, 32768) == "22000-23999"
    last = port_range("gw7", 8, 32768)
    assert last is not None and int(last.split("-")[1]) < 32768
    assert port_range("gw2", 2, 32768) is None  # not a worker of this run
    assert port_range("gw0", 2, 20100) is None  # no room below the ephemeral range


def test_free_port_picks_in_the_range_and_skips_a_bound_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    def next_one_free(busy: socket.socket) -> bool:
        """Whether the port above ``busy``'s is free now (another process may hold it)."""
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", busy.getsockname()[1] + 1))
            except OSError:
                return False
        return True

    for _ in range(50):  # a bound port whose neighbour no other process holds
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            port = busy.getsockname()[1]
            if port + 1 > 65535 or not next_one_free(busy):
                continue
            monkeypatch.setenv(PORTS_ENV, f"{port}-{port + 1}")
            assert {free_port() for _ in range(5)} == {port + 1}
            break
    else:
        pytest.fail("no bound port with a free neighbour in 50 tries")
    monkeypatch.setenv(PORTS_ENV, "20000")
    with pytest.raises(ConfigError, match="expected LOW-HIGH"):
        free_port()
