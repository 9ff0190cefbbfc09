"""The requests of a run as the twin needs them: each built once, shared by every trial.

Request ``i`` is the scenario's :class:`~lbtune.scenario.request.RequestSpec` (a pure
function of the scenario, the seed and ``i``), plus what the replica makes of it: the body
the load generator sends (``json.dumps`` as :mod:`lbtune.loadgen.client` writes it), the
prompt token ids and the output length the simulated server derives from that body
(:func:`lbtune.sim.textgen.parse_request`, the server's own parser, with the cluster's
seed). A :class:`RequestSource` caches them, so that many virtual trials of one plan pay
for the scenario's text and the tokenizer once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property

from lbtune.errors import ConfigError
from lbtune.scenario.request import RequestSpec
from lbtune.scenario.runplan import RunPlan
from lbtune.scenario.workload import build_workload, has_sessions
from lbtune.sim.profiles import MODEL_PROFILES
from lbtune.sim.textgen import ApiError, ParsedRequest, parse_request

__all__ = ["RequestSource", "TwinRequest", "check_twinnable"]


class TwinRequest:
    """One request of the scenario: what the client sends and what the replica parses.

    Implements :class:`~lbtune.twin.routing.RequestView`."""

    __slots__ = ("__dict__", "_host_seed", "spec")

    def __init__(self, spec: RequestSpec, host_seed: int) -> None:
        self.spec = spec
        self._host_seed = host_seed

    @property
    def index(self) -> int:
        return self.spec.index

    @property
    def model(self) -> str:
        return self.spec.model

    @property
    def api(self) -> str:
        return self.spec.api

    @property
    def stream(self) -> bool:
        return self.spec.stream

    @property
    def session_id(self) -> str | None:
        return None  # lbtune's client sends no x-session-id header

    @cached_property
    def body(self) -> bytes:
        return json.dumps(self.spec.body(), separators=(",", ":")).encode()

    @cached_property
    def prompt_text(self) -> str:
        """The first chat message's content, or the completion's prompt (what HAProxy's
        ``json_query('$.messages[0].content')`` / ``$.prompt`` reads)."""
        if self.spec.api == "chat":
            msgs = self.spec.messages or ()
            return msgs[0].get("content", "") if msgs else ""
        return self.spec.prompt or ""

    @cached_property
    def parsed(self) -> ParsedRequest | ApiError:
        """What the simulated server makes of the body (or the error it answers); the
        model's own context length, as every replica serving it has."""
        profile = MODEL_PROFILES.get(self.spec.model)
        if profile is None:
            return ApiError(404, f"The model `{self.spec.model}` does not exist.", "model")
        ctx = profile.context_length
        try:
            return parse_request(
                self.spec.api,
                self.spec.body(),
                (self.spec.model,),
                lambda _m: ctx,
                self._host_seed,
            )
        except ApiError as err:
            return err

    @property
    def prompt_ids(self) -> list[int]:
        p = self.parsed
        return p.prompt_ids if isinstance(p, ParsedRequest) else []

    @property
    def prompt_tokens(self) -> int:
        p = self.parsed
        return len(p.prompt_ids) if isinstance(p, ParsedRequest) else self.spec.prompt_tokens


def check_twinnable(plan: RunPlan) -> None:
    """Refuse (``ConfigError``) a plan whose traffic the twin does not model: sessions
    (an ``agent`` block or an agentic trace), whose calls are caused by answers, not placed
    in the sequence."""
    sc = plan.scenario
    if has_sessions(sc):
        what = "agent sessions" if sc.source is None else f"a {sc.source.format} trace's sessions"
        raise ConfigError(
            f"scenario {sc.name!r} has {what}: the twin cannot screen them yet; "
            "run optimize with --screen 0"
        )


@dataclass
class RequestSource:
    """Request ``i`` of a run plan, built on first use and kept."""

    plan: RunPlan
    host_seed: int = 0
    """The cluster's seed (the sim host's ``seed``): output lengths drawn by the server."""

    def __post_init__(self) -> None:
        check_twinnable(self.plan)
        self._workload = build_workload(self.plan.scenario, self.plan.seed, self.plan.tokenizer)
        self._cache: dict[int, TwinRequest] = {}

    def __getitem__(self, i: int) -> TwinRequest:
        req = self._cache.get(i)
        if req is None:
            req = TwinRequest(self._workload.request(i), self.host_seed)
            self._cache[i] = req
        return req

    def __len__(self) -> int:
        return len(self._cache)
