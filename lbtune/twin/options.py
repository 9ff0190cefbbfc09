"""The twin's settings: the cluster's time scale, the client's limits, the small delays of
the live path that the engine's cost model does not hold."""

from __future__ import annotations

from dataclasses import dataclass

from lbtune.errors import ConfigError
from lbtune.loadgen.runner import LoadConfig

__all__ = ["TwinOptions"]


@dataclass(frozen=True)
class TwinOptions:
    """How one virtual run is made (every time in wall seconds of the live run)."""

    time_scale: float = 1.0
    """The cluster's ``time_scale``: engine steps and the per-request overhead are divided
    by it, as the live sim host divides its sleeps."""
    host_seed: int = 0
    """The cluster's ``seed``: the sim server's output-length draws (``ignore_eos`` off)."""
    seed: int = 0
    """The routing model's random draws (random(N), tie-breaks)."""
    grace_s: float = LoadConfig.grace_s
    """After the duration, how long requests in flight may finish before they are cut."""
    request_timeout_s: float = LoadConfig.request_timeout_s
    max_in_flight: int = LoadConfig.max_in_flight
    to_replica_s: float = 0.0005
    """Client → balancer → replica, one way (loopback, HAProxy), unscaled."""
    to_client_s: float = 0.0003
    """Replica → balancer → client for one chunk, unscaled."""
    server_extra_s: float = 0.0
    """Per request, beyond the GPU profile's overhead: the sim server's own parsing."""
    step_extra_s: float = 0.0
    """Per engine step: the sim host's own time, unscaled."""
    user_start_gap_s: float = 0.00025
    """Closed loop: between the starts of users the shape adds at once (measured live)."""
    chunk_times: bool = True
    """Keep every chunk's arrival (the ITL figures); off keeps the first and the last."""

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise ConfigError(f"twin: time_scale must be > 0, got {self.time_scale}")
        for name in (
            "grace_s",
            "to_replica_s",
            "to_client_s",
            "server_extra_s",
            "step_extra_s",
            "user_start_gap_s",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"twin: {name} must be >= 0, got {getattr(self, name)}")
        if not self.request_timeout_s > 0:
            raise ConfigError(f"twin: request_timeout_s must be > 0, got {self.request_timeout_s}")
