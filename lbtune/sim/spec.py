"""What one simulated replica is: the contract between the cluster and the sim host.

``lbtune cluster up`` writes a JSON file holding a :class:`HostSpec` and starts
``python -m lbtune.sim --spec FILE``; the host serves every replica listed on its
own port, all in one process (this machine has 2 cores).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ReplicaSpec(BaseModel):
    """One simulated GPU running one vLLM-like engine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Replica name, e.g. 'h100-0'; used in metrics and headers.")
    port: int = Field(ge=1, le=65535)
    gpu: str = Field(description="GPU profile name, e.g. 'h100-80g' (see lbtune.sim.profiles).")
    models: list[str] = Field(
        min_length=1,
        description="Served model names (model profile names, e.g. 'llama-3.1-8b-instruct').",
    )
    max_num_seqs: int | None = Field(default=None, ge=1, le=65_536)
    max_num_batched_tokens: int | None = Field(default=None, ge=16, le=16_777_216)
    max_waiting: int | None = Field(
        default=None,
        ge=0,
        le=10_000_000,
        description="Waiting-queue limit; above it requests get 429.",
    )
    startup_s: float = Field(
        default=0.0,
        ge=0,
        le=3600,
        description="Wall-clock seconds the replica answers 503 after its port opens "
        "(a stand-in for model loading).",
    )


class HostSpec(BaseModel):
    """Everything one sim host process serves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    time_scale: float = Field(
        default=1.0, gt=0, le=1000, description="4 = four times faster than real."
    )
    seed: int = Field(default=0, ge=0, lt=2**63)
    ground_truth_path: str | None = Field(
        default=None, description="JSONL file receiving one ground-truth line per request."
    )
    replicas: list[ReplicaSpec] = Field(min_length=1)
