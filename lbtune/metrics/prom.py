"""A thin Prometheus client over ``prometheus_api_client.PrometheusConnect``.

It adds what lbtune needs on top: a bounded readiness check (:meth:`PromClient.check`
answers within ``timeout_s``), no silent retries, instant queries at a given time,
results as plain :class:`Sample` values, and errors a user can act on
(:class:`~lbtune.errors.TargetError`, with the PromQL when a query fails).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from lbtune.errors import TargetError

log = logging.getLogger(__name__)


class PrometheusUnreachable(TargetError):
    """Prometheus did not answer (refused, timed out, connection lost)."""


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float | None
    """``None`` for NaN / ±Inf (e.g. ``0/0`` or a quantile of an empty histogram)."""


class Querier(Protocol):
    """What :func:`lbtune.metrics.serverside.collect` needs from a client."""

    def query(self, promql: str, at: float | None = None) -> list[Sample]: ...


class PromClient:
    """``PromClient(url, timeout_s=5)``; every request is bounded by ``timeout_s``."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        # No retries: a dead Prometheus must be reported within timeout_s, not after
        # the library's default retries with back-off.
        self._conn = PrometheusConnect(
            self.url, disable_ssl=True, retry=Retry(total=0), timeout=timeout_s
        )

    def _unreachable(self, exc: BaseException) -> PrometheusUnreachable:
        reason = type(exc).__name__
        return PrometheusUnreachable(
            f"Prometheus at {self.url} is unreachable ({reason}): start it with "
            "`lbtune cluster up` or pass --prometheus URL"
        )

    def check(self) -> None:
        """Raise :class:`TargetError` within ``timeout_s`` unless Prometheus answers."""
        half = self.timeout_s / 2
        try:
            self._raw("vector(1)", None, timeout=(half, half))
        except PrometheusUnreachable:
            raise
        except TargetError as exc:
            raise TargetError(
                f"{self.url} does not answer like a Prometheus server ({exc}): "
                "pass the URL of Prometheus with --prometheus URL"
            ) from exc

    def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """Instant query (at Unix time ``at``, default now) returning a vector."""
        return [_sample(item, promql) for item in self._raw(promql, at)]

    def _raw(self, promql: str, at: float | None, timeout: Any = None) -> list[Any]:
        import requests
        from prometheus_api_client.exceptions import PrometheusApiClientException

        params = {} if at is None else {"time": f"{at:.3f}"}
        try:
            result = self._conn.custom_query(promql, params=params, timeout=timeout)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise self._unreachable(exc) from exc
        except PrometheusApiClientException as exc:
            raise TargetError(f"Prometheus query failed ({_short(str(exc))}): {promql}") from exc
        except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
            raise TargetError(
                f"unexpected answer from {self.url} ({type(exc).__name__}) to: {promql}"
            ) from exc
        if not isinstance(result, list) or any(not isinstance(x, dict) for x in result):
            raise TargetError(f"Prometheus query did not return a vector: {promql}")
        return result


def _sample(item: Mapping[str, Any], promql: str) -> Sample:
    try:
        labels = {str(k): str(v) for k, v in item.get("metric", {}).items()}
        value = float(item["value"][1])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise TargetError(f"malformed sample {item!r} for: {promql}") from exc
    return Sample(labels=labels, value=value if math.isfinite(value) else None)


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
