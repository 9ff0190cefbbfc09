"""apply_params / rollback / `lbtune apply` on a real mini2 cluster, through ansible-runner
where the test is about Ansible and the direct path elsewhere (~1.3 s per playbook run)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from lbtune.apply import apply_params, rollback
from lbtune.cli.apply import apply_command, rollback_command
from lbtune.cluster import api
from lbtune.cluster.config import load_config
from lbtune.errors import ApplyError, ConfigError
from lbtune.targets import TARGETS
from lbtune.targets.base import ApplyResult, RejectedBeforeApply
from lbtune.targets.haproxy.target import HaproxyTarget
from lbtune.targets.lkg import LkgStore

pytestmark = pytest.mark.integration
BOGUS_QUEUE = {"haproxy_timeout_queue": "bogus"}  # renders a config HAProxy rejects


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HaproxyTarget]:
    if shutil.which("haproxy") is None or shutil.which("prometheus") is None:
        pytest.skip("haproxy and prometheus are needed")
    state = tmp_path_factory.mktemp("apply")
    try:
        yield HaproxyTarget(api.up(load_config("mini2")[0], state))
    finally:
        api.down(state)


@pytest.fixture
def fresh(target: HaproxyTarget) -> HaproxyTarget:
    """Baseline live, no LKG recorded (a fresh cluster as far as apply is concerned)."""
    target.template_overrides = {}
    target.apply(target.space().baseline())
    shutil.rmtree(target.state_dir / "lkg", ignore_errors=True)
    return target


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("apply")(apply_command)
    app.command("rollback")(rollback_command)
    return app


def test_ansible_check_mode_shows_a_diff_and_changes_nothing(fresh: HaproxyTarget) -> None:
    out = apply_params(fresh, {"weight.l4-0": 11}, via="ansible", check=True, source="t")
    assert out.result.check and out.result.changed
    assert out.result.diff == {"weight.l4-0": (100, 11)}
    assert [h.line() for h in out.hosts] == ["localhost: changed (1 knobs)"]
    assert "+weight.l4-0: 11" in out.log_path.read_text()  # type: ignore[union-attr]
    assert fresh.runtime.get_weight("all", "l4-0") == 100
    assert LkgStore(fresh.state_dir, "haproxy").get() is None


def test_ansible_apply_changes_weights_then_reports_no_change(fresh: HaproxyTarget) -> None:
    out = apply_params(fresh, {"weight.l4-0": 12}, via="ansible", source="file:w.yaml")
    assert (
        out.result.changed and fresh.runtime.get_weight("model_llama-3.1-8b-instruct", "l4-0") == 12
    )
    history = LkgStore(fresh.state_dir, "haproxy").history()
    assert [h.source for h in history] == ["baseline (live before the first apply)", "file:w.yaml"]
    again = apply_params(fresh, {"weight.l4-0": 12}, via="ansible", source="file:w.yaml")
    assert not again.result.changed and [h.status for h in again.hosts] == ["ok"]
    assert len(LkgStore(fresh.state_dir, "haproxy").history()) == 2


def test_a_playbook_failing_halfway_rolls_back_to_the_last_known_good(
    fresh: HaproxyTarget,
) -> None:
    apply_params(fresh, {"weight.h100-0": 70}, via="direct", source="good")
    with pytest.raises(
        ApplyError,
        match=r"FAILED at task 'Injected failure.*rolled back to the last known good .* from good",
    ):
        apply_params(
            fresh,
            {"weight.h100-0": 5, "algorithm": "leastconn"},
            via="ansible",
            extravars={"lbtune_fail_after_apply": True},
        )
    live = fresh.read_live()
    assert live["weight.h100-0"] == 70 and live["algorithm"] == "roundrobin"


def test_a_config_haproxy_rejects_through_ansible_keeps_the_old_one(fresh: HaproxyTarget) -> None:
    pid = fresh.worker_pid()
    with pytest.raises(RejectedBeforeApply, match="HAProxy rejects the new config"):
        apply_params(
            fresh,
            {"algorithm": "leastconn"},
            via="ansible",
            extravars={"lbtune_options": {"template_overrides": BOGUS_QUEUE}},
        )
    assert fresh.worker_pid() == pid and fresh.read_live()["algorithm"] == "roundrobin"


def test_failed_read_back_on_the_direct_path_rolls_back(
    fresh: HaproxyTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    apply_params(fresh, {"weight.l4-0": 33}, via="direct", source="good")
    real = HaproxyTarget.apply

    def half_applied(
        self: HaproxyTarget, params: dict[str, object], *, check: bool = False
    ) -> ApplyResult:
        if params.get("weight.l4-0") == 1:
            self.runtime.set_weight("all", "l4-0", 1)
            raise ApplyError("Read-back does not match what was applied: simulated")
        return real(self, params, check=check)

    monkeypatch.setattr(HaproxyTarget, "apply", half_applied)
    with pytest.raises(ApplyError, match="simulated; rolled back to the last known good"):
        apply_params(fresh, {"weight.l4-0": 1}, via="direct")
    assert fresh.runtime.get_weight("all", "l4-0") == 33


def test_the_lock_refuses_a_concurrent_apply(fresh: HaproxyTarget) -> None:
    from lbtune.apply.lock import apply_lock

    with apply_lock(fresh.state_dir), pytest.raises(ApplyError, match="Another apply is running"):
        apply_params(fresh, {"weight.l4-0": 2}, via="direct")


def test_cli_show_apply_check_invalid_and_rollback(fresh: HaproxyTarget, tmp_path: Path) -> None:
    runner, app, sd = CliRunner(), cli(), str(fresh.state_dir)
    shown = runner.invoke(app, ["apply", "--show", "--state-dir", sd])
    assert shown.exit_code == 0, shown.output
    doc = yaml.safe_load(shown.stdout)
    assert doc["target"] == "haproxy" and doc["params"]["weight.l4-0"] == 100
    doc["params"]["weight.l4-0"] = 44  # show -> edit -> apply
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(doc))
    check = runner.invoke(
        app, ["apply", "-p", str(edited), "--check", "--direct", "--state-dir", sd]
    )
    assert check.exit_code == 0 and "weight.l4-0: 100 -> 44" in check.stdout
    assert "nothing was touched" in check.stdout and fresh.runtime.get_weight("all", "l4-0") == 100
    done = runner.invoke(app, ["apply", "-p", str(edited), "--direct", "--state-dir", sd])
    assert done.exit_code == 0 and "apply: changed" in done.stdout
    assert fresh.runtime.get_weight("all", "l4-0") == 44
    bad = tmp_path / "bad.yaml"
    bad.write_text("weight.h100-9: 5\n")
    refused = runner.invoke(app, ["apply", "-p", str(bad), "--direct", "--state-dir", sd])
    assert isinstance(refused.exception, ConfigError) and refused.exception.exit_code == 2
    assert str(refused.exception).startswith(f"{bad}: weight.h100-9: unknown knob; available:")
    assert fresh.runtime.get_weight("all", "l4-0") == 44
    fresh.apply({"weight.l4-0": 3})  # drift outside lbtune's record
    back = runner.invoke(app, ["rollback", "--direct", "--state-dir", sd, "--json"])
    assert back.exit_code == 0, back.output
    assert fresh.runtime.get_weight("all", "l4-0") == 44
    unknown = runner.invoke(app, ["apply", "--show", "-t", "haprox", "--state-dir", sd])
    assert str(unknown.exception) == f"Unknown target 'haprox'. Available: {', '.join(TARGETS)}"
    other = runner.invoke(app, ["apply", "--show", "-t", "vllm-router", "--state-dir", sd])
    assert isinstance(other.exception, ConfigError)
    assert str(other.exception).startswith("--target vllm-router: the cluster in ")
    assert "runs haproxy" in str(other.exception)


def test_rollback_without_a_record_is_an_error(fresh: HaproxyTarget) -> None:
    with pytest.raises(ApplyError, match="No last known good"):
        rollback(fresh, via="direct")


def test_an_unreachable_host_is_reported_and_no_host_is_left_half_applied(
    fresh: HaproxyTarget, tmp_path: Path
) -> None:
    """localhost applies first, then lb-down is unreachable: the rollout stops and rolls back."""
    from lbtune.cluster.resolve import free_port

    closed_port = free_port()  # nothing listens there (under xdist: in this worker's range)
    apply_params(fresh, {"weight.h100-0": 70}, via="direct", source="good")
    inventory = tmp_path / "two-hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "balancers": {
                            "vars": {"lbtune_serial": 1},
                            "hosts": {
                                "localhost": {
                                    "ansible_connection": "local",
                                    "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                                },
                                "lb-down": {
                                    "ansible_host": "127.0.0.1",
                                    "ansible_port": closed_port,
                                    "ansible_connection": "ssh",
                                    "ansible_ssh_timeout": 3,
                                },
                            },
                        }
                    }
                }
            }
        )
    )
    with pytest.raises(ApplyError) as err:
        apply_params(fresh, {"weight.h100-0": 9}, via="ansible", inventory=inventory)
    message = str(err.value)
    assert "lb-down" in message and "unreachable" in message.lower(), message
    assert fresh.read_live()["weight.h100-0"] == 70, "localhost must be back on the last known good"


def test_the_last_known_good_survives_cluster_down_and_up(tmp_path: Path) -> None:
    """Issue 29 (item 5): the same cluster brought down and up comes back on its last known
    good (before: untuned, its last known good lost); another cluster in the same state
    dir starts untuned, the earlier record forgotten (its history kept)."""
    state = tmp_path / "state"
    mini2 = load_config("mini2")[0]
    try:
        first = HaproxyTarget(api.up(mini2, state))
        good = apply_params(first, {"algorithm": "leastconn"}, via="direct", source="earlier").lkg
        assert good is not None
        api.down(state)
        said: list[str] = []
        second = HaproxyTarget(api.up(mini2, state, progress=said.append))
        assert LkgStore(state, "haproxy").get() == good
        assert second.read_live()["algorithm"] == "leastconn"
        assert any("back on its last known good" in m and good.sha256[:12] in m for m in said)
        api.down(state)
        other = HaproxyTarget(api.up(mini2.model_copy(update={"time_scale": 8.0}), state))
        assert LkgStore(state, "haproxy").get() is None
        assert (state / "lkg" / "haproxy-history.jsonl").exists()
        assert other.read_live()["algorithm"] == "roundrobin"
    finally:
        api.down(state)
