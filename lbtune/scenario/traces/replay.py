"""From a trace's rows to the run's send times and requests.

Selection (pure in trace, source and seed): timed traces start ``source.start`` trace
seconds after their first request; each row is kept with probability ``rate_scale``
(a seeded draw per file line, so the same rows every run); then the first ``limit``.
A kept row's send offset is ``(t - window start) / speedup``. ShareGPT rows (untimed)
are interleaved so that a conversation's turns are about ``turn_gap`` requests apart.

Request ``i`` is kept row ``i``: prompts synthesized to its exact token count under the
scenario's tokenizer (:class:`~lbtune.scenario.prompts.TextSynth`), Mooncake blocks as
shared text keyed by their hash id (so shared leading blocks are a shared prefix), and
``max_tokens`` the trace's output length with ``ignore_eos`` (the scenario's default),
so the answers are as long as the trace's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from lbtune.errors import ConfigError
from lbtune.scenario import draws
from lbtune.scenario.models import Scenario
from lbtune.scenario.prompts import TextSynth
from lbtune.scenario.request import Api, RequestSpec
from lbtune.scenario.traces.read import check_pinned, digest, read_trace
from lbtune.scenario.traces.rows import TraceRow
from lbtune.scenario.traces.spec import TraceSource

_KEEP = 0x7E1
_ROW = 0x7E2
_BLOCK = 0x7E3
_MODEL = 0x7E4
_MASK31 = 0x7FFFFFFF


@dataclass(frozen=True)
class Replay:
    """The kept rows of a trace, in send order, and their send offsets (timed formats)."""

    rows: tuple[TraceRow, ...]
    offsets: tuple[float, ...] | None
    """Seconds from the run's start; ``None`` for an untimed (ShareGPT) trace."""
    source: TraceSource

    @property
    def span_s(self) -> float:
        """Replay length (a timed trace): :func:`span_of` its offsets."""
        return span_of(self.offsets or ())


def span_of(offsets: Sequence[float]) -> float:
    """A timed replay's length: the last send plus one mean gap (1 s after a lone send)."""
    if not offsets:
        return 0.0
    last = offsets[-1]
    gap = last / (len(offsets) - 1) if len(offsets) > 1 else 1.0
    return last + max(gap, 1e-3)


def replay_of(scenario: Scenario, seed: int | None = None) -> Replay:
    """The selection of ``scenario.source`` (ConfigError if the scenario has none)."""
    src = scenario.source
    if src is None:
        raise ConfigError(f"scenario '{scenario.name}' has no trace source")
    check_pinned(src)
    rows = read_trace(src.trace, src.format)  # cached while the file is unchanged
    return _replay(src, rows, scenario.seed if seed is None else seed, scenario.turn_gap)


@lru_cache(maxsize=8)
def _replay(src: TraceSource, rows: tuple[TraceRow, ...], seed: int, turn_gap: int) -> Replay:
    if src.rate_scale < 1:
        rows = tuple(r for r in rows if draws.uniform(seed, _KEEP, r.line) < src.rate_scale)
    if src.timed:
        first = rows[0].t if rows else 0.0
        t0 = (first or 0.0) + src.start
        kept = [r for r in rows if (r.t or 0.0) >= t0]
        if src.limit is not None:
            kept = kept[: src.limit]
        if not kept:
            raise ConfigError(
                f"{src.trace}: no request from start={src.start:g} s on "
                f"(the trace spans {(rows[-1].t or 0.0) - (first or 0.0):g} s)"
            )
        offsets = tuple(((r.t or 0.0) - t0) / src.speedup for r in kept)
        return Replay(tuple(kept), offsets, src)
    order = sorted(rows, key=lambda r: ((r.session or 0) + r.turn * turn_gap, r.session or 0))
    if src.limit is not None:
        order = order[: src.limit]
    return Replay(tuple(order), None, src)


def pin(scenario: Scenario, base: Path | None = None) -> Scenario:
    """The scenario with its trace path made absolute and its bytes' SHA-256 recorded."""
    src = scenario.source
    if src is None:
        return scenario
    path = Path(src.trace)
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    if not path.exists():
        raise ConfigError(f"{src.trace}: no such trace file")
    pinned = src.model_copy(update={"trace": str(path.resolve()), "sha256": digest(path)})
    return scenario.model_copy(update={"source": pinned})


