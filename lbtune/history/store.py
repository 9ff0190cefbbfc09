"""The history index: lbtune's own tables in the SQLite file that holds the Optuna studies.

One row per stress run or study in ``lbtune_runs``; its key figures in ``lbtune_figures``,
one row per *role*:

* ``run`` — a stress run's figures (its report directory holds ``requests.parquet``);
* ``baseline`` — a study's live configuration, measured as its baseline trial (trial 0);
* ``winner`` — the confirmed winner's pooled confirmation figures;
* ``verification`` — the winner measured live after the rollout.

``lbtune_meta`` holds ``schema_version``. Tables are created when missing; a file written
by a newer lbtune (a higher version) is refused rather than misread, and so is a file that
is not lbtune's studies database (:mod:`lbtune.history.dbfile`: another program's tables
are never joined by lbtune's). Optuna ignores tables it does not own, and lbtune never
touches Optuna's.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import TypeAdapter

from lbtune.errors import ConfigError
from lbtune.history.dbfile import check_studies_db
from lbtune.records.jsonform import key_order

__all__ = ["ENTRY", "SCHEMA_VERSION", "Entry", "HistoryStore", "KeyFigures", "Role"]

SCHEMA_VERSION = 1
Role = Literal["run", "baseline", "winner", "verification"]
Kind = Literal["stress", "study"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS lbtune_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS lbtune_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL CHECK (kind IN ('stress', 'study')),
    time REAL NOT NULL,
    scenario TEXT NOT NULL,
    target TEXT NOT NULL,
    study TEXT,
    report_dir TEXT,
    config_hash TEXT,
    params TEXT,
    load TEXT,
    verdict TEXT,
    accepted INTEGER,
    baseline_trial INTEGER,
    winner_trial INTEGER,
    lbtune_version TEXT
);
CREATE INDEX IF NOT EXISTS lbtune_runs_scenario_time ON lbtune_runs (scenario, time);
CREATE TABLE IF NOT EXISTS lbtune_figures (
    run_id INTEGER NOT NULL REFERENCES lbtune_runs (id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    p99_e2e_s REAL,
    p50_ttft_s REAL,
    p99_ttft_s REAL,
    requests_per_s REAL,
    output_tokens_per_s REAL,
    goodput_per_s REAL,
    error_rate REAL,
    degraded INTEGER,
    completed INTEGER,
    records_dir TEXT,
    window_start_s REAL,
    window_end_s REAL,
    PRIMARY KEY (run_id, role)
);
"""


@dataclass(frozen=True)
class KeyFigures:
    """The figures history keeps of one measurement (seconds, fractions, per second)."""

    p99_e2e_s: float | None = None
    p50_ttft_s: float | None = None
    p99_ttft_s: float | None = None
    requests_per_s: float | None = None
    output_tokens_per_s: float | None = None
    goodput_per_s: float | None = None
    error_rate: float | None = None
    degraded: bool | None = None
    """The load generator fell behind (``None``: not known, e.g. a study's trials)."""
    completed: int | None = None
    records_dir: str | None = None
    """Where this measurement's ``requests.parquet`` was written."""
    window_start_s: float | None = None
    """Measurement window, seconds after the first request was sent."""
    window_end_s: float | None = None


@dataclass(frozen=True)
class Entry:
    """One indexed stress run or study (in JSON, :data:`ENTRY`: its ``figures`` last)."""

    kind: Kind
    time: float
    """Unix time the run (or this invocation of the study) started."""
    scenario: str
    target: str
    """A stress run's balancer URL; a study's target name (``haproxy``...)."""
    report_dir: str | None = None
    study: str | None = None
    config_hash: str | None = None
    """sha256 of the canonical JSON of ``params`` (the balancer config), when known."""
    params: Mapping[str, Any] | None = None
    """Balancer parameters: a study's accepted (or kept) config; a stress run's last known good."""
    load: Mapping[str, Any] = field(default_factory=dict)
    """How it was loaded: duration_s, users, rate, seed."""
    verdict: str | None = None
    accepted: bool | None = None
    """Studies: a winner was rolled out and verified (``None`` for stress runs)."""
    baseline_trial: int | None = None
    winner_trial: int | None = None
    figures: Mapping[str, KeyFigures] = field(default_factory=dict)
    """By role: ``run``, ``baseline``, ``winner``, ``verification``."""
    lbtune_version: str = ""
    id: int | None = None

    # JSON quirk kept from the hand-written form: ``figures`` last, after ``id``.
    _json = key_order(last=("figures",))

    @property
    def current(self) -> KeyFigures | None:
        """What this entry measured of the live config: ``run`` or a study's ``baseline``."""
        return self.figures.get("run") or self.figures.get("baseline")

    @property
    def reference(self) -> KeyFigures | None:
        """An accepted study's figures of the config it rolled out."""
        if not self.accepted:
            return None
        return self.figures.get("verification") or self.figures.get("winner")


ENTRY: TypeAdapter[Entry] = TypeAdapter(Entry)
"""An entry to its JSON form (``lbtune history --json``)."""


_RUN_COLS = (
    "kind",
    "time",
    "scenario",
    "target",
    "study",
    "report_dir",
    "config_hash",
    "params",
    "load",
    "verdict",
    "accepted",
    "baseline_trial",
    "winner_trial",
    "lbtune_version",
)
_FIG_COLS = tuple(f.name for f in fields(KeyFigures))


