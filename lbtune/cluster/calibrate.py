"""``lbtune cluster calibrate``: measure each replica's engine rates with a few requests.

The ``llm`` scheduler's ``mode predict`` predicts a request's TTFT and TPOT on every
replica from four rates (:class:`~lbtune.records.calibration.ReplicaRates`). For the GPUs
and models lbtune has profiles of they come from the cost model; for a replica lbtune
did not build (a real vLLM, an unknown GPU) they come from here: a short, bounded
measurement straight at the replica, one replica at a time, with the cluster otherwise
idle (the numbers are a lone replica's; traffic beside them would be measured too).

Per replica, every request a completion on fresh text (no prefix shared with another
probe, so nothing is served from the prefix cache), each measured point the least of
``repeats`` requests (a busy host only ever adds time):

1. one warm-up request (not measured: first requests pay for lazy initialisation);
2. the **decode step**: lone streamed requests of ``decode_tokens`` output tokens
   (``ignore_eos``), the time between their first and last token over the tokens between;
3. the **per-request slope**: ``batch`` such requests at once, the same step at that
   batch: ``(step_batch − step) / (batch − 1)``;
4. the **prefill rate and overhead**: one-token requests of a short, a middle and a long
   prompt (the long one doubled, up to a third of the context, until its TTFT is
   ``long_over_short`` times the short one's), their TTFTs fitted to the scheduler's own
   model of a lone request, ``overhead + sqrt(step² + (prompt_tokens / rate)²)`` (least
   squares over the rate, the overhead their mean residual). A one-token answer's time is its TTFT.

Replicas are measured one after another, ``settle_s`` apart: a CPU vLLM's engine keeps
polling for about a second after its last request, and on shared cores (the ``vllm-cpu``
preset) the next replica would measure twice as slow.

What the client sees is what is measured (the replica's own histograms are not needed:
a replica that exports none is calibrated the same way); loopback adds well under a
millisecond. Every request is bounded by ``timeout_s``; any failure is a
:class:`~lbtune.errors.ClusterError` naming the replica, and nothing is written.
"""

from __future__ import annotations

import json
import math
import secrets
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import count

import gevent
from prometheus_client.parser import text_string_to_metric_families

from lbtune.errors import ClusterError, ConfigError
from lbtune.loadgen.client import StreamClient
from lbtune.process import probes
from lbtune.records.calibration import Calibration, ReplicaRates, read_calibration
from lbtune.records.endpoints import Endpoints, ReplicaEndpoint
from lbtune.records.quantiles import percentile
from lbtune.records.requests import RequestRecord
from lbtune.safety.secrets import api_key_from_env
from lbtune.scenario import prompts
from lbtune.scenario.request import RequestSpec
from lbtune.targets.haproxy.target import HaproxyTarget

__all__ = [
    "ProbePlan",
    "calibrate",
    "context_length",
    "decode_step_at",
    "fit_prefill",
    "hand_to_scheduler",
    "kv_cache_size",
    "least_ttft",
    "measure_replica",
    "parse_cache_info",
    "steady_state",
]

Progress = Callable[[str], None]


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


@dataclass(frozen=True)
class _Probe:
    prompt_tokens: int
    ttft_s: float
    step_s: float | None
    """Mean time per output token after the first; ``None`` for a one-token request."""
    tail_step_s: float | None = None
    """The same over the second half of the output only: steps when a batch sent at once
    has finished prefilling (its first steps mix decodes with other requests' chunks)."""


