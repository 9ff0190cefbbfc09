"""Where lbtune finds real vLLM's virtualenv and the tiny model's training text: the env var,
the state root, a checkout's ``.venv-vllm``, package data. No vLLM needed: fake venvs."""

from __future__ import annotations

import json
import os
import stat
from importlib.resources import files
from pathlib import Path

import pytest

import lbtune
from lbtune.cluster import vllm, vllm_model
from lbtune.cluster.config import load_config, parse_config
from lbtune.errors import DependencyError


def fake_venv(path: Path, builder: str = "") -> Path:
    """A directory that looks like a finished ``scripts/setup-vllm.sh`` install; its
    ``bin/python`` is a shell script running ``builder`` (a model builder stand-in)."""
    (path / "bin").mkdir(parents=True)
    python = path / "bin" / "python"
    python.write_text(f"#!/bin/sh\n{builder}\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    (path / ".lbtune-vllm-0.32.0").touch()
    return path


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty state root, no ``LBTUNE_VLLM_VENV``."""
    monkeypatch.delenv("LBTUNE_VLLM_VENV", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "lbtune"


def test_the_env_var_wins_even_without_an_install(
    state_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_venv(state_home / vllm.STATE_VENV)
    monkeypatch.setenv("LBTUNE_VLLM_VENV", str(tmp_path / "mine"))
    assert vllm.venv_candidates() == [tmp_path / "mine"]
    assert vllm.venv() == tmp_path / "mine" and not vllm.installed()
    fake_venv(tmp_path / "mine")
    assert vllm.installed() and vllm.venv_python() == tmp_path / "mine" / "bin" / "python"


def test_the_state_root_comes_before_the_checkout(
    state_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = tmp_path / "checkout"
    monkeypatch.setattr(vllm, "checkout_root", lambda: checkout)
    fake_venv(checkout / vllm.CHECKOUT_VENV)
    assert vllm.venv_candidates() == [state_home / vllm.STATE_VENV, checkout / ".venv-vllm"]
    assert vllm.venv() == checkout / ".venv-vllm" and vllm.installed()
    fake_venv(state_home / vllm.STATE_VENV)
    assert vllm.venv() == state_home / "vllm-venv"


def test_this_checkout_is_found_and_a_wheel_install_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = Path(lbtune.__file__).resolve().parent.parent
    assert vllm.checkout_root() == root and (root / "scripts" / "setup-vllm.sh").is_file()
    site = tmp_path / "site-packages" / "lbtune"
    site.mkdir(parents=True)
    monkeypatch.setattr(lbtune, "__file__", str(site / "__init__.py"))
    assert vllm.checkout_root() is None


def test_nothing_installed_is_one_line_that_says_how(
    state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm, "checkout_root", lambda: None)
    assert vllm.venv() == state_home / "vllm-venv" and not vllm.installed()
    with pytest.raises(DependencyError) as err:
        vllm.require_installed()
    msg = str(err.value)
    assert "\n" not in msg and str(state_home / "vllm-venv") in msg
    assert "scripts/setup-vllm.sh" in msg and "LBTUNE_VLLM_VENV" in msg


def test_the_training_text_is_package_data() -> None:
    corpus = files("lbtune").joinpath(*vllm.CORPUS)
    assert corpus.is_file() and len(corpus.read_text(encoding="utf-8")) > 50_000
    # the builder (run by path, without lbtune importable) finds no data of its own: it is
    # given this file (test below) and refuses to run without one
    assert vllm_model.main([str(Path("/nonexistent/out"))]) == 2


def test_ensure_model_builds_once_from_the_packaged_text(
    state_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the stand-in builder records its argv and writes the finished-build marker
    builder = 'mkdir -p "$2" && printf "%s\\n" "$@" > "$2/argv" && echo {} > "$2/lbtune-model.json"'
    monkeypatch.setenv("LBTUNE_VLLM_VENV", str(fake_venv(tmp_path / "venv", builder)))
    out = tmp_path / "models" / "tiny"
    assert vllm.ensure_model(out) == out
    argv = (out / "argv").read_text().split("\n")
    assert argv[0] == str(vllm.MODEL_BUILDER) and argv[1] == str(out)
    assert Path(argv[2]).read_text(encoding="utf-8") == (
        files("lbtune").joinpath(*vllm.CORPUS).read_text(encoding="utf-8")
    )
    (out / "argv").unlink()
    assert vllm.ensure_model(out) == out and not (out / "argv").exists()  # built already
    assert json.loads((out / vllm.DONE_MARKER).read_text()) == {}


def test_the_rest_of_the_cluster_runs_off_the_servers_cpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    said: list[str] = []
    cfg = parse_config({"name": "v", "ports": "auto", "vllm": {"cpus": [1]}}, "test")
    assert vllm.other_cpus(cfg, said.append) == frozenset({0})
    assert said == [
        "the balancer, Prometheus and the keeper will run on CPUs [0], off the vLLM servers' [1]"
    ]


def test_with_no_cpu_left_nothing_is_pinned_and_that_is_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    said: list[str] = []
    cfg = parse_config({"name": "v", "ports": "auto", "vllm": {"cpus": [0]}}, "test")
    assert vllm.other_cpus(cfg, said.append) is None
    assert len(said) == 1 and "leave no other CPU" in said[0] and "unpinned" in said[0]


def test_a_cluster_without_pinned_servers_pins_nothing_and_says_nothing() -> None:
    said: list[str] = []
    assert vllm.other_cpus(load_config("mini2")[0], said.append) is None
    assert said == []