class HistoryStore:
    """``HistoryStore(path)``: add and list entries in the SQLite file at ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @contextmanager
    def _connect(self, create: bool) -> Iterator[sqlite3.Connection]:
        check_studies_db(self.path, "the history database")  # another program's: untouched
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        elif not self.path.exists():
            raise ConfigError(
                f"history: no database at {self.path}; run `lbtune stress` or `lbtune optimize` "
                "first, or point --storage at the studies database"
            )
        try:
            conn = sqlite3.connect(self.path, timeout=30.0)
        except sqlite3.Error as exc:
            raise ConfigError(f"history: cannot open {self.path}: {exc}") from None
        with closing(conn):
            conn.execute("PRAGMA foreign_keys = ON")
            self._migrate(conn)
            with conn:  # one transaction
                yield conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.executescript(_SCHEMA)
        row = conn.execute("SELECT value FROM lbtune_meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            conn.execute(
                "INSERT INTO lbtune_meta (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
            conn.commit()
        elif int(row[0]) > SCHEMA_VERSION:
            raise ConfigError(
                f"history: {self.path} has schema version {row[0]}, this lbtune reads up to "
                f"{SCHEMA_VERSION}: upgrade lbtune"
            )

    def add(self, entry: Entry) -> Entry:
        """Insert ``entry``; a study indexed again (``--resume``) replaces its older row."""
        with self._connect(create=True) as conn:
            if entry.kind == "study" and entry.study is not None:
                old = conn.execute(
                    "SELECT id, time FROM lbtune_runs WHERE kind = 'study' AND study = ?",
                    (entry.study,),
                ).fetchall()
                if old:
                    entry = replace(entry, time=min([entry.time, *(t for _, t in old)]))
                    conn.executemany("DELETE FROM lbtune_runs WHERE id = ?", [(i,) for i, _ in old])
            values = [getattr(entry, c) for c in _RUN_COLS]
            values[_RUN_COLS.index("params")] = _json(entry.params)
            values[_RUN_COLS.index("load")] = _json(entry.load)
            values[_RUN_COLS.index("accepted")] = _bool(entry.accepted)
            cur = conn.execute(
                f"INSERT INTO lbtune_runs ({', '.join(_RUN_COLS)}) "
                f"VALUES ({', '.join('?' * len(_RUN_COLS))})",
                values,
            )
            run_id = cur.lastrowid
            for role, fig in entry.figures.items():
                fv = [getattr(fig, c) for c in _FIG_COLS]
                fv[_FIG_COLS.index("degraded")] = _bool(fig.degraded)
                conn.execute(
                    f"INSERT INTO lbtune_figures (run_id, role, {', '.join(_FIG_COLS)}) "
                    f"VALUES (?, ?, {', '.join('?' * len(_FIG_COLS))})",
                    [run_id, role, *fv],
                )
        return replace(entry, id=run_id)

    def entries(self, scenario: str | None = None, last: int | None = None) -> list[Entry]:
        """Entries oldest first (the newest ``last`` of them), of one scenario if given."""
        where, args = ("WHERE scenario = ?", [scenario]) if scenario else ("", [])
        limit = f"LIMIT {int(last)}" if last is not None and last > 0 else ""
        with self._connect(create=False) as conn:
            rows = conn.execute(
                f"SELECT id, {', '.join(_RUN_COLS)} FROM lbtune_runs {where} "
                f"ORDER BY time DESC, id DESC {limit}",
                args,
            ).fetchall()
            ids = [r[0] for r in rows]
            figs: dict[int, dict[str, KeyFigures]] = {i: {} for i in ids}
            if ids:
                marks = ", ".join("?" * len(ids))
                for fr in conn.execute(
                    f"SELECT run_id, role, {', '.join(_FIG_COLS)} FROM lbtune_figures "
                    f"WHERE run_id IN ({marks})",
                    ids,
                ):
                    data = dict(zip(_FIG_COLS, fr[2:], strict=True))
                    data["degraded"] = None if data["degraded"] is None else bool(data["degraded"])
                    figs[fr[0]][fr[1]] = KeyFigures(**data)
        out = [_entry(r, figs[r[0]]) for r in rows]
        out.reverse()
        return out

    def scenarios(self) -> list[str]:
        with self._connect(create=False) as conn:
            rows = conn.execute("SELECT DISTINCT scenario FROM lbtune_runs ORDER BY scenario")
            return [r[0] for r in rows]


def _entry(row: Sequence[Any], figs: Mapping[str, KeyFigures]) -> Entry:
    data = dict(zip(_RUN_COLS, row[1:], strict=True))
    data["params"] = None if data["params"] is None else json.loads(data["params"])
    data["load"] = json.loads(data["load"]) if data["load"] else {}
    data["accepted"] = None if data["accepted"] is None else bool(data["accepted"])
    data["lbtune_version"] = data["lbtune_version"] or ""
    return Entry(id=row[0], figures=dict(figs), **data)


def _json(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(dict(value), sort_keys=True, default=str)


def _bool(value: bool | None) -> int | None:
    return None if value is None else int(value)
