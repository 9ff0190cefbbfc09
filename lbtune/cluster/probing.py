"""Requests straight at one replica, each on fresh text, that measure one thing.

:class:`Prober` sends a replica bounded requests (completions, ``ignore_eos``, every
prompt text new so nothing is served from the prefix cache) and turns each answer into a
:class:`Probe` (its TTFT and decode step); a failure is a
:class:`~lbtune.errors.ClusterError` naming the replica. On top of it, the one-shot
measurements the calibration and the twin's fit share: the decode step of a batch
(:func:`decode_step_at`), a lone request's least TTFT and the replica's own count of its
prompt (:func:`least_ttft`), and what the replica says of itself (its context length,
:func:`context_length`; its KV cache, :func:`kv_cache_size`).
"""

from __future__ import annotations

import json
import random
import secrets
import time
from dataclasses import dataclass
from itertools import count

import gevent
from prometheus_client.parser import text_string_to_metric_families

from lbtune.errors import ClusterError
from lbtune.loadgen.client import StreamClient
from lbtune.process import probes
from lbtune.records.endpoints import ReplicaEndpoint
from lbtune.records.quantiles import percentile
from lbtune.records.requests import RequestRecord
from lbtune.scenario import prompts
from lbtune.scenario.request import RequestSpec

__all__ = [
    "DEFAULT_PLAN",
    "Probe",
    "ProbePlan",
    "Prober",
    "context_length",
    "decode_step_at",
    "histogram_totals",
    "kv_cache_size",
    "least_ttft",
    "parse_cache_info",
]


@dataclass(frozen=True)
class ProbePlan:
    """How much a calibration sends to each replica (with the defaults: 25 requests, three
    more each time the long prompt doubles)."""

    short_tokens: int = 16
    long_tokens: int = 512
    """Where ``/v1/models`` gives the context length: doubled while too short to measure,
    capped at a third of it."""
    decode_tokens: int = 24
    batch: int = 4
    repeats: int = 3
    timeout_s: float = 60.0
    """Per request: a replica that does not finish one in this time is not calibrated."""
    seed: int | None = None
    """The probe texts' seed; None: a fresh one per replica measured, so that no probe
    finds an earlier calibration's prompt in the replica's prefix cache (a second
    calibration with the same texts measured cache hits: a prefill rate 16× too high)."""
    long_over_short: float = 8.0
    """The long prompt doubles until its TTFT is this many times the short one's. At
    1.5× a CPU vLLM stopped at 512 tokens, ~10 ms of prefill, and three calibrations in a
    row fitted 25k, 61k and 65k tokens/s: a few ms of scheduling noise was most of it."""
    settle_s: float = 2.0
    """Idle time before each replica after the first."""
    max_prompt_tokens: int | None = None
    """The longest prompt sent (else a third of the context): ``lbtune twin fit`` keeps a
    prompt within one step's token budget, where the lone-request model is the engine's."""


DEFAULT_PLAN = ProbePlan()
"""The probes' defaults, for the signatures outside this module."""


@dataclass(frozen=True)
class Probe:
    """One request's answer as measured: its TTFT and decode step."""

    prompt_tokens: int
    ttft_s: float
    step_s: float | None
    """Mean time per output token after the first; ``None`` for a one-token request."""
    tail_step_s: float | None = None
    """The same over the second half of the output only: steps when a batch sent at once
    has finished prefilling (its first steps mix decodes with other requests' chunks)."""


