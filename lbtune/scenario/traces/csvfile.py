"""The reader every CSV trace format shares: header, blank lines, field counts, time order.

A format names its required columns and its time column, and turns one line into a
:class:`~lbtune.scenario.traces.rows.TraceRow` (:data:`RowParser`); errors name the
file, line and column (:func:`~lbtune.scenario.traces.rows.bad`).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lbtune.scenario.traces.rows import (
    Monotonic,
    TraceRow,
    as_float,
    as_int,
    bad,
    check_count,
    open_text,
    require_columns,
)

__all__ = ["CsvLine", "RowParser", "TimeParser", "read_csv"]

TimeParser = Callable[[str, int, str, str], float]
"""(shown path, line, column, raw cell) -> seconds."""


@dataclass(frozen=True, slots=True)
class CsvLine:
    """One data line of a CSV trace, its time already parsed and checked for order."""

    shown: str
    line: int
    t: float
    cells: list[str]
    index: dict[str, int]

    def cell(self, column: str) -> str:
        return self.cells[self.index[column]]

    def whole(self, column: str, *, minimum: int = 0) -> int:
        """The column's whole number (>= ``minimum``), else a ConfigError naming it."""
        return as_int(self.shown, self.line, column, self.cell(column), minimum=minimum)


RowParser = Callable[[CsvLine], TraceRow]


def read_csv(
    path: Path,
    shown: str,
    columns: tuple[str, ...],
    time_column: str,
    parse_row: RowParser,
    parse_time: TimeParser = as_float,
) -> list[TraceRow]:
    """Every data line of the CSV file ``path`` (``shown`` in errors), parsed by ``parse_row``."""
    rows: list[TraceRow] = []
    with open_text(path, shown, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        require_columns(shown, header, columns)
        assert header is not None
        index = {name.strip(): k for k, name in enumerate(header)}
        order = Monotonic(shown, time_column)
        for cells in reader:
            line = reader.line_num
            if not cells or all(not c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise bad(shown, line, None, f"expected {len(header)} fields, found {len(cells)}")
            t = parse_time(shown, line, time_column, cells[index[time_column]])
            order.check(line, t)
            rows.append(parse_row(CsvLine(shown, line, t, cells, index)))
            check_count(shown, line, len(rows))
    return rows
