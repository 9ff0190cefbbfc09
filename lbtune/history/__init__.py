"""History: every stress run and study indexed next to the Optuna studies, and drift.

``run_stress`` (when it writes a report) and ``run_optimize`` call :func:`index_stress` /
:func:`index_study` as their last step; a failure to index is a warning, never a failed
run. The index lives in the same SQLite file as the studies (``reports/studies.db`` by
default; see :func:`db_path`), in lbtune's own ``lbtune_*`` tables
(:mod:`lbtune.history.store`). :mod:`lbtune.history.drift` flags when the live config
measures significantly worse than the last accepted one. Importing this package is light.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lbtune.optimize import OptimizeOptions
    from lbtune.search.result import StudyResult
    from lbtune.stress import StressOptions, StressResult

__all__ = ["DEFAULT_STORAGE", "ENV_DB", "db_path", "index_stress", "index_study"]

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


def index_stress(opts: StressOptions, result: StressResult) -> None:
    """Index one stress run (its report was written); warn instead of failing."""
    try:
        from lbtune.history.index import stress_entry
        from lbtune.history.store import HistoryStore

        path = db_path(reports_root=opts.reports_root)
        if path is not None:
            entry = HistoryStore(path).add(stress_entry(opts, result))
            log.debug("history: indexed stress run %s in %s", entry.id, path)
    except Exception as exc:
        log.warning("history: this run was not indexed (%s: %s)", type(exc).__name__, exc)


def index_study(opts: OptimizeOptions, result: StudyResult) -> None:
    """Index one study; warn instead of failing."""
    try:
        from lbtune.history.index import study_entry
        from lbtune.history.store import HistoryStore

        path = db_path(opts.storage, opts.reports_root)
        if path is not None:
            entry = HistoryStore(path).add(study_entry(opts, result))
            log.debug("history: indexed study %s as %s in %s", result.study, entry.id, path)
    except Exception as exc:
        log.warning("history: this study was not indexed (%s: %s)", type(exc).__name__, exc)