class Prober:
    """One replica's requests, numbered so that every prompt is fresh text."""

    def __init__(self, rep: ReplicaEndpoint, model: str, plan: ProbePlan, key: str | None):
        self.rep, self.model, self.plan = rep, model, plan
        self._key = key
        self._index = count()
        self._loops = count()
        self._seed = plan.seed if plan.seed is not None else secrets.randbits(31)
        self.sent = 0

    def send(
        self, prompt_tokens: int, max_tokens: int, n: int = 1, *, stream: bool = True
    ) -> list[Probe]:
        """``n`` requests at once, each on its own connection."""
        specs = [self._spec(prompt_tokens, max_tokens, stream) for _ in range(n)]
        self.sent += n
        clients = [
            StreamClient(self.rep.url, api_key=self._key, timeout_s=self.plan.timeout_s)
            for _ in specs
        ]
        deadline = time.monotonic() + self.plan.timeout_s + 5
        try:
            jobs = [gevent.spawn(c.send, s) for c, s in zip(clients, specs, strict=True)]
            # until every probe is done or the deadline: a wait that comes back early (in
            # CI one did, its probe unfinished and then killed) waits again
            while not all(j.ready() for j in jobs) and time.monotonic() < deadline:
                gevent.joinall(jobs, timeout=max(0.0, deadline - time.monotonic()))
            gevent.killall([j for j in jobs if not j.ready()], block=True, timeout=5)
        finally:
            for c in clients:
                c.close()
        return [self._probe(_record(j)) for j in jobs]

    def least(self, prompt_tokens: int) -> Probe:
        """The lone one-token request of ``prompt_tokens`` with the least TTFT over
        ``plan.repeats`` (a busy host only ever adds time)."""
        tries = (self.send(prompt_tokens, 1, stream=False)[0] for _ in range(self.plan.repeats))
        return min(tries, key=lambda x: x.ttft_s)

    def _spec(self, prompt_tokens: int, max_tokens: int, stream: bool) -> RequestSpec:
        i = next(self._index)
        text = prompts.synth(self._seed, (7919, i), prompt_tokens)
        return RequestSpec(
            index=i,
            api="completions",
            model=self.model,
            max_tokens=max_tokens,
            stream=stream,
            prompt_tokens=prompt_tokens,
            prompt=text,
            extra_body={"ignore_eos": True, "min_tokens": max_tokens},
        )

    def _probe(self, rec: RequestRecord | None) -> Probe:
        if rec is None or rec.outcome != "ok":
            why = "no answer in time" if rec is None else (rec.error or rec.outcome)
            raise ClusterError(
                f"calibrating replica {self.rep.name} ({self.rep.url}): a probe request "
                f"failed: {why}"
            )
        if not rec.stream:  # one token: its time is the whole answer's, empty text or not
            return Probe(int(rec.prompt_tokens or 0), rec.ended_at - rec.sent_at, None)
        first = rec.first_token_at
        if first is None or not rec.chunk_times:
            raise ClusterError(
                f"calibrating replica {self.rep.name} ({self.rep.url}): a streamed probe "
                "came back without text; is ignore_eos/min_tokens honoured?"
            )
        out = rec.output_tokens or 0
        step = (rec.chunk_times[-1] - first) / (out - 1) if out > 1 else None
        c = rec.chunk_times
        half = len(c) // 2
        tail = (c[-1] - c[half]) / (len(c) - 1 - half) if len(c) - 1 - half >= 2 else None
        return Probe(int(rec.prompt_tokens or 0), first - rec.sent_at, step, tail)

    def loop(
        self, prompt_tokens: int, max_tokens: int, until: float, spread: float = 0.0
    ) -> list[tuple[float, Probe]]:
        """Streamed requests one after another on one connection until ``until``
        (monotonic; a request under way then finishes, each bounded by the timeout):
        each one's send time (``time.time()``) and probe. ``spread``: each request's
        output is drawn uniformly within ``max_tokens × (1 ± spread)`` (the mean kept), so
        that loops run side by side drift apart; with equal outputs they stay in lockstep
        and every prompt arrives with all the others."""
        client = StreamClient(self.rep.url, api_key=self._key, timeout_s=self.plan.timeout_s)
        rng = random.Random(f"{self._seed}/{next(self._loops)}")
        out: list[tuple[float, Probe]] = []
        try:
            while time.monotonic() < until:
                self.sent += 1
                n = max_tokens
                if spread > 0:
                    n = max(1, round(max_tokens * rng.uniform(1 - spread, 1 + spread)))
                rec = client.send(self._spec(prompt_tokens, n, True))
                out.append((rec.sent_at, self._probe(rec)))  # failed: one line, naming it
        finally:
            client.close()
        return out


