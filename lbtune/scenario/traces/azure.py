"""Azure LLM inference trace CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``.

``TIMESTAMP`` is a date and time (``2023-11-16 18:15:46.6805900``, any number of
fractional digits, UTC) or a number of seconds. Example::

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,374,44
    2023-11-16 18:15:50.9951690,396,109
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from lbtune.scenario.traces.csvfile import CsvLine, read_csv
from lbtune.scenario.traces.rows import TraceRow, as_float, bad

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


def _row(c: CsvLine) -> TraceRow:
    prompt = c.whole("ContextTokens", minimum=1)
    out = c.whole("GeneratedTokens")
    return TraceRow(line=c.line, t=c.t, prompt_tokens=prompt, output_tokens=max(out, 1))


def read(path: Path, shown: str) -> list[TraceRow]:
    return read_csv(path, shown, COLUMNS, "TIMESTAMP", _row, parse_time)
