"""The LLM scheduler's ``mode predict`` (v2) in the twin: the Lua's ``predict`` and
``predict_pick`` (see :mod:`.llm` for the scheduler around them).

The score and pick of ``mode score`` are replaced by a prediction per candidate
(:meth:`Predictor.pick`): its TTFT (front-end time + the prefill backlog routed there and
not yet drained + the step that prefills this prompt's uncached tokens: their time at its
prefill rate and its running batch's decode step, or its inter-token latency since the
last scrape if longer, on a smooth roofline) and its time per output token (a decode step
at its running batch plus one, or that inter-token latency if longer), the candidates
within both SLOs kept (none: hold, re-predicting, up to ``queue_timeout_ms``, then route
anyway), the lowest ``TTFT + w_decode x max_tokens x TPOT`` picked. A request no replica
could serve within the SLOs even with its queue drained is not held. A replica without
rates in the map is predicted with what its ``/metrics`` showed (:meth:`Predictor.scrape`):
prompt tokens a second between leaving the queue and the first token
(``vllm:prompt_tokens_total`` over ``time_to_first_token`` minus ``request_queue_time``
sums) and its last inter-token latency; else the Lua's defaults.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from lbtune.twin.routing import ReplicaView

__all__ = ["Ask", "Host", "Prediction", "Predictor", "Rates"]


@dataclass(frozen=True)
class Ask:
    """What ``mode predict`` reads of a request."""

    hashes: Sequence[bytes]
    tokens: float
    block: float
    out: float


@dataclass(frozen=True)
class Prediction:
    ttft: float
    tpot: float
    work: float
    """Prefill GPU seconds the request adds to the replica's backlog."""
    alone: float
    """Its TTFT there with nothing queued and no batch."""
    alone_tpot: float


@dataclass
class Rates:
    """What ``mode predict`` keeps of one replica: its batch, the prefill routed there and
    not yet done, and the rates its ``/metrics`` showed."""

    running: float = 0.0
    since_n: int = 0
    """Requests routed there since the last scrape."""
    backlog: float = 0.0
    """Prefill work routed there and not yet done, GPU seconds."""
    bt: float | None = None
    """When ``backlog`` was last brought up to date (ms)."""
    itl: float = 0.0
    """Mean inter-token latency between the last two scrapes (wall seconds; 0: none)."""
    last_isum: float | None = None
    last_icount: int | None = None
    itl_last: float = 0.0
    """The last inter-token latency seen (wall seconds; kept while idle)."""
    tps_seen: float = 0.0
    """Prompt tokens a wall second between queue and first token, last seen (0: none)."""
    last_pt: float | None = None
    last_qs: float | None = None

    def backlog_at(self, t: float, scale: float) -> float:
        """The backlog at ``t`` (ms): it drains ``scale`` GPU seconds a wall second."""
        if self.bt is not None:
            self.backlog = max(0.0, self.backlog - (t - self.bt) / 1000 * scale)
        self.bt = t
        return self.backlog


class Replica(Protocol):
    """What ``mode predict`` reads of the scheduler's own state of a replica."""

    @property
    def waiting(self) -> float: ...

    def matched(self, hashes: Sequence[bytes]) -> int:
        """Leading blocks of ``hashes`` the replica was sent before."""
        ...


class Host(Protocol):
    """What ``mode predict`` reads of its scheduler (:class:`.llm.LlmScheduler`), at each
    call: the knobs, the map's facts, its replicas and its random number generator."""

    rng: random.Random

    @property
    def state(self) -> Mapping[str, Replica]: ...

    def num(self, key: str) -> float: ...

    def fact(self, key: str) -> float | None: ...


