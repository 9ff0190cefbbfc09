"""What a simulated replica knows of each request it served: its ground truth.

:class:`GroundTruthLog`: one JSON object per request (:func:`new_record`), kept in a
bounded LRU for ``GET /debug/requests/{id}`` and, when a path is given, appended to a
JSONL file (buffered, flushed every second and on close).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["GroundTruthLog", "new_record"]


def new_record(request_id: str, replica: str, api: str, t_arrival: float) -> dict[str, Any]:
    """A ground-truth record; the server fills it in as the request proceeds.

    ``t_*`` are ``time.time()`` stamps: ``t_arrival`` when the handler started,
    ``t_headers`` just after the response headers were written, ``t_first_token``
    just after the first content chunk was written (non-streaming: the body),
    ``t_last`` just after the last chunk (``data: [DONE]``) was written. ``status``
    is the HTTP status, or 499 when the client went away; ``output_tokens`` counts
    tokens produced; ``finish_reason`` is ``stop``, ``length`` or ``abort``.
    """
    return {
        "request_id": request_id,
        "replica": replica,
        "api": api,
        "model": None,
        "stream": None,
        "status": None,
        "prompt_tokens": None,
        "output_tokens": 0,
        "finish_reason": None,
        "t_arrival": t_arrival,
        "t_headers": None,
        "t_first_token": None,
        "t_last": None,
    }


class GroundTruthLog:
    """Per-request ground truth: an LRU for the debug endpoint and an optional JSONL file."""

    def __init__(self, path: str | None = None, capacity: int = 100_000) -> None:
        self.path = path
        self.capacity = capacity
        self._recent: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._pending: list[str] = []
        self._file = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115
        self._task: asyncio.Task[None] | None = None

    def record(self, rec: dict[str, Any], scrub: Callable[[str], str] | None = None) -> None:
        """Keep ``rec`` (which must hold ``request_id``) and queue it for the file; ``scrub``
        masks its request's secrets in every text field first."""
        if scrub is not None:
            rec = {k: scrub(v) if isinstance(v, str) else v for k, v in rec.items()}
        rid = str(rec["request_id"])
        self._recent[rid] = rec
        self._recent.move_to_end(rid)
        while len(self._recent) > self.capacity:
            self._recent.popitem(last=False)
        if self._file is not None:
            self._pending.append(json.dumps(rec, separators=(",", ":")) + "\n")

    def get(self, request_id: str) -> dict[str, Any] | None:
        return self._recent.get(request_id)

    def flush(self) -> None:
        if self._file is not None and self._pending:
            self._file.write("".join(self._pending))
            self._pending.clear()
            self._file.flush()

    def start(self, interval: float = 1.0) -> None:
        """Flush every ``interval`` seconds from the running event loop."""
        if self._file is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._flusher(interval))

    async def _flusher(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.flush()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.close()

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None
