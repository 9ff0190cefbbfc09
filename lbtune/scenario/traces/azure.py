"""Azure LLM inference trace CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``.

``TIMESTAMP`` is a date and time (``2023-11-16 18:15:46.6805900``, any number of
fractional digits, UTC) or a number of seconds. Example::

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,374,44
    2023-11-16 18:15:50.9951690,396,109
"""

from __future__ import annotations

import csv
import re
from datetime import UTC, datetime
from pathlib import Path

from lbtune.scenario.traces.rows import (
    Monotonic,
    TraceRow,
    as_float,
    as_int,
    bad,
    require_columns,
)

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_STAMP = re.compile(r"^\s*(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(\.\d+)?\s*(Z|[+-]00:?00)?\s*$")


def parse_time(path: str, line: int, column: str, raw: str) -> float:
    """Seconds since the epoch for a date-time stamp, or the number itself."""
    m = _STAMP.match(raw)
    if m is None:
        if re.match(r"^\s*[0-9.eE+-]+\s*$", raw):
            return as_float(path, line, column, raw)
        raise bad(path, line, column, f"expected a time like 2023-11-16 18:15:46.68, found {raw!r}")
    try:
        base = datetime.fromisoformat(f"{m.group(1)}T{m.group(2)}").replace(tzinfo=UTC)
    except ValueError:
        raise bad(path, line, column, f"not a valid date and time: {raw!r}") from None
    return base.timestamp() + (float(m.group(3)) if m.group(3) else 0.0)


def read(path: Path, shown: str) -> list[TraceRow]:
    rows: list[TraceRow] = []
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        require_columns(shown, header, COLUMNS)
        assert header is not None
        idx = {name.strip(): k for k, name in enumerate(header)}
        order = Monotonic(shown, "TIMESTAMP")
        for cells in reader:
            line = reader.line_num
            if not cells or all(not c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise bad(shown, line, None, f"expected {len(header)} fields, found {len(cells)}")
            t = parse_time(shown, line, "TIMESTAMP", cells[idx["TIMESTAMP"]])
            order.check(line, t)
            prompt = as_int(shown, line, "ContextTokens", cells[idx["ContextTokens"]], minimum=1)
            out = as_int(shown, line, "GeneratedTokens", cells[idx["GeneratedTokens"]])
            rows.append(TraceRow(line=line, t=t, prompt_tokens=prompt, output_tokens=max(out, 1)))
    return rows
