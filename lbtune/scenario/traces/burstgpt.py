"""BurstGPT CSV: ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``.

``Timestamp`` is seconds from the trace's start; ``Model`` is kept as the request's model
when the scenario serves it (see :mod:`.replay`); a failed request's 0 response tokens
become ``max_tokens: 1``. Only the first four columns are required. Example::

    Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
    5,ChatGPT,472,18,490,Conversation log
    45,ChatGPT,1087,0,1087,Conversation log
"""

from __future__ import annotations

from pathlib import Path

from lbtune.scenario.traces.csvfile import CsvLine, read_csv
from lbtune.scenario.traces.rows import TraceRow, bad

COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")


def _row(c: CsvLine) -> TraceRow:
    model = c.cell("Model").strip()
    if not model:
        raise bad(c.shown, c.line, "Model", "empty model name")
    prompt = c.whole("Request tokens", minimum=1)
    out = c.whole("Response tokens")
    return TraceRow(
        line=c.line, t=c.t, prompt_tokens=prompt, output_tokens=max(out, 1), model=model
    )


def read(path: Path, shown: str) -> list[TraceRow]:
    return read_csv(path, shown, COLUMNS, "Timestamp", _row)