def _record(job: gevent.Greenlet) -> RequestRecord | None:
    """A probe's record; None when it did not finish (a killed greenlet's value is the
    GreenletExit that ended it, not a record)."""
    value = job.value if job.successful() else None
    return value if isinstance(value, RequestRecord) else None


def context_length(rep: ReplicaEndpoint, model: str) -> int | None:
    """``max_model_len`` of ``model`` from the replica's ``/v1/models`` (vLLM's field)."""
    status, body = probes.http_get(rep.url.rstrip("/") + "/v1/models", timeout=5.0)
    if status != 200:
        return None
    try:
        for m in json.loads(body).get("data", []):
            if m.get("id") == model and isinstance(m.get("max_model_len"), int):
                return int(m["max_model_len"])
    except (ValueError, AttributeError, TypeError):
        return None
    return None


def kv_cache_size(rep: ReplicaEndpoint) -> tuple[int, int] | None:
    """``(block_size, num_gpu_blocks)`` of the replica's KV cache from vLLM's
    ``vllm:cache_config_info`` on its ``/metrics``; None where it exports none."""
    status, body = probes.http_get(rep.url.rstrip("/") + "/metrics", timeout=5.0)
    if status != 200:
        return None
    return parse_cache_info(body.decode("utf-8", "replace") if isinstance(body, bytes) else body)


def parse_cache_info(text: str) -> tuple[int, int] | None:
    """``(block_size, num_gpu_blocks)`` from an exposition's ``vllm:cache_config_info``."""
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "vllm:cache_config_info":
                    size, blocks = s.labels.get("block_size"), s.labels.get("num_gpu_blocks")
                    if size and blocks and size.isdigit() and blocks.isdigit():
                        return int(size), int(blocks)
    except ValueError:  # not an exposition
        return None
    return None


ENGINE_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "iteration_tokens": "vllm:iteration_tokens_total",
}
"""vLLM's histograms :func:`histogram_totals` reads, by a short name."""


def histogram_totals(text: str) -> dict[str, tuple[float, float]]:
    """``(sum, count)`` of each of :data:`ENGINE_HISTOGRAMS` an exposition holds, over all
    its label sets (one model per replica); those it lacks are left out."""
    wanted = {v: k for k, v in ENGINE_HISTOGRAMS.items()}
    out: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            short = wanted.get(family.name)
            if short is None:
                continue
            acc = out.setdefault(short, [0.0, 0.0])
            for s in family.samples:
                if s.name.endswith("_sum"):
                    acc[0] += s.value
                elif s.name.endswith("_count"):
                    acc[1] += s.value
    except ValueError:  # not an exposition
        return {}
    return {k: (v[0], v[1]) for k, v in out.items()}


def decode_step_at(
    rep: ReplicaEndpoint,
    batch: int,
    prompt_tokens: int,
    plan: ProbePlan = ProbePlan(),
    *,
    api_key: str | None = None,
) -> float:
    """The decode step of ``batch`` streamed requests of ``prompt_tokens`` sent at once,
    over the second half of their outputs (when every prompt is prefilled): the median of
    the requests' steps, the least over ``plan.repeats`` (as :func:`measure_replica`)."""
    if not rep.models:
        raise ClusterError(f"replica {rep.name} serves no model: nothing to measure")
    p = Prober(rep, rep.models[0], plan, api_key)
    out = max(plan.decode_tokens, 8)

    def tails(got: list[Probe]) -> list[float]:
        return [x.tail_step_s for x in got if x.tail_step_s is not None]

    return min(
        percentile(tails(p.send(prompt_tokens, out, n=batch)), 50) for _ in range(plan.repeats)
    )


def least_ttft(
    rep: ReplicaEndpoint,
    prompt_tokens: int,
    plan: ProbePlan = ProbePlan(),
    *,
    api_key: str | None = None,
) -> tuple[int, float]:
    """``(prompt tokens as the replica counted them, TTFT)`` of a lone one-token request
    on fresh text, the least over ``plan.repeats``."""
    if not rep.models:
        raise ClusterError(f"replica {rep.name} serves no model: nothing to measure")
    best = Prober(rep, rep.models[0], plan, api_key).least(prompt_tokens)
    return best.prompt_tokens, best.ttft_s
