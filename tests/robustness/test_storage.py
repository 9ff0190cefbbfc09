"""Defects 5 (storage part) and 12 of issue 16: a bad ``--storage`` is one line, exit 2,
and a mistyped sqlite path creates no directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from lbtune.errors import ConfigError
from tests.robustness.conftest import run_cli


def test_a_sqlite_path_in_a_missing_directory_is_refused_not_created(tmp_path: Path) -> None:
    from lbtune.search.study import sqlite_dir

    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(ConfigError, match="does not exist"):
        sqlite_dir(f"sqlite:///{missing}/x.db")
    assert not (tmp_path / "no").exists()
    sqlite_dir(f"sqlite:///{tmp_path}/x.db")  # an existing directory is fine


def test_the_default_storage_directory_is_still_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lbtune.search.study import DEFAULT_STORAGE, sqlite_dir

    monkeypatch.chdir(tmp_path)
    sqlite_dir(DEFAULT_STORAGE)
    assert (tmp_path / "reports").is_dir()


@pytest.mark.parametrize(
    ("storage", "says"),
    [
        ("sqlite:////nonexistent-lbtune/dir/x.db", "does not exist"),
        ("postgresql://u@127.0.0.1/db", "driver is not installed"),
        ("mysql://u@127.0.0.1/db", "driver is not installed"),
        ("foo://x", "not a database URL"),
        ("not a url", "not a database URL"),
    ],
)
def test_a_bad_storage_is_one_line(tmp_path: Path, storage: str, says: str) -> None:
    r = run_cli(
        "optimize",
        "--storage",
        storage,
        "--resume",
        "--budget",
        "2",
        "--state-dir",
        str(tmp_path / "state"),
        cwd=tmp_path,
    )
    assert r.rc == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.lines()) == 1 and says in r.stderr, r.stderr
    assert not Path("/nonexistent-lbtune").exists()
