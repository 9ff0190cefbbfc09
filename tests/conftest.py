"""Fixtures shared by every test package: real clusters on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lbtune.cluster.resolve import PORTS_ENV
from tests import workers

M8 = "llama-3.1-8b-instruct"
M70 = "llama-3.1-70b-instruct-awq"


@pytest.fixture(autouse=True, scope="session")
def _history_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Runs the tests index go to a temporary history database, not ./reports/studies.db."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LBTUNE_HISTORY_DB", str(tmp_path_factory.mktemp("history") / "studies.db"))
        yield


def pytest_configure(config: pytest.Config) -> None:
    """On an xdist worker: its own range of loopback ports (``$LBTUNE_PORTS``, inherited by
    the processes its tests start), from :func:`tests.workers.port_range`."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None or os.environ.get(PORTS_ENV):
        return
    span = workers.port_range(worker, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    if span is not None:
        os.environ[PORTS_ENV] = span


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` (scripts/test.sh): the units of :mod:`tests.workers`."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return workers.scheduler(config, log)


def have_cluster_binaries() -> bool:
    return shutil.which("haproxy") is not None and shutil.which("prometheus") is not None


@contextlib.contextmanager
def running_cluster(state_dir: Path, preset: str = "mini2", **updates: Any) -> Iterator[Any]:
    """Bring a preset cluster up in ``state_dir`` (ports: auto), yield its Endpoints, take it down.

    ``updates`` override top-level fields of the preset (e.g. ``time_scale=8``).
    """
    from lbtune.cluster import api
    from lbtune.cluster.config import load_config

    if not have_cluster_binaries():
        pytest.fail("haproxy and prometheus are needed: run scripts/setup.sh")
    cfg, _ = load_config(preset)
    if updates:
        cfg = cfg.model_copy(update=updates)
    try:
        yield api.up(cfg, state_dir)
    finally:
        api.down(state_dir)
