"""Issue 29 (item 7): every address a user configures needs the opt-in to leave loopback,
and no URL carries credentials.

The test walks lbtune's whole CLI: every option whose name looks like an address must be
in :data:`ADDRESSES` (proved here: a remote value without ``--allow-remote`` is refused in
one line before anything starts, and a URL with ``user:secret@`` is refused without
printing the secret) or in :data:`NOT_ADDRESSES` with the reason. A new address option
fails this test until it is checked. The files that name addresses (a cluster's
``external:`` replicas, the agent's ``prometheus_url``) are proved the same way.
Nothing here sends a request: every refusal comes before the first connection.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

from lbtune.agent.config import AgentConfig
from lbtune.cli import app
from lbtune.cluster.config import load_config
from lbtune.errors import ConfigError
from lbtune.records.addresses import check_url, is_loopback, without_userinfo
from tests.robustness.conftest import run_cli

ADDRESS_NAME = re.compile(
    r"target|prometheus|master|bind|host|url|storage|addr|listen|endpoint|remote|server|port"
)
"""What an option that names a machine is called."""

CLOSED = "http://127.0.0.1:9"  # a loopback target nothing listens on: never reached here
REMOTE_HOST = "192.0.2.7"  # TEST-NET-1: never routed
SECRET = "s3cr3t-in-url"

ADDRESSES: dict[tuple[str, str], tuple[list[str], str]] = {
    # (command, option): (the command line with {} for a remote value, what the error names)
    ("stress", "--target"): (["stress", "-d", "1", "--target", "{url}"], "--target"),
    ("stress", "--prometheus"): (
        ["stress", "-d", "1", "--target", CLOSED, "--prometheus", "{url}"],
        "--prometheus",
    ),
    ("stress", "--master-bind"): (
        ["stress", "-d", "1", "--target", CLOSED, "--master", "--master-bind", "{host}"],
        "--master-bind",
    ),
    ("stress", "--master-host"): (
        ["stress", "-d", "1", "--target", CLOSED, "--worker", "--master-host", "{host}"],
        "--master-host",
    ),
    ("capacity", "--target"): (
        ["capacity", "--no-twin", "--max-probes", "1", "--target", "{url}"],
        "--target",
    ),
    ("agent run", "--prometheus"): (
        ["agent", "run", "--once", "--state-dir", "{tmp}", "--prometheus", "{url}"],
        "prometheus_url",
    ),
}

NOT_ADDRESSES: dict[tuple[str, str], str] = {
    ("stress", "--master"): "a switch: run the master (where it listens: --master-bind)",
    ("stress", "--master-port"): "a port number; the host is --master-bind/--master-host",
    ("stress", "--allow-remote"): "the opt-in itself",
    ("capacity", "--allow-remote"): "the opt-in itself",
    ("agent run", "--allow-remote"): "the opt-in itself",
    ("agent run", "--port"): "the agent's /metrics, always on 127.0.0.1",
    ("dashboard", "--port"): "optuna-dashboard, always on 127.0.0.1",
    ("optimize", "--target"): "a balancer's name (haproxy, envoy, ...), not an address",
    ("apply", "--target"): "a balancer's name (haproxy, envoy, ...), not an address",
    ("rollback", "--target"): "a balancer's name (haproxy, envoy, ...), not an address",
    # The studies' database: no load goes there and nothing listens; its URL is printed
    # without its password (test_a_storage_url_never_prints_its_password).
    ("optimize", "--storage"): "the studies' database",
    ("apply", "--storage"): "the studies' database",
    ("dashboard", "--storage"): "the studies' database",
    ("history", "--storage"): "the studies' database (a local SQLite file)",
}


def _options(cmd: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """(command path, each long option name) for every command of the CLI."""
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from _options(sub, (*path, name))
        return
    for param in cmd.params:
        if getattr(param, "param_type_name", "") == "option":
            for opt in param.opts + param.secondary_opts:
                if opt.startswith("--"):
                    yield " ".join(path), opt


def test_every_address_option_of_the_cli_is_known() -> None:
    found = {o for o in _options(typer.main.get_command(app)) if ADDRESS_NAME.search(o[1])}
    unknown = found - set(ADDRESSES) - set(NOT_ADDRESSES)
    assert not unknown, f"address options nobody checks: {sorted(unknown)}"
    gone = (set(ADDRESSES) | set(NOT_ADDRESSES)) - found
    assert not gone, f"listed here, not in the CLI any more: {sorted(gone)}"


def _line(template: list[str], tmp_path: Path, url: str, host: str) -> list[str]:
    return [a.format(url=url, host=host, tmp=tmp_path / "state") for a in template]


@pytest.mark.parametrize("where", sorted(ADDRESSES), ids=" ".join)
def test_a_remote_address_needs_the_opt_in(tmp_path: Path, where: tuple[str, str]) -> None:
    template, named = ADDRESSES[where]
    for host in (REMOTE_HOST, "0.0.0.0", "example.invalid"):
        r = run_cli(*_line(template, tmp_path, f"http://{host}:9090", host), cwd=tmp_path)
        assert r.rc == 2, (host, r.stderr)
        assert "Traceback" not in r.stderr
        (line,) = r.lines()
        assert named in line and "--allow-remote" in line and host in line, line
    assert not any((tmp_path / "reports").glob("*")), "nothing may start"


@pytest.mark.parametrize(
    "where", sorted(w for w, (t, _) in ADDRESSES.items() if "{url}" in t), ids=" ".join
)
def test_a_url_with_credentials_is_refused_and_not_printed(
    tmp_path: Path, where: tuple[str, str]
) -> None:
    template, named = ADDRESSES[where]
    for userinfo in (f"user:{SECRET}", SECRET, f":{SECRET}"):
        url = f"http://{userinfo}@127.0.0.1:9"
        r = run_cli(*_line(template, tmp_path, url, "127.0.0.1"), "--allow-remote", cwd=tmp_path)
        assert r.rc == 2, (url, r.stderr)
        (line,) = r.lines()
        assert named in line and "credentials in a URL are refused" in line, line
        assert SECRET not in r.stderr + r.stdout


def test_a_storage_url_never_prints_its_password(tmp_path: Path) -> None:
    r = run_cli(
        "apply", "--study", "s", "--storage", f"postgresql://u:{SECRET}@127.0.0.1:9/db",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.rc == 2, r.stderr
    assert len(r.lines()) == 1 and "--storage postgresql://***@127.0.0.1:9/db" in r.stderr
    assert SECRET not in r.stderr + r.stdout


def _cluster(tmp_path: Path, url: str, opt_in: bool) -> Path:
    path = tmp_path / "c.yaml"
    allow = "allow_remote: true\n" if opt_in else ""
    path.write_text(f"name: byo\n{allow}external:\n  - {{name: a, url: '{url}', models: [m]}}\n")
    return path


def test_a_cluster_files_external_replicas_need_the_opt_in(tmp_path: Path) -> None:
    for host in (REMOTE_HOST, "0.0.0.0", "gpu.example"):
        url = f"http://{host}:8000"
        with pytest.raises(ConfigError) as exc:
            load_config(_cluster(tmp_path, url, opt_in=False))
        assert host in str(exc.value) and "allow_remote: true" in str(exc.value)
        assert "\n" not in str(exc.value)
        load_config(_cluster(tmp_path, url, opt_in=True))  # the opt-in
    load_config(_cluster(tmp_path, "http://127.0.0.1:8000", opt_in=False))  # loopback
    for url in (f"http://u:{SECRET}@127.0.0.1:8000", f"http://{SECRET}@127.0.0.1:8000"):
        with pytest.raises(ConfigError, match="credentials in a URL are refused") as exc:
            load_config(_cluster(tmp_path, url, opt_in=True))
        assert SECRET not in str(exc.value)


def test_the_agents_prometheus_needs_the_opt_in() -> None:
    for host in (REMOTE_HOST, "0.0.0.0", "prom.example"):
        url = f"http://{host}:9090"
        with pytest.raises(ValueError, match="--allow-remote") as exc:
            AgentConfig(prometheus_url=url)
        assert host in str(exc.value)
        assert AgentConfig(prometheus_url=url, allow_remote=True).prometheus_url == url
    with pytest.raises(ValueError, match="credentials in a URL are refused") as exc:
        AgentConfig(prometheus_url=f"http://u:{SECRET}@127.0.0.1:9090", allow_remote=True)
    assert SECRET not in str(exc.value)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.7", False),
        ("localhost.example", False),
        ("127.0.0.1.example", False),
        ("", False),
    ],
)
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_userinfo_is_never_shown() -> None:
    assert without_userinfo(f"http://u:{SECRET}@h:1/x") == "http://***@h:1/x"
    assert without_userinfo("http://h:1/x") == "http://h:1/x"
    with pytest.raises(ConfigError) as exc:
        check_url(f"http://u:{SECRET}@h:1", "--x", allow_remote=True)
    assert SECRET not in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        check_url(f"ftp://u:{SECRET}@h:1", "--x", allow_remote=True)
    assert SECRET not in str(exc.value)
