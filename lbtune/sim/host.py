"""Several simulated replicas in one process: ``python -m lbtune.sim`` and the test API.

:class:`SimHost` starts one :class:`~lbtune.sim.server.Replica` per
:class:`~lbtune.sim.spec.ReplicaSpec` of a :class:`~lbtune.sim.spec.HostSpec`, each
on its own port, all in the current event loop, sharing one ground-truth log::

    async with SimHost(spec) as host:
        print(host.urls)            # {"h100-0": "http://127.0.0.1:8001", ...}
        await host.wait_closed()    # until host.close() (the CLI: SIGTERM/SIGINT)

Nothing is left listening when a port is busy: every site already opened is
closed and :class:`lbtune.errors.ClusterError` names the port (the CLI exits 3).

For tests and scripts, :func:`run_in_thread` runs a host in a background thread
with its own event loop and returns a :class:`HostThread` (``.urls``,
``.ports``, ``.stop()``; also a context manager), so a blocking client such as
``openai.OpenAI`` can talk to it from the main thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from aiohttp import web

from lbtune.errors import ClusterError
from lbtune.sim.groundtruth import GroundTruthLog
from lbtune.sim.server import Replica
from lbtune.sim.spec import HostSpec

SHUTDOWN_GRACE_S = 1.0
"""On close, in-flight responses get this long to finish; then they are cancelled
(aborted in the engine, ground truth status 499)."""


class SimHost:
    """Every replica of a :class:`HostSpec`, served from the running event loop."""

    def __init__(self, spec: HostSpec) -> None:
        self.spec = spec
        self.ground_truth = GroundTruthLog(spec.ground_truth_path)
        self.replicas = [
            Replica(r, time_scale=spec.time_scale, seed=spec.seed, ground_truth=self.ground_truth)
            for r in spec.replicas
        ]
        self._runners: list[web.AppRunner] = []
        self._closed: asyncio.Event | None = None

    @property
    def ports(self) -> dict[str, int]:
        return {r.name: r.spec.port for r in self.replicas}

    @property
    def urls(self) -> dict[str, str]:
        return {r.name: f"http://{self.spec.host}:{r.spec.port}" for r in self.replicas}

    def replica(self, name: str) -> Replica:
        for r in self.replicas:
            if r.name == name:
                return r
        raise KeyError(name)

    async def start(self) -> None:
        """Bind every port (all or nothing), then start the replicas' GPU loops."""
        self._closed = asyncio.Event()
        try:
            for r in self.replicas:
                runner = web.AppRunner(
                    r.app,
                    handler_cancellation=True,
                    access_log=None,
                    shutdown_timeout=SHUTDOWN_GRACE_S,
                )
                await runner.setup()
                self._runners.append(runner)
                r.on_crash = self._stopper(runner)
                site = web.TCPSite(runner, self.spec.host, r.spec.port, backlog=1024)
                try:
                    await site.start()
                except OSError as exc:
                    raise ClusterError(
                        f"Replica {r.name!r} cannot listen on {self.spec.host}:{r.spec.port}: "
                        f"{exc.strerror or exc}. Stop what uses the port or pick another one."
                    ) from None
        except BaseException:
            await self._cleanup_runners()
            raise
        for r in self.replicas:
            r.start()
        self.ground_truth.start()

    async def close(self) -> None:
        """Stop serving, stop the GPU loops and flush the ground truth."""
        for r in self.replicas:
            r.state = "draining"
        await self._cleanup_runners()
        for r in self.replicas:
            await r.stop()
        await self.ground_truth.aclose()
        if self._closed is not None:
            self._closed.set()

    async def wait_closed(self) -> None:
        if self._closed is not None:
            await self._closed.wait()

    def _stopper(self, runner: web.AppRunner) -> Callable[[], Awaitable[None]]:
        async def stop() -> None:
            if runner in self._runners:
                self._runners.remove(runner)
            with contextlib.suppress(Exception):
                await runner.cleanup()

        return stop

    async def _cleanup_runners(self) -> None:
        runners, self._runners = self._runners, []
        for runner in runners:
            with contextlib.suppress(Exception):
                await runner.cleanup()

    async def __aenter__(self) -> SimHost:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class HostThread:
    """A :class:`SimHost` running in a daemon thread with its own event loop."""

    def __init__(self, spec: HostSpec) -> None:
        self.spec = spec
        self.host = SimHost(spec)
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="lbtune-sim", daemon=True)

    @property
    def ports(self) -> dict[str, int]:
        return self.host.ports

    @property
    def urls(self) -> dict[str, str]:
        return self.host.urls

    def start(self, timeout: float = 10.0) -> HostThread:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise ClusterError(f"sim host did not start within {timeout} s")
        if self._error is not None:
            raise self._error
        return self

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` in the host's loop and return its result (thread-safe)."""

        async def _call() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(_call(), self.loop).result(10)

    def stop(self, timeout: float = 10.0) -> None:
        if self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        try:
            await self.host.start()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self.host.close()

    def __enter__(self) -> HostThread:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def run_in_thread(spec: HostSpec, timeout: float = 10.0) -> HostThread:
    """Start every replica of ``spec`` in a background thread; ``.stop()`` ends them."""
    return HostThread(spec).start(timeout)
