"""Mooncake / AIPerf JSONL: one JSON object a line.

``timestamp`` (ms), ``input_length``, ``output_length`` and ``hash_ids`` (one id per
block of ``block_tokens`` prompt tokens, 512 by default; requests whose leading ids agree
share that prompt prefix, and replay gives them the same text there). Example::

    {"timestamp": 0, "input_length": 1200, "output_length": 40, "hash_ids": [0, 1, 2]}
    {"timestamp": 350, "input_length": 1100, "output_length": 12, "hash_ids": [0, 1, 3]}
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

from lbtune.scenario.limits import MAX_HASH_IDS, MAX_TRACE_TIME_S
from lbtune.scenario.traces.rows import (
    Monotonic,
    TraceRow,
    as_float,
    as_int,
    bad,
    check_count,
    open_text,
)

_MAX_HASH = 2**63 - 1

REQUIRED = ("timestamp", "input_length", "output_length")
OPTIONAL = ("hash_ids", "model", "session_id")


def read(path: Path, shown: str) -> list[TraceRow]:
    rows: list[TraceRow] = []
    order = Monotonic(shown, "timestamp")
    with open_text(path, shown) as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise bad(
                    shown, line, None, f"invalid JSON at character {exc.pos + 1}: {exc.msg}"
                ) from None
            except ValueError as exc:  # an integer of more digits than Python reads
                raise bad(shown, line, None, f"invalid JSON: {exc}") from None
            if not isinstance(obj, dict):
                raise bad(shown, line, None, f"expected a JSON object, found {type(obj).__name__}")
            for key in REQUIRED:
                if key not in obj:
                    raise bad(shown, line, key, f"missing field (need {', '.join(REQUIRED)})")
            unknown = sorted(set(obj) - set(REQUIRED) - set(OPTIONAL))
            if unknown:
                valid = ", ".join((*REQUIRED, *OPTIONAL))
                raise bad(shown, line, unknown[0], f"unknown field; valid fields: {valid}")
            ms = as_float(
                shown, line, "timestamp", obj["timestamp"], maximum=MAX_TRACE_TIME_S * 1e3
            )
            t = ms / 1000.0
            order.check(line, t)
            hashes = obj.get("hash_ids")
            if hashes is not None and (
                not isinstance(hashes, list)
                or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes)
            ):
                raise bad(shown, line, "hash_ids", f"expected a list of integers, found {hashes!r}")
            if hashes is not None and len(hashes) > MAX_HASH_IDS:
                raise bad(shown, line, "hash_ids", f"more than {MAX_HASH_IDS} block hashes")
            if hashes is not None and any(abs(h) > _MAX_HASH for h in hashes):
                raise bad(shown, line, "hash_ids", "a hash beyond 64 bits")
            model = obj.get("model")
            if model is not None and not (isinstance(model, str) and model):
                raise bad(shown, line, "model", f"expected a model name, found {model!r}")
            sid = obj.get("session_id")
            rows.append(
                TraceRow(
                    line=line,
                    t=t,
                    prompt_tokens=as_int(
                        shown, line, "input_length", obj["input_length"], minimum=1
                    ),
                    output_tokens=max(
                        as_int(shown, line, "output_length", obj["output_length"]), 1
                    ),
                    model=model,
                    hash_ids=tuple(hashes) if hashes is not None else None,
                    session=None if sid is None else zlib.crc32(str(sid).encode()),
                )
            )
            check_count(shown, line, len(rows))
    return rows