class _Prober:
    """One replica's requests, numbered so that every prompt is fresh text."""

    def __init__(self, rep: ReplicaEndpoint, model: str, plan: ProbePlan, key: str | None):
        self.rep, self.model, self.plan = rep, model, plan
        self._key = key
        self._index = count()
        self._seed = plan.seed if plan.seed is not None else secrets.randbits(31)
        self.sent = 0

    def send(
        self, prompt_tokens: int, max_tokens: int, n: int = 1, *, stream: bool = True
    ) -> list[_Probe]:
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

    def _probe(self, rec: RequestRecord | None) -> _Probe:
        if rec is None or rec.outcome != "ok":
            why = "no answer in time" if rec is None else (rec.error or rec.outcome)
            raise ClusterError(
                f"calibrating replica {self.rep.name} ({self.rep.url}): a probe request "
                f"failed: {why}"
            )
        if not rec.stream:  # one token: its time is the whole answer's, empty text or not
            return _Probe(int(rec.prompt_tokens or 0), rec.ended_at - rec.sent_at, None)
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
        return _Probe(int(rec.prompt_tokens or 0), first - rec.sent_at, step, tail)

    def loop(self, prompt_tokens: int, max_tokens: int, until: float) -> list[tuple[float, _Probe]]:
        """Streamed requests one after another on one connection until ``until``
        (monotonic; a request under way then finishes, each bounded by the timeout):
        each one's send time (``time.time()``) and probe."""
        client = StreamClient(self.rep.url, api_key=self._key, timeout_s=self.plan.timeout_s)
        out: list[tuple[float, _Probe]] = []
        try:
            while time.monotonic() < until:
                self.sent += 1
                rec = client.send(self._spec(prompt_tokens, max_tokens, True))
                out.append((rec.sent_at, self._probe(rec)))  # failed: one line, naming it
        finally:
            client.close()
        return out


@dataclass(frozen=True)
class Steady:
    """A replica kept at ``streams`` requests in flight (closed loop)."""

    streams: int
    step_s: float
    """Mean time per output token after the first (the steps it ran, prefills of the
    requests arriving beside it included)."""
    ttft_s: float
    """Median TTFT of a request arriving while the others run."""
    prompt_tokens: int
    """The replica's count of each prompt (the median)."""
    output_tokens: int
    """Each request's output."""
    scrape_s: float | None
    """Median time its ``/metrics`` took to answer meanwhile (None: it answered none with
    200): what a scheduler scraping it waits."""
    requests: int
    """Requests measured (sent after the warm-up)."""
    sent: int


def steady_state(
    rep: ReplicaEndpoint,
    streams: int,
    prompt_tokens: int,
    plan: ProbePlan = ProbePlan(),
    *,
    duration_s: float = 12.0,
    warmup_s: float = 3.0,
    api_key: str | None = None,
) -> Steady:
    """``streams`` closed-loop streams at ``rep`` for ``duration_s`` (fresh text, outputs
    of ``2 × plan.decode_tokens``): what a step and a TTFT are while the replica stays
    busy, as under load. Requests sent in the first ``warmup_s`` are not measured."""
    if not rep.models:
        raise ClusterError(f"replica {rep.name} serves no model: nothing to measure")
    p = _Prober(rep, rep.models[0], plan, api_key)
    start = time.time()
    until = time.monotonic() + duration_s
    jobs = [
        gevent.spawn(p.loop, prompt_tokens, 2 * plan.decode_tokens, until) for _ in range(streams)
    ]
    took: list[float] = []
    scrapes = gevent.spawn(_scrape_times, rep, start + warmup_s, until, took)
    try:
        gevent.joinall(jobs, raise_error=True, timeout=duration_s + plan.timeout_s + 5)
    finally:
        gevent.killall([j for j in [*jobs, scrapes] if not j.ready()], block=True, timeout=5)
    done = [j.value for j in jobs if j.successful() and isinstance(j.value, list)]  # not killed
    probes_ = [x for got in done for t, x in got if t >= start + warmup_s]
    steps = [x.step_s for x in probes_ if x.step_s is not None]
    if not steps:
        raise ClusterError(
            f"calibrating replica {rep.name} ({rep.url}): no request finished in "
            f"{duration_s:g} s at {streams} streams"
        )
    return Steady(
        streams=streams,
        step_s=statistics.fmean(steps),
        ttft_s=percentile([x.ttft_s for x in probes_], 50),
        prompt_tokens=int(percentile([x.prompt_tokens for x in probes_], 50)),
        output_tokens=2 * plan.decode_tokens,
        scrape_s=percentile(took, 50) if took else None,
        requests=len(probes_),
        sent=p.sent,
    )


SCRAPE_EVERY_S = 0.25


