"""Whose SQLite file is it? lbtune writes only to its own studies database.

The studies database holds Optuna's tables and the history's (``lbtune_*``). A ``--storage``
(or history ``--storage``, or ``$LBTUNE_HISTORY_DB``) that names an existing file of another
kind, another program's SQLite database, a file that is not SQLite at all, a FIFO or a
device, is refused by :func:`check_studies_db` with one line, before anything opens it for
writing: it is read (its header, then its table names, read-only) and left untouched.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from pathlib import Path
from urllib.parse import quote

from lbtune.errors import ConfigError, printable
from lbtune.safety.files import kind_of

__all__ = ["HISTORY_TABLES", "OPTUNA_TABLES", "check_studies_db", "sqlite_file"]

OPTUNA_TABLES = frozenset(
    {
        "alembic_version",
        "studies",
        "study_directions",
        "study_system_attributes",
        "study_user_attributes",
        "trial_heartbeats",
        "trial_intermediate_values",
        "trial_params",
        "trial_system_attributes",
        "trial_user_attributes",
        "trial_values",
        "trials",
        "version_info",
    }
)
"""The tables of an Optuna (4, 5) RDB storage."""
HISTORY_TABLES = frozenset({"lbtune_meta", "lbtune_runs", "lbtune_figures"})
"""The history's tables (:mod:`lbtune.history.store`)."""
_HEADER = b"SQLite format 3\x00"


def sqlite_file(storage: str | Path) -> Path | None:
    """The file of a ``sqlite:///PATH`` storage URL, or of a plain path; ``None`` for any other
    database URL and for an in-memory SQLite."""
    text = str(storage)
    if text.startswith("sqlite:///"):
        file = text.removeprefix("sqlite:///").split("?", 1)[0]
        return None if file in ("", ":memory:") else Path(file)
    if "://" in text:
        return None
    return Path(text)


def check_studies_db(storage: str | Path, what: str = "--storage") -> None:
    """Refuse (ConfigError) an existing file at ``storage`` that is not lbtune's studies
    database: not a regular file, not SQLite, or holding a table that is neither Optuna's
    nor the history's. A missing or empty file is fine (lbtune creates it)."""
    path = sqlite_file(storage)
    if path is None:
        return
    shown = f"{what} {printable(str(path))}"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot be used ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{shown}: {kind_of(st.st_mode)}, not a database file")
    if st.st_size == 0:
        return
    try:
        with path.open("rb") as f:  # a regular file: a bounded read of its header
            head = f.read(len(_HEADER))
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot be read ({exc.strerror})") from None
    if head != _HEADER:
        raise ConfigError(
            f"{shown}: not a SQLite database; lbtune keeps its studies in a SQLite file of its "
            "own: give a new path"
        )
    foreign = sorted(_tables(path, shown) - OPTUNA_TABLES - HISTORY_TABLES)
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        names = ", ".join(printable(t) for t in foreign[:3])
        raise ConfigError(
            f"{shown}: the database of another program (tables {names}{more}); lbtune does "
            "not write into it: give a new path for its studies"
        )


def _tables(path: Path, shown: str) -> set[str]:
    """The table names of the SQLite file ``path``, read-only (``sqlite_*`` left out)."""
    uri = f"file:{quote(str(path.absolute()))}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=5.0)
    except sqlite3.Error as exc:
        raise ConfigError(f"{shown}: cannot be opened ({exc})") from None
    try:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    except sqlite3.Error as exc:
        raise ConfigError(f"{shown}: not a readable SQLite database ({exc})") from None
    finally:
        with contextlib.suppress(sqlite3.Error):
            conn.close()
    return {str(r[0]) for r in rows if not str(r[0]).startswith("sqlite_")}
