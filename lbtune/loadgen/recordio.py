"""Reading and writing per-request records (no Locust, no gevent here).

While a test runs, each generator process appends to its own
``records-<worker>.jsonl``: one header line naming the fields, then one JSON
array per request, flushed about once a second, so a crash or Ctrl-C keeps what
was measured. ``chunk_times`` is stored as base64 of little-endian float64 (far
cheaper to encode on the generator's hot path than a JSON list of floats).

After the run, :func:`finalize` merges every worker's file into
``requests.parquet`` (``chunk_times`` as a ``list<double>`` column).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import sys
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from lbtune.errors import ConfigError
from lbtune.loadgen.records import RequestRecord

__all__ = [
    "FIELDS",
    "RecordWriter",
    "decode_line",
    "encode_record",
    "finalize",
    "read_records",
    "write_parquet",
]

FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RequestRecord))
_CT = FIELDS.index("chunk_times")
_HEADER = {"lbtune_records": 1, "fields": list(FIELDS), "chunk_times": "b64-f64le"}
_LITTLE = sys.byteorder == "little"


def _pack_times(times: tuple[float, ...]) -> str:
    if not times:
        return ""
    a = array("d", times)
    if not _LITTLE:
        a.byteswap()
    return base64.b64encode(a.tobytes()).decode("ascii")


def _unpack_times(text: str) -> tuple[float, ...]:
    if not text:
        return ()
    a = array("d")
    a.frombytes(base64.b64decode(text))
    if not _LITTLE:
        a.byteswap()
    return tuple(a)


def encode_record(r: RequestRecord) -> str:
    """One JSONL line (with trailing newline)."""
    row: list[Any] = [getattr(r, f) for f in FIELDS]
    row[_CT] = _pack_times(r.chunk_times)
    return json.dumps(row, separators=(",", ":")) + "\n"


def decode_line(line: str, fields: tuple[str, ...] = FIELDS) -> RequestRecord:
    row = json.loads(line)
    kw = dict(zip(fields, row, strict=True))
    kw["chunk_times"] = _unpack_times(kw.get("chunk_times") or "")
    known = {k: v for k, v in kw.items() if k in FIELDS}
    return RequestRecord(**known)


class RecordWriter:
    """Buffers encoded lines; :meth:`flush` appends them (call about once a second)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[str] = path.open("a", encoding="utf-8")
        if self._f.tell() == 0:
            self._f.write(json.dumps(_HEADER) + "\n")
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
    fields = FIELDS
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f):
            if not line.endswith("\n"):
                break  # torn write
            if n == 0 and line.startswith("{"):
                fields = tuple(json.loads(line)["fields"])
                continue
            yield decode_line(line, fields)


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
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p)
    except (OSError, ValueError, pa.ArrowException) as exc:  # missing, truncated, not Parquet
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{p}: not a readable requests.parquet ({why})") from None
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    missing = [f for f in _REQUIRED if f not in cols]
    if missing:
        raise ConfigError(f"{p}: not lbtune's request records (no {', '.join(missing)} column)")
    n = table.num_rows
    names = [f for f in FIELDS if f in cols]
    records = []
    for i in range(n):
        kw = {f: cols[f][i] for f in names}
        kw["chunk_times"] = tuple(kw.get("chunk_times") or ())
        records.append(RequestRecord(**kw))
    return records


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
    }
    arrays = {}
    for f in FIELDS:
        vals = [getattr(r, f) for r in rs]
        if f == "chunk_times":
            vals = [list(v) for v in vals]
        arrays[f] = pa.array(vals, type=types.get(f))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(arrays), out)
    return out


def finalize(records_dir: str | Path) -> Path:
    """Merge every ``records-*.jsonl`` in ``records_dir`` into ``requests.parquet``."""
    d = Path(records_dir)
    rs: list[RequestRecord] = []
    for f in sorted(d.glob("records-*.jsonl")):
        rs.extend(iter_jsonl(f))
    rs.sort(key=lambda r: r.sent_at)
    return write_parquet(rs, d / "requests.parquet")
