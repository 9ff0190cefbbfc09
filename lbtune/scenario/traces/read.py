"""Parse a trace file of a given format, once per process (cached by path, size and mtime).

Request traces only: an agentic trace (``weka``, ``otel``, ``copilot``) is read into
sessions by :func:`lbtune.scenario.traces.readsessions.read_sessions`; :func:`guess_format`
tells both kinds apart.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from lbtune.errors import ConfigError
from lbtune.safety.files import MAX_TRACE_BYTES, open_regular
from lbtune.scenario.traces import azure, burstgpt, lbtune_run, mooncake, sharegpt
from lbtune.scenario.traces.readsessions import detect_session_format
from lbtune.scenario.traces.rows import TraceRow, read_errors
from lbtune.scenario.traces.sessiongraph import SESSION_FORMATS
from lbtune.scenario.traces.spec import FORMATS, TraceSource

PARSERS: dict[str, Callable[[Path, str], list[TraceRow]]] = {
    "azure": azure.read,
    "mooncake": mooncake.read,
    "burstgpt": burstgpt.read,
    "sharegpt": sharegpt.read,
    "lbtune": lbtune_run.read,
}
_SUFFIX = {".parquet": "lbtune", ".jsonl": "mooncake", ".json": "sharegpt"}


def guess_format(path: str | Path) -> str:
    """The format a file most likely holds: an agentic format when a JSON (lines) file's
    first bytes look like one (:func:`detect_session_format`), else by suffix, and for CSV
    by its header."""
    p = Path(path)
    if p.suffix in (".json", ".jsonl") and p.is_file():
        agentic = detect_session_format(p)
        if agentic is not None:
            return agentic
    if p.suffix in _SUFFIX:
        return _SUFFIX[p.suffix]
    if p.suffix == ".csv" and p.is_file():
        with open_regular(p, max_bytes=MAX_TRACE_BYTES) as f:
            head = f.readline(4096).decode("utf-8", errors="replace")
        if "ContextTokens" in head:
            return "azure"
        if "Request tokens" in head:
            return "burstgpt"
    raise ConfigError(
        f"{p}: cannot tell the trace format; give one of {', '.join(FORMATS)} (--trace-format)"
    )


def digest(path: str | Path) -> str:
    """SHA-256 of the file's bytes (pins the trace a run replays)."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the trace ({exc.strerror})") from None
    return _digest(str(p.resolve()), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=8)
def _digest(path: str, size: int, mtime: int) -> str:
    h = hashlib.sha256()
    with open_regular(path, max_bytes=MAX_TRACE_BYTES) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_pinned(src: TraceSource) -> None:
    """A ConfigError when the trace's bytes are not those the run was planned with."""
    if src.sha256 is not None and digest(src.trace) != src.sha256:
        raise ConfigError(
            f"{src.trace}: the trace changed since the run was planned (sha256 differs); "
            "re-plan the run"
        )


def read_trace(path: str | Path, fmt: str) -> tuple[TraceRow, ...]:
    """Every request in ``path`` (a ``fmt`` trace), validated; ConfigError on the first bad row."""
    if fmt in SESSION_FORMATS:
        raise ConfigError(
            f"{path}: a {fmt} trace holds agent sessions, not requests; read it with "
            "lbtune.scenario.traces.readsessions.read_sessions (a scenario replays it as sessions)"
        )
    if fmt not in PARSERS:
        raise ConfigError(f"Unknown trace format '{fmt}'. Available: {', '.join(FORMATS)}")
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{path}: no such trace file")
    st = p.stat()
    return _cached(str(p.resolve()), fmt, st.st_size, st.st_mtime_ns, str(path))


@lru_cache(maxsize=8)
def _cached(path: str, fmt: str, size: int, mtime: int, shown: str) -> tuple[TraceRow, ...]:
    with read_errors(shown, fmt):
        rows = PARSERS[fmt](Path(path), shown)
    if not rows:
        raise ConfigError(f"{shown}: the trace holds no requests")
    return tuple(rows)
