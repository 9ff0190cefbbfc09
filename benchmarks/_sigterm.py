"""SIGTERM (``timeout``, ``kill``) as an exit that runs ``finally`` blocks: a benchmark
that started a cluster or a server brings it down however it is stopped."""

from __future__ import annotations

import signal


def exit_on_sigterm() -> None:
    def stop(signum: int, frame: object) -> None:
        raise SystemExit(f"terminated by signal {signum}")

    signal.signal(signal.SIGTERM, stop)
