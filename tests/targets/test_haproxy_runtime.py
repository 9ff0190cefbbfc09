"""HaproxyRuntime against a real HAProxy (started per test module on loopback)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from lbtune.errors import TargetError
from lbtune.targets.haproxy.runtime import HaproxyRuntime, servers_by_name
from tests.targets.haproxy_fixture import needs_haproxy, running_haproxy

pytestmark = [pytest.mark.integration, needs_haproxy, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HaproxyRuntime]:
    tmp = tmp_path_factory.mktemp("hap")
    backends = {"all": ["h100-0", "l4-0", "a100-0"], "model_8b": ["h100-0", "l4-0"]}
    with running_haproxy(tmp, backends, static={"fixed": ["s1"]}) as sock:
        yield HaproxyRuntime(str(sock))


def test_set_get_weight_round_trip(rt: HaproxyRuntime) -> None:
    rt.set_weight("all", "l4-0", 42)
    assert rt.get_weight("all", "l4-0") == 42
    rt.set_weight("all", "l4-0", 100)
    assert rt.get_weight("all", "l4-0") == 100


def test_batched_set_weights_in_one_connection(rt: HaproxyRuntime) -> None:
    wanted = {("all", "h100-0"): 7, ("all", "a100-0"): 0, ("model_8b", "h100-0"): 256}
    rt.set_weights(wanted)
    state = {(s.backend, s.server): s for s in rt.servers_state()}
    for key, w in wanted.items():
        assert state[key].weight == w
        assert state[key].initial_weight == 100
    rt.set_weights(dict.fromkeys(wanted, 100))


def test_execute_splits_replies_per_command(rt: HaproxyRuntime) -> None:
    replies = rt.execute(
        [
            "set weight all/l4-0 55",
            "get weight all/l4-0",
            "get weight all/nope",
            "get weight all/l4-0",
        ]
    )
    assert replies == ["", "55 (initial 100)", "No such server.", "55 (initial 100)"]
    rt.set_weight("all", "l4-0", 100)


def test_servers_state_parses_every_backend(rt: HaproxyRuntime) -> None:
    rows = rt.servers_state()
    assert {(s.backend, s.server) for s in rows} >= {
        ("all", "h100-0"),
        ("all", "l4-0"),
        ("all", "a100-0"),
        ("model_8b", "h100-0"),
        ("model_8b", "l4-0"),
    }
    row = next(s for s in rows if (s.backend, s.server) == ("all", "a100-0"))
    assert (row.addr, row.port, row.admin_state, row.op_state) == (
        "127.0.0.1",
        3,
        "ready",
        "running",
    )
    assert sorted(servers_by_name(rows)["h100-0"][i].backend for i in range(2)) == [
        "all",
        "model_8b",
    ]
    assert {s.backend for s in rt.servers_state("model_8b")} == {"model_8b"}


def test_drain_maint_ready(rt: HaproxyRuntime) -> None:
    def admin() -> str:
        return next(s for s in rt.servers_state("all") if s.server == "l4-0").admin_state

    rt.set_state("all", "l4-0", "drain")
    assert admin() == "drain"
    assert next(s for s in rt.stat() if (s.backend, s.server) == ("all", "l4-0")).status == "DRAIN"
    rt.set_state("all", "l4-0", "maint")
    assert admin() == "maint"
    rt.set_state("all", "l4-0", "ready")
    assert admin() == "ready"


def test_set_maxconn(rt: HaproxyRuntime) -> None:
    rt.set_maxconn("all", "h100-0", 8)
    row = next(s for s in rt.stat() if (s.backend, s.server) == ("all", "h100-0"))
    assert row.raw["slim"] == "8"
    rt.set_maxconn("all", "h100-0", 0)


def test_stat_rows(rt: HaproxyRuntime) -> None:
    rows = rt.stat()
    assert all(s.server not in ("FRONTEND", "BACKEND") for s in rows)
    row = next(s for s in rows if (s.backend, s.server) == ("all", "h100-0"))
    assert (row.stot, row.scur, row.qcur, row.weight) == (0, 0, 0, 100)
    assert any(s.server == "BACKEND" for s in rt.stat(include_aggregates=True))


def test_haproxy_errors_name_the_command_and_haproxys_words(rt: HaproxyRuntime) -> None:
    with pytest.raises(TargetError, match=r"get weight all/nope.*No such server"):
        rt.get_weight("all", "nope")
    with pytest.raises(TargetError, match=r"No such backend"):
        rt.set_weight("nobackend", "h100-0", 3)
    with pytest.raises(TargetError, match=r"static LB algorithm"):
        rt.set_weight("fixed", "s1", 3)
    # One bad server in a batch: the others are applied, the error lists the bad one.
    with pytest.raises(TargetError, match=r"1 of 2 commands failed.*all/ghost"):
        rt.set_weights({("all", "ghost"): 5, ("all", "a100-0"): 9})
    assert rt.get_weight("all", "a100-0") == 9
    rt.set_weight("all", "a100-0", 100)


def test_bad_arguments_never_reach_haproxy(rt: HaproxyRuntime) -> None:
    with pytest.raises(ValueError, match=r"0\.\.256"):
        rt.set_weight("all", "h100-0", 257)
    with pytest.raises(ValueError, match="invalid HAProxy server"):
        rt.set_weight("all", "h100-0;shutdown sessions", 1)
    with pytest.raises(ValueError, match="ready, drain or maint"):
        rt.set_state("all", "h100-0", "up")  # type: ignore[arg-type]


def test_missing_and_refusing_sockets(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match=r"does not exist.*show stat"):
        HaproxyRuntime(str(tmp_path / "none.sock")).stat()
    dead = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(dead))  # bound, never listening: connect() is refused
        with pytest.raises(TargetError, match=r"refused the connection.*get weight a/b"):
            HaproxyRuntime(str(dead)).get_weight("a", "b")