class Predictor:
    """``mode predict`` of one scheduler: the replicas' :class:`Rates`, the predictions
    and the pick."""

    def __init__(self, host: Host, names: Sequence[str]) -> None:
        self.host = host
        self.rates = {n: Rates() for n in names}

    def time_scale(self) -> float:
        v = self.host.fact("time_scale")
        return v if v is not None and v > 0 else 1.0

    def _rate(self, kind: str, backend: str, name: str, default: float) -> float:
        v = self.host.fact(f"{kind}.{backend}.{name}")
        return v if v is not None and v > 0 else default

    def predict(self, name: str, ask: Ask, backend: str, t: float) -> Prediction:
        """The request on ``name``, GPU seconds (the Lua's ``predict``; it brings that
        server's backlog up to ``t``); ``ok`` and ``cost`` left for the pick."""
        num, fact = self.host.num, self.host.fact
        r, rep = self.rates[name], self.host.state[name]
        scale = self.time_scale()
        tps_default, step_default = num("prefill_tps"), num("step_ms") / 1000
        if r.tps_seen > 0:
            tps_default = r.tps_seen / scale
        if r.itl_last > 0:
            step_default = r.itl_last * scale
        tps = self._rate("tps", backend, name, tps_default)
        step = self._rate("step", backend, name, step_default)
        stepk = fact(f"stepk.{backend}.{name}")
        stepk = 0.0 if stepk is None else stepk
        ovh = fact(f"ovh.{name}")
        ovh = 0.0 if ovh is None else ovh
        cached = min(ask.tokens - 1, rep.matched(ask.hashes) * ask.block)
        work = (ask.tokens - cached) / tps
        n = r.running + rep.waiting + r.since_n
        seen = r.itl * self.time_scale()
        busy = max(step + stepk * n, seen)
        ttft = ovh + r.backlog_at(t, self.time_scale()) + math.sqrt(busy * busy + work * work)
        tpot = max(step + stepk * (n + 1), seen + stepk)
        alone = ovh + math.sqrt(step * step + work * work)
        return Prediction(ttft, tpot, work, alone, step + stepk)

    def pick(
        self, cands: Sequence[str], ask: Ask, backend: str, t: float, *, expired: bool
    ) -> str | None:
        """The Lua's ``predict_pick``: the server, or ``None`` to hold the request."""
        num = self.host.num
        scale = self.time_scale()
        ttft_slo = num("ttft_slo_ms") / 1000 * scale
        tpot_slo = num("tpot_slo_ms") / 1000 * scale
        wd = num("w_decode") * ask.out
        preds: dict[str, tuple[Prediction, bool, float]] = {}
        can_wait = False
        for c in cands:
            p = self.predict(c, ask, backend, t)
            preds[c] = (p, p.ttft <= ttft_slo and p.tpot <= tpot_slo, p.ttft + wd * p.tpot)
            can_wait = can_wait or (p.alone <= ttft_slo and p.alone_tpot <= tpot_slo)
        any_ok = any(ok for _, ok, _ in preds.values())
        if not any_ok and can_wait and not expired and num("queue_timeout_ms") > 0:
            return None
        best, ties = math.inf, []
        for c in cands:
            _, ok, cost = preds[c]
            if ok or not any_ok:
                if cost < best - 1e-12:
                    best, ties = cost, [c]
                elif cost <= best + 1e-12:
                    ties.append(c)
        srv = ties[self.host.rng.randrange(len(ties))]
        r = self.rates[srv]
        r.backlog += preds[srv][0].work
        r.since_n += 1
        return srv

    def scrape(self, name: str, rep: ReplicaView, ttft_spent: float | None) -> None:
        """The scrape task's part for ``mode predict``, after the scheduler's own (which
        read ``waiting``): ``ttft_spent`` is the TTFT seconds of the first tokens since
        the last scrape (``None``: none, or no last scrape)."""
        r = self.rates[name]
        r.running = float(rep.num_running)
        r.since_n = 0
        if self.host.state[name].waiting == 0 and r.running == 0:
            r.backlog = 0.0
        pt, qs = float(rep.prompt_tokens_total), rep.queue_sum_s
        if ttft_spent is not None and r.last_pt is not None and r.last_qs is not None:
            busy = ttft_spent - (qs - r.last_qs)
            if busy > 0 and pt > r.last_pt:
                r.tps_seen = (pt - r.last_pt) / busy
        r.last_pt, r.last_qs = pt, qs
        isum, icount = rep.itl_sum_s, rep.itl_count
        if r.last_icount is not None and r.last_isum is not None and icount > r.last_icount:
            r.itl = (isum - r.last_isum) / (icount - r.last_icount)
            r.itl_last = r.itl
        elif r.running == 0:
            r.itl = 0.0
        r.last_isum, r.last_icount = isum, icount