class TraceWorkload:
    """Request ``i`` of a replayed trace; identical in every process for the same seed."""

    def __init__(
        self,
        scenario: Scenario,
        seed: int | None = None,
        tokenizer_path: str | None = None,
        recorded: Any = None,
    ) -> None:
        self.scenario = scenario
        self.seed = scenario.seed if seed is None else seed
        self.replay = replay_of(scenario, self.seed)
        self.synth = TextSynth(tokenizer_path)
        self._blocks = BlockText(self.synth, self.seed, self.replay.source.block_tokens)
        self._recorded = recorded
        """lbtune format with its run.json: the recorded run's own workload."""
        models = scenario.models
        self._models = tuple(models)
        self._model_cum = _cumulative(list(models.values()))
        api = scenario.api
        self._apis: tuple[Api, ...] = (api,) if isinstance(api, str) else tuple(api)
        self._api_cum = _cumulative([1.0] if isinstance(api, str) else list(api.values()))
        extra = {"ignore_eos": True} if scenario.ignore_eos else {}
        self._extra: dict[str, Any] = {**extra, **scenario.extra_body}

    def __len__(self) -> int:
        return len(self.replay.rows)

    def request(self, i: int) -> RequestSpec:
        if i < 0:
            raise IndexError(f"request index must be >= 0, got {i}")
        rows = self.replay.rows
        row = rows[i % len(rows)]  # an untimed trace repeats when the load asks for more
        if self._recorded is not None and row.replay is not None:
            spec: RequestSpec = self._recorded.request(row.replay)
            return dataclasses.replace(spec, index=i)
        u = draws.uniforms(self.seed, _ROW, row.line, row.turn, n=3)
        model = row.model if row.model in self.scenario.models else None
        if model is None:
            model = self._models[
                draws.choose(draws.uniform(self.seed, _MODEL, row.line), self._model_cum)
            ]
        api = (
            row.api
            if row.api in ("chat", "completions")
            else self._apis[draws.choose(u[0], self._api_cum)]
        )
        stream = row.stream if row.stream is not None else u[1] < float(self.scenario.stream)
        parts, n_tokens = self._prompt(row)
        messages = prompt = None
        if api == "chat":
            messages = tuple({"role": role, "content": text} for role, text in parts)
        else:
            prompt = "\n\n".join(text for _, text in parts)
        group = row.prefix_group
        if group is None:
            group = BlockText.group(row.hash_ids)
        return RequestSpec(
            index=i,
            api=api,  # type: ignore[arg-type]
            model=model,
            max_tokens=row.output_tokens,
            stream=bool(stream),
            prompt_tokens=n_tokens,
            messages=messages,
            prompt=prompt,
            prefix_group=group,
            session_id=row.session,
            turn=row.turn,
            extra_body=dict(self._extra),
            traffic_class="trace",
        )

    def __getitem__(self, i: int) -> RequestSpec:
        return self.request(i)

    def _prompt(self, row: TraceRow) -> tuple[list[tuple[str, str]], int]:
        if row.messages is not None:
            parts = list(row.messages)
            if self.synth.tokenizer == "lbtune":
                return parts, row.prompt_tokens
            return parts, sum(self.synth.count(t) for _, t in parts)
        text, total = self._blocks.text(row.hash_ids or (), row.prompt_tokens, (_ROW, row.line))
        return [("user", text)], total


@dataclass(frozen=True)
class BlockText:
    """Prompt text as Mooncake-style blocks: one ``block_tokens`` piece per hash id, keyed
    by the id alone, so prompts whose leading ids agree share exactly that leading text
    (a prefix the replicas' caches see), in any trace format and any process."""

    synth: TextSynth
    seed: int
    block_tokens: int

    def text(self, hash_ids: Sequence[int], n: int, rest: tuple[int, ...]) -> tuple[str, int]:
        """``(text, tokens)`` of ``n`` tokens: the blocks of ``hash_ids`` (the last one cut to
        what is left), then what the ids do not cover, keyed by ``rest``."""
        pieces: list[str] = []
        total = 0
        left = n
        for h in hash_ids:
            if left <= 0:
                break
            size = min(self.block_tokens, left)
            text, got = self.synth.text(self.seed, (_BLOCK, h & _MASK31, size), size)
            pieces.append(text)
            total += got
            left -= size
        if left > 0:
            text, got = self.synth.text(self.seed, (*rest, left), left)
            pieces.append(text)
            total += got
        return " ".join(pieces), total

    @staticmethod
    def group(hash_ids: Sequence[int] | None) -> int | None:
        """The prefix group of a prompt of blocks: its first block's id (31 bits)."""
        return hash_ids[0] & _MASK31 if hash_ids else None


def _cumulative(weights: list[float]) -> list[float]:
    out: list[float] = []
    acc = 0.0
    for w in weights:
        acc += w
        out.append(acc)
    return out


def trace_rate(replay: Replay, duration_s: float) -> float:
    """Mean offered rate of the replay over ``duration_s`` (what a summary shows)."""
    offs = replay.offsets or ()
    n = sum(1 for t in offs if t < duration_s)
    return n / duration_s if duration_s > 0 and math.isfinite(duration_s) else 0.0
