"""Reading and writing per-request records (no Locust, no gevent here).

A :class:`~lbtune.records.requests.RequestRecord` crosses a file through one pydantic
``TypeAdapter`` (:data:`RECORD`), in both layouts:

* while a test runs, each generator process appends to its own ``records-<worker>.jsonl``:
  one header line (``{"lbtune_records": 2}``), then one JSON object per request, flushed
  about once a second, so a crash or Ctrl-C keeps what was measured; a remote worker ships
  these lines to the master as they are;
* after the run, :func:`finalize` merges every worker's file into ``requests.parquet``: one
  column per field (``chunk_times`` a ``list<double>``), rows dumped and validated by the
  same adapter.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from pydantic import TypeAdapter, ValidationError

from lbtune.errors import ConfigError
from lbtune.records.requests import RequestRecord
from lbtune.safety.files import MAX_TRACE_BYTES, open_regular, read_parquet

__all__ = [
    "FIELDS",
    "RECORD",
    "RecordWriter",
    "decode_line",
    "encode_record",
    "finalize",
    "is_header",
    "read_records",
    "write_parquet",
]

RECORD: TypeAdapter[RequestRecord] = TypeAdapter(RequestRecord)
"""The one (de)serializer of a record: JSON lines and Parquet rows."""
_RECORDS: TypeAdapter[list[RequestRecord]] = TypeAdapter(list[RequestRecord])
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RequestRecord))
VERSION = 2
"""Of the JSONL layout; version 1 (JSON arrays under a header naming the fields, base64
``chunk_times``) is no longer read: its files were merged into Parquet when their run ended."""
_HEADER = json.dumps({"lbtune_records": VERSION}) + "\n"


def encode_record(r: RequestRecord) -> str:
    """One JSONL line (with trailing newline)."""
    return RECORD.dump_json(r).decode() + "\n"


def is_header(line: str) -> bool:
    """A records file's first line, not a record."""
    return line.startswith('{"lbtune_records"')


def decode_line(line: str) -> RequestRecord:
    """The record of one JSONL line; a ConfigError when it is not one (or of a version-1 file)."""
    try:
        return RECORD.validate_json(line)
    except ValidationError as exc:
        why = exc.errors(include_url=False)[0]
        where = ".".join(str(x) for x in why["loc"])
        raise ConfigError(
            f"not an lbtune request record ({where}: {why['msg']}): {line[:80]!r}"
        ) from None


class RecordWriter:
    """Buffers encoded lines; :meth:`flush` appends them (call about once a second)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[str] = path.open("a", encoding="utf-8")
        if self._f.tell() == 0:
            self._f.write(_HEADER)
            self._f.flush()
        self._pending: list[str] = []
        self.count = 0

    def add(self, r: RequestRecord) -> None:
        self._pending.append(encode_record(r))
        self.count += 1

    def flush(self) -> None:
        if self._pending:
            lines, self._pending = self._pending, []
            self._f.write("".join(lines))
        self._f.flush()

    def close(self) -> None:
        self.flush()
        self._f.close()


def iter_jsonl(path: Path) -> Iterator[RequestRecord]:
    """Records of one JSONL file; a torn last line (crash mid-write) is skipped."""
    with open_regular(path, max_bytes=MAX_TRACE_BYTES) as raw:
        for line in io.TextIOWrapper(raw, encoding="utf-8"):
            if not line.endswith("\n"):
                break  # torn write
            if not is_header(line):
                yield decode_line(line)


def read_records(path: str | Path) -> list[RequestRecord]:
    """Records from ``requests.parquet``, one ``.jsonl`` file, or a records dir."""
    p = Path(path)
    if p.is_dir():
        if (p / "requests.parquet").exists():
            return read_records(p / "requests.parquet")
        out: list[RequestRecord] = []
        for f in sorted(p.glob("records-*.jsonl")):
            out.extend(iter_jsonl(f))
        out.sort(key=lambda r: r.sent_at)
        return out
    if p.suffix == ".jsonl":
        return list(iter_jsonl(p))
    table = read_parquet(p, max_bytes=MAX_TRACE_BYTES, what="a readable requests.parquet")
    missing = [f for f in _REQUIRED if f not in table.column_names]
    if missing:
        raise ConfigError(f"{p}: not lbtune's request records (no {', '.join(missing)} column)")
    known = [f for f in FIELDS if f in table.column_names]
    try:
        return _RECORDS.validate_python(table.select(known).to_pylist())
    except ValidationError as exc:
        raise ConfigError(
            f"{p}: not lbtune's request records ({exc.errors(include_url=False)[0]['msg']})"
        ) from None


_REQUIRED = ("request_id", "index", "model", "api", "stream", "sent_at", "ended_at", "outcome")
"""The columns without a default in :class:`RequestRecord`."""


def write_parquet(records: Iterable[RequestRecord], path: str | Path) -> Path:
    """Write records to Parquet; ``chunk_times`` is a list column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rs = list(records)
    types: dict[str, Any] = {
        "request_id": pa.string(),
        "index": pa.int64(),
        "model": pa.string(),
        "api": pa.string(),
        "stream": pa.bool_(),
        "sent_at": pa.float64(),
        "ended_at": pa.float64(),
        "outcome": pa.string(),
        "status_code": pa.int32(),
        "scheduled_at": pa.float64(),
        "headers_at": pa.float64(),
        "first_token_at": pa.float64(),
        "chunk_times": pa.list_(pa.float64()),
        "prompt_tokens": pa.int64(),
        "output_tokens": pa.int64(),
        "replica": pa.string(),
        "error": pa.string(),
        "priority": pa.int32(),
        "prefix_group": pa.int32(),
        "session_id": pa.int64(),
        "worker": pa.string(),
        "timing": pa.string(),
        "first_token_bound_s": pa.float64(),
        "send_bound_s": pa.float64(),
    }
    schema = pa.schema([(f, types[f]) for f in FIELDS])
    table = pa.Table.from_pylist(_RECORDS.dump_python(rs), schema=schema)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return out


def finalize(records_dir: str | Path) -> Path:
    """Merge every ``records-*.jsonl`` in ``records_dir`` into ``requests.parquet``."""
    d = Path(records_dir)
    rs: list[RequestRecord] = []
    for f in sorted(d.glob("records-*.jsonl")):
        rs.extend(iter_jsonl(f))
    rs.sort(key=lambda r: r.sent_at)
    return write_parquet(rs, d / "requests.parquet")
