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
from pathlib import Path
from typing import Any

from lbtune.errors import ConfigError
from lbtune.safety.files import MAX_REPORT_BYTES, MAX_TRACE_BYTES, read_bytes, read_parquet
from lbtune.scenario.limits import MAX_TOKENS, MAX_TRACE_ROWS, MAX_TRACE_TIME_S
from lbtune.scenario.traces.rows import TraceRow, bad

_INT64 = 2**63 - 1

REQUIRED = ("index", "sent_at", "prompt_tokens", "output_tokens")


def read(path: Path, shown: str) -> list[TraceRow]:
    table = read_parquet(path, shown, max_bytes=MAX_TRACE_BYTES, what="a Parquet file")
    if table.num_rows > MAX_TRACE_ROWS:
        raise bad(shown, 1, None, f"more than {MAX_TRACE_ROWS} requests in one trace")
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
        if not isinstance(when, float | int) or not abs(when) <= MAX_TRACE_TIME_S:
            raise bad(shown, line, "sent_at", f"expected a time, found {when!r}")
        prompt = col("prompt_tokens", i)
        if not exact and (not isinstance(prompt, int) or not 1 <= prompt <= MAX_TOKENS):
            raise bad(
                shown, line, "prompt_tokens", f"expected a length 1..{MAX_TOKENS}, found {prompt!r}"
            )
        out = col("output_tokens", i)
        if out is not None and (not isinstance(out, int) or not 0 <= out <= MAX_TOKENS):
            raise bad(
                shown, line, "output_tokens", f"expected a length 0..{MAX_TOKENS}, found {out!r}"
            )
        index = col("index", i)
        if not isinstance(index, int) or not 0 <= index <= _INT64:
            raise bad(shown, line, "index", f"expected a request index >= 0, found {index!r}")
        _check_ints(shown, line, {k: col(k, i) for k in ("prefix_group", "session_id")})
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


def _check_ints(shown: str, line: int, values: dict[str, Any]) -> None:
    for name, v in values.items():
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or abs(v) > _INT64):
            raise bad(shown, line, name, f"expected an integer, found {v!r}")


def recorded_run(path: Path) -> tuple[dict[str, Any], int, str | None] | None:
    """``(scenario document, seed, tokenizer)`` from the ``run.json`` beside ``path``."""
    plan = path.parent / "run.json"
    if not plan.is_file():
        return None
    try:
        data = json.loads(read_bytes(plan, max_bytes=MAX_REPORT_BYTES))
        return dict(data["scenario"]), int(data["seed"]), data.get("tokenizer")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ConfigError(f"{plan}: not a readable run plan ({exc})") from None
