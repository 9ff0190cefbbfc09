"""lbtune's own ``requests.parquet``: replay a previous run.

Every record gives a send time (``scheduled_at``, or ``sent_at`` in closed loop), the
model, API, streaming, prompt and output lengths. When the run's ``run.json`` lies beside
the file, each request is rebuilt from the recorded scenario and seed (the same prompts,
``max_tokens`` and order); otherwise prompts are synthesized to the recorded lengths and
the answer lengths received become ``max_tokens``. Example::

    lbtune stress --trace reports/2026-12-01-chat/requests.parquet --trace-format lbtune
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from lbtune.errors import ConfigError
from lbtune.scenario.traces.rows import TraceRow, bad

REQUIRED = ("index", "sent_at", "prompt_tokens", "output_tokens")


def read(path: Path, shown: str) -> list[TraceRow]:
    import pyarrow.parquet as pq  # lazily: only this format needs it

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid and OSError subclasses
        raise ConfigError(f"{shown}: not a Parquet file ({exc})") from None
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    missing = [c for c in REQUIRED if c not in cols]
    if missing:
        raise bad(shown, 1, missing[0], f"missing column (need {', '.join(REQUIRED)})")
    exact = recorded_run(path) is not None
    n = table.num_rows

    def col(name: str, i: int) -> Any:
        values = cols.get(name)
        return None if values is None else values[i]

    rows: list[TraceRow] = []
    for i in range(n):
        line = i + 1
        when = col("scheduled_at", i)
        if when is None:
            when = col("sent_at", i)
        if not isinstance(when, float | int) or not math.isfinite(when):
            raise bad(shown, line, "sent_at", f"expected a time, found {when!r}")
        prompt = col("prompt_tokens", i)
        if not exact and (not isinstance(prompt, int) or prompt < 1):
            raise bad(shown, line, "prompt_tokens", f"expected a length >= 1, found {prompt!r}")
        out = col("output_tokens", i)
        index = col("index", i)
        if not isinstance(index, int) or index < 0:
            raise bad(shown, line, "index", f"expected a request index >= 0, found {index!r}")
        rows.append(
            TraceRow(
                line=line,
                t=float(when),
                prompt_tokens=int(prompt or 1),
                output_tokens=max(int(out or 1), 1),
                model=col("model", i),
                replay=index,
                api=col("api", i),
                stream=col("stream", i),
                prefix_group=col("prefix_group", i),
                session=col("session_id", i),
            )
        )
    rows.sort(key=lambda r: (r.t or 0.0, r.replay or 0))  # records are in send order
    return rows


def recorded_run(path: Path) -> tuple[dict[str, Any], int, str | None] | None:
    """``(scenario document, seed, tokenizer)`` from the ``run.json`` beside ``path``."""
    plan = path.parent / "run.json"
    if not plan.is_file():
        return None
    try:
        data = json.loads(plan.read_text(encoding="utf-8"))
        return dict(data["scenario"]), int(data["seed"]), data.get("tokenizer")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{plan}: not a readable run plan ({exc})") from None
