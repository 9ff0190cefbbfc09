"""History: every stress run and study indexed next to the Optuna studies, and drift.

The callers of ``run_stress`` and ``run_optimize`` (the CLI, :mod:`lbtune.cli.ci`) index what
they ran with :func:`add_entry` (the entries are made by :mod:`lbtune.history.index`:
:func:`lbtune.run.stress.record_stress`, :func:`lbtune.tune.optimize.record_study`); a failure to
index is a warning, never a failed run. The index lives in the same SQLite file as the
studies (``reports/studies.db`` by default; see :func:`db_path`), in lbtune's own
``lbtune_*`` tables (:mod:`lbtune.history.store`). :mod:`lbtune.history.drift` flags when
the live config measures significantly worse than the last accepted one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from lbtune.history.store import Entry, HistoryStore

__all__ = ["DEFAULT_STORAGE", "ENV_DB", "add_entry", "db_path"]

log = logging.getLogger(__name__)

ENV_DB = "LBTUNE_HISTORY_DB"
"""Overrides where the index is written and read (tests and CI point it elsewhere)."""
DEFAULT_STORAGE = "sqlite:///reports/studies.db"


def db_path(
    storage: str | None = None, reports_root: Path | None = None, *, use_env: bool = True
) -> Path | None:
    """The history database: ``$LBTUNE_HISTORY_DB`` (unless ``use_env`` is false), else the
    file of a ``sqlite:///`` study storage, else ``<reports_root>/studies.db`` (also for a
    non-SQLite study storage, whose history then stays local). ``None`` for an in-memory
    SQLite storage: nothing to keep."""
    env = os.environ.get(ENV_DB) if use_env else None
    if env:
        return Path(env)
    if storage is not None and storage.startswith("sqlite:///"):
        file = storage.removeprefix("sqlite:///").split("?", 1)[0]
        return None if file in ("", ":memory:") else Path(file)
    return (reports_root if reports_root is not None else Path("reports")) / "studies.db"


def add_entry(path: Path | None, entry: Callable[[], Entry], what: str) -> None:
    """Add ``entry()`` to the index at ``path`` (None: nothing to keep); ``what`` names it
    in the log. Any failure, making the entry included, is a warning, never an error.
    (Not named ``index``: that is the submodule :mod:`lbtune.history.index`, whose import
    rebinds the package attribute.)"""
    if path is None:
        return
    try:
        added = HistoryStore(path).add(entry())
        log.debug("history: indexed %s as %s in %s", what, added.id, path)
    except Exception as exc:
        log.warning("history: %s was not indexed (%s: %s)", what, type(exc).__name__, exc)
