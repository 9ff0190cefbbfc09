"""BurstGPT CSV: ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``.

``Timestamp`` is seconds from the trace's start; ``Model`` is kept as the request's model
when the scenario serves it (see :mod:`.replay`); a failed request's 0 response tokens
become ``max_tokens: 1``. Only the first four columns are required. Example::

    Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
    5,ChatGPT,472,18,490,Conversation log
    45,ChatGPT,1087,0,1087,Conversation log
"""

from __future__ import annotations

import csv
from pathlib import Path

from lbtune.scenario.traces.rows import (
    Monotonic,
    TraceRow,
    as_float,
    as_int,
    bad,
    require_columns,
)

COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")


def read(path: Path, shown: str) -> list[TraceRow]:
    rows: list[TraceRow] = []
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        require_columns(shown, header, COLUMNS)
        assert header is not None
        idx = {name.strip(): k for k, name in enumerate(header)}
        order = Monotonic(shown, "Timestamp")
        for cells in reader:
            line = reader.line_num
            if not cells or all(not c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise bad(shown, line, None, f"expected {len(header)} fields, found {len(cells)}")
            t = as_float(shown, line, "Timestamp", cells[idx["Timestamp"]])
            order.check(line, t)
            model = cells[idx["Model"]].strip()
            if not model:
                raise bad(shown, line, "Model", "empty model name")
            prompt = as_int(shown, line, "Request tokens", cells[idx["Request tokens"]], minimum=1)
            out = as_int(shown, line, "Response tokens", cells[idx["Response tokens"]])
            rows.append(
                TraceRow(
                    line=line, t=t, prompt_tokens=prompt, output_tokens=max(out, 1), model=model
                )
            )
    return rows
