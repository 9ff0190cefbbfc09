"""The runner's view of a test in progress (pure Python: no gevent, no Locust).

:class:`RecordTail` follows every ``records-*.jsonl`` in the records directory
(generators flush about once a second), feeds the exporter and keeps a sliding
window for live progress. Reading the files instead of a side channel costs the
generator nothing and works the same for one process or N Locust workers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lbtune.loadgen.health import percentile
from lbtune.loadgen.recordio import decode_line, is_header
from lbtune.records.requests import OUTCOMES, OpenRequest, RequestRecord

__all__ = ["Progress", "RecordTail"]


@dataclass(frozen=True, slots=True)
class Progress:
    """One live snapshot (about once a second)."""

    elapsed_s: float
    remaining_s: float
    sent: int
    completed: int
    requests_per_s: float
    """Completed requests/s over the last ``window_s``."""
    output_tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    """Over successful requests that ended in the last ``window_s``."""
    errors: int
    """Requests so far whose outcome is not ``ok``."""
    in_flight: int
    generator_lag_p99_s: float | None
    """Worst event-loop lag P99 of the last second over generator processes."""
    generator_cpu_percent: float | None
    """Highest CPU % of the last second over generator processes."""
    window_s: float = 5.0
    now: float = 0.0
    """Wall-clock time (``time.time()``) at which ``open_requests`` were observed: the
    earliest of the generators' latest snapshots (the runner's clock before the first)."""
    open_requests: tuple[OpenRequest, ...] = ()
    """All generators' requests sent by ``now`` and still open then. Every request that
    ended before its generator's snapshot is in the record files by then; a consumer
    reading records later should treat one with ``ended_at > now`` as open at ``now``."""
    started_at: float = 0.0
    """The run's start as the runner knows it at this snapshot (the generators' start
    once they reported it, the runner's own before): ``elapsed_s`` counts from it, and a
    run plan's window is anchored on it (:meth:`lbtune.scenario.runplan.RunPlan.window_at`)."""
    records: tuple[RequestRecord, ...] = ()
    """The records the run's one tail of its record files read since the previous
    snapshot (each record once, over the snapshots): what live consumers of the records
    (``--until-samples``, a study's pruning windows) add up, instead of tailing the
    files themselves."""


class RecordTail:
    """Incrementally reads the JSONL record files of one run."""

    def __init__(
        self,
        records_dir: Path,
        on_record: Callable[[RequestRecord], None] | None = None,
        window_s: float = 5.0,
    ) -> None:
        self.dir = records_dir
        self.window_s = window_s
        self._on_record = on_record
        self._files: dict[Path, tuple[int, str]] = {}
        self._window: deque[tuple[float, float | None, int, bool]] = deque()
        self.outcomes: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self.count = 0

    def poll(self) -> int:
        """Read whatever was appended since the last call; returns records read."""
        n = 0
        for f in sorted(self.dir.glob("records-*.jsonl")):
            offset, partial = self._files.get(f, (0, ""))
            try:
                with f.open(encoding="utf-8") as fh:
                    fh.seek(offset)
                    data = fh.read()
                    offset = fh.tell()
            except OSError:
                continue
            text = partial + data
            lines = text.split("\n")
            partial = lines.pop()  # incomplete last line (or "")
            for line in lines:
                if not line:
                    continue
                if is_header(line):
                    continue
                self._add(decode_line(line))
                n += 1
            self._files[f] = (offset, partial)
        return n

    def _add(self, r: RequestRecord) -> None:
        self.count += 1
        self.outcomes[r.outcome] = self.outcomes.get(r.outcome, 0) + 1
        ok = r.outcome == "ok"
        self._window.append((r.ended_at, r.ttft if ok else None, r.output_tokens or 0, ok))
        if self._on_record is not None:
            self._on_record(r)

    def window(self, now: float) -> tuple[float, float, float | None, float | None]:
        """(req/s, output tokens/s, TTFT P50, TTFT P99) over the last ``window_s``."""
        lo = now - self.window_s
        w = self._window
        while w and w[0][0] < lo:
            w.popleft()
        recent = [x for x in w if x[0] <= now]
        ttfts = [x[1] for x in recent if x[1] is not None]
        tokens = sum(x[2] for x in recent if x[3])
        return (
            len(recent) / self.window_s,
            tokens / self.window_s,
            percentile(ttfts, 50),
            percentile(ttfts, 99),
        )

    @property
    def errors(self) -> int:
        return self.count - self.outcomes.get("ok", 0) - self.outcomes.get("cancelled", 0)
