"""One simulated replica in virtual time: the sim's engine, stepped by the twin's clock.

The live replica (:mod:`lbtune.sim.server`) runs :class:`~lbtune.sim.engine.Engine` in a GPU
loop: while it has work it takes a step, sleeps ``duration x slowdown / time_scale`` and
hands the step's tokens to the waiting responses; a request is added to the engine after
the GPU profile's ``request_overhead_s / time_scale``, and a step that is running when it
arrives does not see it (the batch is fixed at the step's start). :class:`ReplicaSim` does
the same without sleeping: :meth:`start_step` runs the engine's step at once and says when
it ends, the twin delivers its tokens at that time (:meth:`finish_step`) and starts the next.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from lbtune.errors import ConfigError
from lbtune.sim.costmodel import request_overhead_s
from lbtune.sim.engine import (
    Engine,
    EngineConfig,
    InvalidRequest,
    QueueFull,
    SimRequest,
    StepResult,
    UnknownModel,
)
from lbtune.sim.profiles import get_gpu, get_model
from lbtune.sim.textgen import ApiError
from lbtune.twin.fitted import ReplicaFit, engine_parts, expand_tokens, step_cost

__all__ = ["ReplicaSim", "TwinReplica"]


@dataclass(frozen=True)
class TwinReplica:
    """One simulated replica: a GPU profile serving some models (a cluster YAML's
    replica group member, named as ``lbtune cluster up`` names it)."""

    name: str
    gpu: str
    models: tuple[str, ...]
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_waiting: int | None = None
    slowdown: float = 1.0
    """Step durations are multiplied by this (the sim's ``POST /admin/slowdown``)."""
    fit: ReplicaFit | None = None
    """Simulated from measured rates (:mod:`lbtune.twin.fitted`), not from ``gpu``'s profile."""

    def engine_config(self) -> EngineConfig:
        overrides = {
            k: v
            for k in ("max_num_seqs", "max_num_batched_tokens", "max_waiting")
            if (v := getattr(self, k)) is not None
        }
        return EngineConfig(**overrides)


@dataclass(eq=False)
class ReplicaSim:
    """A replica's engine and what the twin keeps about it (a :class:`~lbtune.twin.routing.
    ReplicaView`)."""

    spec: TwinReplica
    time_scale: float
    step_extra_s: float = 0.0
    """Wall seconds added to every step (the host's own time per step, unscaled)."""
    engine: Engine = field(init=False)
    busy: bool = False
    """A step is running (its end is scheduled)."""
    in_flight: int = 0
    ttft_sum_s: float = 0.0
    ttft_count: int = 0
    itl_sum_s: float = 0.0
    itl_count: int = 0
    prompt_tokens_total: int = 0
    queue_sum_s: float = 0.0
    steps: int = 0
    busy_s: float = 0.0
    _factor: float = field(init=False)
    _overhead_s: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        fit = self.spec.fit
        if fit is not None:
            gpu, model, cfg = engine_parts(fit, self.time_scale)
            models = [model]
            self.engine = Engine(gpu, models, cfg, step_cost(fit, self.time_scale))
        else:
            gpu = get_gpu(self.spec.gpu)
            models = [get_model(m) for m in self.spec.models]
            if not models:
                raise ConfigError(f"replica {self.spec.name}: serves no model")
            self.engine = Engine(gpu, models, self.spec.engine_config())
        self._factor = self.spec.slowdown / self.time_scale
        self._overhead_s = {
            m.name: request_overhead_s(gpu, m) / self.time_scale for m in self.engine.models
        }

    # -- ReplicaView -----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def gpu(self) -> str:
        return self.spec.gpu

    @property
    def models(self) -> tuple[str, ...]:
        return self.spec.models

    @property
    def num_running(self) -> int:
        return self.engine.num_running

    @property
    def num_waiting(self) -> int:
        return self.engine.num_waiting

    @property
    def kv_usage(self) -> float:
        return self.engine.kv_usage

    @property
    def kv_capacity_bytes(self) -> int:
        return self.engine.kv_capacity_bytes

    # -- requests ----------------------------------------------------------------------------

    def overhead_s(self, model: str) -> float:
        """Wall seconds between a request's arrival (counted in ``in_flight``) and its
        admission to the engine; a fitted replica's busy overhead while others run."""
        fit = self.spec.fit
        if fit is not None and fit.busy_overhead_s is not None and self.in_flight > 1:
            return fit.busy_overhead_s.value
        return self._overhead_s[model]

    def admit(self, req: SimRequest) -> ApiError | None:
        """Add ``req`` to the engine; the error the server would answer, if any. A fitted
        replica holds the prompt as its own tokenizer counts it."""
        fit = self.spec.fit
        if fit is not None and fit.prompt_token_ratio != 1.0:
            ids = expand_tokens(req.prompt_token_ids, fit.prompt_token_ratio)
            req = dataclasses.replace(req, prompt_token_ids=ids)
        try:
            self.engine.add_request(req)
        except QueueFull:
            return ApiError(429, f"replica {self.name}: waiting queue is full")
        except UnknownModel as exc:
            return ApiError(404, str(exc), "model")
        except InvalidRequest as exc:
            return ApiError(400, str(exc), "messages")
        return None

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    # -- steps -------------------------------------------------------------------------------

    def start_step(self, now: float) -> tuple[float, StepResult] | None:
        """Run the next step if there is work: ``(its end, its result)``; ``None`` when idle
        or stuck (work that cannot be scheduled: it waits for the next change)."""
        if not self.engine.has_work():
            return None
        res = self.engine.step()
        if res.batch_size == 0:
            return None
        wall = res.duration * self._factor + self.step_extra_s
        self.steps += 1
        self.busy_s += wall
        self.busy = True
        return now + wall, res

    def observe_ttft(self, seconds: float, prompt_tokens: int = 0) -> None:
        """A request's first token, ``seconds`` after it reached this replica (its prompt
        counted in ``prompt_tokens_total`` then, as vLLM v1 does)."""
        self.ttft_sum_s += seconds
        self.ttft_count += 1
        self.prompt_tokens_total += prompt_tokens

    def observe_queue(self, seconds: float) -> None:
        """A request scheduled for the first time, ``seconds`` after its admission."""
        self.queue_sum_s += seconds

    def observe_itl(self, seconds: float) -> None:
        """A request's next token, ``seconds`` after its previous one
        (``vllm:inter_token_latency_seconds``)."""
        self.itl_sum_s += seconds
        self.itl_count += 1


def check_models(replicas: Sequence[TwinReplica]) -> None:
    """Every GPU and model profile is known and the models fit (ConfigError otherwise)."""
    for r in replicas:
        ReplicaSim(r, 1.0)
