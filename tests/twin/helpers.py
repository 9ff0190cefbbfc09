"""Small plans and clusters for the twin's tests (no servers, no sockets)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lbtune.cluster.config import load_config
from lbtune.cluster.resolve import resolve
from lbtune.run.plan import plan_run
from lbtune.run.stress import StressOptions
from lbtune.scenario.runplan import RunPlan
from lbtune.twin.replica import TwinReplica

M8 = "llama-3.1-8b-instruct"
M70 = "llama-3.1-70b-instruct-awq"


def cluster_replicas(preset: str) -> list[TwinReplica]:
    """A preset's replicas, named as ``lbtune cluster up`` names them."""
    cfg, _ = load_config(preset)
    ports = itertools.count(30000)
    rc = resolve(cfg, pick_port=lambda: next(ports))
    return [TwinReplica(r.name, r.gpu or "", r.models) for r in rc.replicas]


def scenario_file(tmp: Path, **fields: Any) -> Path:
    """A scenario YAML with short fixed-size chat requests, ``fields`` overriding."""
    doc: dict[str, Any] = {
        "name": "tiny",
        "seed": 7,
        "duration_s": 20,
        "warmup_s": 2,
        "cooldown_s": 1,
        "load": {"type": "constant", "users": 3},
        "api": "chat",
        "models": {M8: 1},
        "prompt_tokens": {"type": "fixed", "value": 64},
        "output_tokens": {"type": "fixed", "value": 32},
        "stream": True,
    }
    doc.update(fields)
    path = tmp / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def plan(scenario: str | Path, duration_s: float | None = None, **kw: Any) -> RunPlan:
    return plan_run(StressOptions(scenario=str(scenario), duration_s=duration_s, **kw))


@dataclass
class Req:
    """A request as a balancer sees it (a :class:`lbtune.twin.routing.RequestView`)."""

    index: int
    model: str = M8
    prompt_text: str = "hello"
    body: bytes = b'{"model":"m","messages":[{"role":"user","content":"hello"}]}'
    api: str = "chat"
    stream: bool = True
    prompt_tokens: int = 10
    session_id: str | None = None
    prompt_ids: tuple[int, ...] = ()


def chat_body(content: str, model: str = M8) -> bytes:
    """A chat body as lbtune's client writes it."""
    head = '{"model":"' + model + '","max_tokens":8,"messages":[{"role":"user","content":"'
    return (head + content + '"}]}').encode()