def _scrape_times(rep: ReplicaEndpoint, after: float, until: float, out: list[float]) -> None:
    """Into ``out``: how long ``rep``'s ``/metrics`` takes to answer 200, every
    :data:`SCRAPE_EVERY_S` from ``after`` (``time.time()``) until ``until`` (monotonic); it
    may be killed at any point (what it timed so far stays)."""
    url = rep.url.rstrip("/") + "/metrics"
    gevent.sleep(max(0.0, after - time.time()))
    while time.monotonic() < until:
        t0 = time.monotonic()
        status, _ = probes.http_get(url, timeout=5.0)
        if status == 200:
            out.append(time.monotonic() - t0)
        gevent.sleep(SCRAPE_EVERY_S)


def _record(job: gevent.Greenlet) -> RequestRecord | None:
    """A probe's record; None when it did not finish (a killed greenlet's value is the
    GreenletExit that ended it, not a record)."""
    value = job.value if job.successful() else None
    return value if isinstance(value, RequestRecord) else None


def fit_prefill(probes_: Sequence[tuple[int, float]], step_s: float) -> tuple[float, float, float]:
    """``(prefill tokens/s, overhead s, largest relative error)`` of lone requests'
    ``(prompt tokens, TTFT)`` fitted to ``overhead + sqrt(step² + (tokens / rate)²)``.

    Least squares over the rate (a golden-section search on its logarithm, 1 to 10⁸
    tokens/s); for each rate the overhead is the mean residual, kept ≥ 0. Needs two
    prompt lengths: one length alone cannot tell a rate from an overhead."""
    if len({p for p, _ in probes_}) < 2:
        raise ValueError("fit_prefill needs probes of two prompt lengths")

    def overhead(rate: float) -> float:
        return max(0.0, statistics.fmean(t - _lone(p, rate, step_s) for p, t in probes_))

    def sse(log_rate: float) -> float:
        rate = math.exp(log_rate)
        o = overhead(rate)
        return sum((o + _lone(p, rate, step_s) - t) ** 2 for p, t in probes_)

    lo, hi = 0.0, math.log(1e8)
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = sse(a), sse(b)
    for _ in range(80):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = sse(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = sse(b)
    rate = math.exp((lo + hi) / 2)
    o = overhead(rate)
    err = max(abs(o + _lone(p, rate, step_s) - t) / t for p, t in probes_)
    return rate, o, err


def _steps(got: Sequence[_Probe]) -> list[float]:
    return [x.step_s for x in got if x.step_s is not None]


def _lone(tokens: int, rate: float, step_s: float) -> float:
    return math.sqrt(step_s**2 + (tokens / rate) ** 2)


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


def measure_replica(
    rep: ReplicaEndpoint,
    plan: ProbePlan = ProbePlan(),
    *,
    api_key: str | None = None,
    progress: Progress | None = None,
) -> ReplicaRates:
    """The rates of one replica (module docstring)."""
    if not rep.models:
        raise ClusterError(f"replica {rep.name} serves no model: nothing to calibrate")
    model = rep.models[0]
    ctx = context_length(rep, model)
    # lbtune's token counts run below a real tokenizer's (×1.5 on Llama's): a third of the
    # context leaves room; without a context length the long prompt does not grow
    cap = ctx // 3 if ctx else plan.long_tokens
    if plan.max_prompt_tokens is not None:
        cap = min(cap, plan.max_prompt_tokens)
    if min(plan.long_tokens, cap) < 4 * plan.short_tokens:
        raise ConfigError(
            f"replica {rep.name}: its context ({ctx} tokens) is too short to calibrate with "
            f"{plan.short_tokens}-token prompts"
        )
    p = _Prober(rep, model, plan, api_key)
    say = progress or (lambda _m: None)
    say(f"{rep.name}: warm-up, decode step alone and at batch {plan.batch}")
    p.send(plan.short_tokens, 2)
    step, slope = _decode(p, plan)
    rate, overhead, err, longest = _prefill(p, plan, cap, step, say)
    return ReplicaRates(
        name=rep.name,
        model=model,
        url=rep.url,
        prefill_tokens_per_s=rate,
        step_s=step,
        step_per_seq_s=slope,
        overhead_s=overhead,
        probes=p.sent,
        fit_error=err,
        longest_prompt_tokens=longest,
    )


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
    p = _Prober(rep, rep.models[0], plan, api_key)
    out = max(plan.decode_tokens, 8)

    def tails(got: list[_Probe]) -> list[float]:
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
    p = _Prober(rep, rep.models[0], plan, api_key)
    best = min((p.send(prompt_tokens, 1, stream=False)[0] for _ in range(plan.repeats)), key=_ttft)
    return best.prompt_tokens, best.ttft_s


def _decode(p: _Prober, plan: ProbePlan) -> tuple[float, float]:
    """The lone decode step and what each further running request adds to it. The least
    of the repeats: a busy host only ever adds time (shared CPUs, FIELD-NOTES)."""
    short, out = plan.short_tokens, plan.decode_tokens
    step = min(s for _ in range(plan.repeats) for s in _steps(p.send(short, out)))
    if plan.batch < 2:
        return step, 0.0
    at_batch = min(
        percentile(_steps(p.send(short, out, n=plan.batch)), 50) for _ in range(plan.repeats)
    )
    return step, max(0.0, (at_batch - step) / (plan.batch - 1))


def _prefill(
    p: _Prober, plan: ProbePlan, cap: int, step: float, say: Progress
) -> tuple[float, float, float, int]:
    """The prefill rate, the overhead, the fit's error and the longest prompt (the
    replica's count) from one-token requests of a short, a middle and a long prompt (the
    least TTFT of each). The long prompt doubles (up to ``cap``) while its TTFT is under
    ``long_over_short`` times the short one's: a fast engine on a short prompt measures
    only the noise."""

    def least(n: int) -> _Probe:
        return min((p.send(n, 1, stream=False)[0] for _ in range(plan.repeats)), key=_ttft)

    short = least(plan.short_tokens)
    n = min(plan.long_tokens, cap)
    long = least(n)
    while long.ttft_s < plan.long_over_short * short.ttft_s and 2 * n <= cap:
        n *= 2
        long = least(n)
    mid = least((plan.short_tokens + n) // 2)
    say(f"{p.rep.name}: prefill of {short.prompt_tokens}, {mid.prompt_tokens} and "
        f"{long.prompt_tokens} prompt tokens (the replica's count)")  # fmt: skip
    rate, overhead, err = fit_prefill(
        [(x.prompt_tokens, x.ttft_s) for x in (short, mid, long)], step
    )
    return rate, overhead, err, long.prompt_tokens


def _ttft(x: _Probe) -> float:
    return x.ttft_s


def calibrate(
    ep: Endpoints,
    names: Sequence[str] = (),
    plan: ProbePlan = ProbePlan(),
    *,
    progress: Progress | None = None,
) -> Calibration:
    """Measure the named replicas (default: all) one at a time and write the state dir's
    ``calibration.json``, keeping earlier rates of replicas not measured now."""
    known = {r.name: r for r in ep.replicas}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(
            f"--replica {unknown[0]}: no such replica (the cluster has {', '.join(known)})"
        )
    chosen = [known[n] for n in names] if names else list(ep.replicas)
    key = api_key_from_env()
    measured: dict[str, ReplicaRates] = {}
    for i, r in enumerate(chosen):
        if i:
            time.sleep(plan.settle_s)
        measured[r.name] = measure_replica(r, plan, api_key=key, progress=progress)
    before = read_calibration(ep.state_dir)
    kept = [r for r in (before.replicas if before else []) if r.name not in measured]
    if before is not None and before.time_scale != ep.time_scale:
        kept = []  # measured at another time scale: not comparable
    out = Calibration(
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        time_scale=ep.time_scale,
        replicas=sorted([*kept, *measured.values()], key=lambda r: r.name),
    )
    out.write(ep.state_dir)
    return out


def hand_to_scheduler(ep: Endpoints) -> bool:
    """Give the written rates to the running balancer's ``llm`` scheduler (HAProxy's):
    ``True`` when it took them, ``False`` when it runs no such scheduler (the rates wait
    in ``calibration.json`` for an apply that switches it on)."""
    if ep.balancer != "haproxy":
        return False
    return HaproxyTarget(ep).take_rates()
