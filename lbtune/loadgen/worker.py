"""``python -m lbtune.loadgen.worker``: one Locust process (local, master or worker).

Started by :func:`lbtune.loadgen.runner.run_load` so that gevent's monkey
patching never touches the caller. Reads the run's settings file (``--config``, the
``load-config.json`` the runner wrote: :class:`~lbtune.loadgen.settings.GeneratorSettings`)
and, through it, the run's recorded plan (``run.json``); an invalid settings file is an
error line and exit 2. Writes JSON lines on stdout, one per second per generator process::

    {"type": "sample", ...HealthSample fields..., "open": [[sent_at, ttft, stream], ...]}
    {"type": "final", "worker": ..., "sent": N, "completed": N, "health": {...}}

(a session workload's final line adds ``"sessions": {"started": N, "failed": N,
"calls_abandoned": N}``: sessions a failed call ended, and their calls never sent).

Roles: ``local`` (one process does it all), ``master`` (runs the shape and the
clock, sends no requests) and ``worker`` (sends; connects to a master).
SIGTERM/SIGINT: stop sending, let in-flight requests end for ``grace_s``
(those cut off are recorded as ``cancelled``), write the records, exit 0.

A generator never outlives the process that started it (``--parent-pid``): the kernel
kills it when its parent dies (``PR_SET_PDEATHSIG``, armed before exec by the runner and
again here: :mod:`lbtune.safety.lifeline`), however busy it is, and a watchdog greenlet checks
once a second that its parent is still the one it was started by; when it is not, the
generator stops as on SIGTERM and, should the drain hang, exits hard after ``grace_s`` +
5 s. Started with a parent already gone, it exits 3 at once.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
from dataclasses import asdict
from time import time
from typing import Any

from gevent import monkey

monkey.patch_all()

import gevent  # noqa: E402
import gevent.event  # noqa: E402
from locust.env import Environment  # noqa: E402

from lbtune.errors import ConfigError  # noqa: E402
from lbtune.loadgen.health import WORKER_HEALTH, HealthSample  # noqa: E402
from lbtune.loadgen.sessions import is_sessions  # noqa: E402
from lbtune.loadgen.settings import GeneratorSettings, read_settings  # noqa: E402
from lbtune.loadgen.source import Source, open_source  # noqa: E402
from lbtune.loadgen.user import STATE, AgentUser, LLMUser, OpenLoopUser, PlanShape  # noqa: E402
from lbtune.safety.lifeline import arm  # noqa: E402

_DRAIN = "lbtune_drain"
_MASTER_WAIT_S = 60.0
_DRAINED = "lbtune_drained"
_RECORDS = "lbtune_records"
"""A remote worker's new record lines, shipped to the master (multi-machine runs)."""


class RecordShipper:
    """Sends the whole lines appended to a records file since the last call.

    A worker on another machine writes its records to its own disk; the master's run
    reads only its own records directory. So, each second and once more after the
    drain, the worker ships what it appended (the file's own text, header line
    included) as a Locust message, and the master appends it to
    ``records-remote-<worker>.jsonl`` in its directory: the run's report then holds
    every request any worker sent. Locust delivers one connection's messages in order,
    so the last lines arrive before the worker's ``lbtune_drained``.
    """

    def __init__(self, send: Any) -> None:
        self._send = send
        self._offset = 0

    def ship(self) -> int:
        """Send the new whole lines; returns the bytes sent."""
        writer = STATE.writer
        if writer is None:
            return 0
        writer.flush()
        with writer.path.open("rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            return 0
        self._offset += cut
        self._send(_RECORDS, {"worker": STATE.worker, "text": data[:cut].decode("utf-8")})
        return cut


def receive_records(records_dir: str, data: Any) -> None:
    """The master's side of :class:`RecordShipper`."""
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in str(data["worker"]))
    if os.path.exists(os.path.join(records_dir, f"records-{name}.jsonl")):
        return  # that worker writes into this very directory (one machine, one --out)
    path = os.path.join(records_dir, f"records-remote-{name}.jsonl")
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(str(data["text"]))


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _sample(s: HealthSample) -> None:
    # The open requests at the sample's time ``t``: records flushed just before it hold
    # every request that ended earlier, so the two together are the run at ``t``.
    _emit({"type": "sample", **asdict(s), "open": STATE.open.snapshot()})


def _watch_parent(parent: int, stop: Any, grace: float) -> None:
    """Stop (as on SIGTERM) once ``parent`` is no longer this process's parent; exit hard
    if the drain has not ended ``grace`` + 5 s later."""
    while os.getppid() == parent:
        gevent.sleep(1.0)
    stop.set()
    gevent.sleep(grace + 5.0)
    os._exit(3)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m lbtune.loadgen.worker")
    ap.add_argument("--config", required=True, help="The run's settings file (load-config.json)")
    ap.add_argument("--role", choices=("local", "master", "worker"), default="local")
    ap.add_argument("--worker-index", type=int, default=-1)
    ap.add_argument("--worker-count", type=int, default=1)
    ap.add_argument("--name", default="local")
    ap.add_argument("--run-id", default="")
    ap.add_argument("--parent-pid", type=int, default=0, help="Exit when this parent dies.")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    if args.parent_pid and not arm(args.parent_pid):  # died before it was armed
        _emit({"type": "error", "error": f"parent {args.parent_pid} is gone: not starting"})
        return 3
    try:
        settings = read_settings(args.config)
        source = open_source(settings)  # the run's recorded plan, whole, where there is one
    except ConfigError as exc:
        _emit({"type": "error", "error": str(exc)})
        return 2
    STATE.configure(
        worker=args.name,
        worker_index=max(0, args.worker_index),
        worker_count=max(1, args.worker_count),
        request_timeout_s=settings.request_timeout_s,
        replica_header=settings.replica_header,
        max_in_flight=settings.max_in_flight,
        locust_stats=settings.ui or args.role != "local",
        workload=source.workload,
        plan=source.plan,
    )
    if args.run_id:
        STATE.run_id = args.run_id
    env = _environment(settings, source)
    stop = gevent.event.Event()
    gevent.signal_handler(signal.SIGTERM, stop.set)
    gevent.signal_handler(signal.SIGINT, stop.set)
    if args.parent_pid:
        gevent.spawn(_watch_parent, args.parent_pid, stop, settings.grace_s)
    if args.role == "worker":
        return _run_worker(env, settings, args, stop)
    return _lead(env, settings, args.role, stop, source.duration_s)


def _environment(settings: GeneratorSettings, source: Source) -> Environment:
    """Locust's environment: closed loop, users following the plan's shape (agent users
    for a session workload); open loop, one dispatcher per generator process sending (or
    starting sessions) at the planned times."""
    closed = source.plan.mode == "closed"
    closed_user: Any = AgentUser if is_sessions(source.workload) else LLMUser
    user_cls: Any = closed_user if closed else OpenLoopUser
    user_cls.host = settings.target_url
    return Environment(
        user_classes=[user_cls],
        shape_class=PlanShape(source.plan, source.duration_s) if closed else None,
        host=settings.target_url,
        stop_timeout=settings.grace_s,
    )


def _lead(
    env: Environment, settings: GeneratorSettings, role: str, stop: Any, duration_s: float
) -> int:
    """The local process or the master: it runs the shape and the clock for ``duration_s``
    (or until stopped), then drains (its own requests, or every worker's)."""
    drained: set[str] = set()
    if role == "master":
        runner: Any = env.create_master_runner(settings.master_bind_host, settings.master_port)
        runner.register_message(_DRAINED, lambda msg, **_: drained.add(str(msg.node_id)))
        rdir = settings.records_dir
        runner.register_message(_RECORDS, lambda msg, **_: receive_records(rdir, msg.data))
        if not _workers_ready(runner, settings.expect_workers, stop):
            return 3
    else:
        runner = env.create_local_runner()
        STATE.start(env, settings.records_dir)
        STATE.on_sample.append(_sample)
    if settings.ui:
        env.create_web_ui("127.0.0.1", settings.ui_port or 8089)
    # Fewer, later GC passes: a full collection over Locust's objects stalls the loop
    # (and every time stamp behind it) for milliseconds.
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 1000)
    t0 = time()
    _emit({"type": "started", "t": t0, "role": role})
    if STATE.plan.mode == "closed":
        runner.start_shape()
    else:
        runner.start(settings.expect_workers, spawn_rate=1000)
    stop.wait(timeout=duration_s)
    _emit({"type": "stopping", "t": time(), "elapsed": time() - t0})
    grace = settings.grace_s
    if role == "master":
        runner.send_message(_DRAIN, grace)
        end = time() + grace + 2.0
        while len(drained) < settings.expect_workers and time() < end:
            gevent.sleep(0.05)
        runner.quit()
        return 0
    STATE.drain(grace)
    runner.quit()
    return _final()


def _workers_ready(runner: Any, expect: int, stop: Any) -> bool:
    """The master: wait up to a minute for ``expect`` workers (an error line if too few)."""
    deadline = time() + 60
    while len(runner.clients.ready) < expect and time() < deadline and not stop.is_set():
        gevent.sleep(0.05)
    ready = len(runner.clients.ready)
    if ready < expect:
        _emit({"type": "error", "error": f"only {ready} of {expect} workers connected within 60 s"})
        runner.quit()
        return False
    return True


def _run_worker(
    env: Environment, settings: GeneratorSettings, args: argparse.Namespace, stop: Any
) -> int:
    """A worker: sends what its master's spawn messages ask for, drains on its signal."""
    grace = settings.grace_s
    connected = gevent.event.Event()

    def unless_connected() -> None:
        # Locust's worker runner blocks until its master answers (retrying for 5 min):
        # a stop, or a minute without a master, ends a worker that never got one at once.
        stopped = stop.wait(timeout=_MASTER_WAIT_S)
        if connected.is_set():
            return
        where = f"{settings.master_host}:{settings.master_port}"
        why = "stopped" if stopped else f"no answer within {_MASTER_WAIT_S:g} s"
        _emit({"type": "error", "error": f"master {where} never answered ({why})"})
        os._exit(0 if stopped else 3)

    gevent.spawn(unless_connected)

    go: list[float] = []

    def started(**_: Any) -> None:
        # The load starts when the master's first spawn message arrives, not when this
        # process did: the run's window is anchored here (a worker that waited seconds for
        # its master measured a window that ended before its first request).
        if not go:
            go.append(time())
            _emit({"type": "started", "t": go[0], "role": args.role})

    env.events.test_start.add_listener(started)  # type: ignore[no-untyped-call]  # locust is untyped
    runner: Any = env.create_worker_runner(settings.master_host, settings.master_port)
    connected.set()
    if args.worker_index < 0:  # multi-machine: the master's index, the configured count
        STATE.configure(worker_index=max(0, runner.worker_index))
        STATE.configure(worker=f"{args.name}-{STATE.worker_index}")
    STATE.start(env, settings.records_dir)
    STATE.on_sample.append(_sample)
    # A worker of another machine (no local index) ships its records to the master.
    shipper = RecordShipper(runner.send_message) if args.worker_index < 0 else None
    if shipper is not None:
        STATE.on_sample.append(lambda _s: shipper.ship())

    def drain(msg: Any, **_: Any) -> None:
        def go() -> None:
            STATE.drain(float(msg.data or grace))
            if shipper is not None:
                shipper.ship()
            runner.send_message(_DRAINED, None)

        gevent.spawn(go)

    runner.register_message(_DRAIN, drain)

    def on_signal() -> None:
        stop.wait()
        STATE.drain(grace)
        runner.quit()

    gevent.spawn(on_signal)
    runner.greenlet.join()
    return _final()


def _final() -> int:
    STATE.close()
    mon = STATE.monitor
    health = (
        None if mon is None else WORKER_HEALTH.dump_python(mon.summary(STATE.cap_hits), mode="json")
    )
    _emit(
        {
            "type": "final",
            "worker": STATE.worker,
            "sent": STATE.sent,
            "completed": STATE.completed,
            "records": str(STATE.writer.path) if STATE.writer else None,
            "health": health,
            **_sessions(),
        }
    )
    return 0


def _sessions() -> dict[str, Any]:
    """A session workload's counts (:mod:`lbtune.loadgen.sessions`), for the final line."""
    if not is_sessions(STATE.workload):
        return {}
    started, failed, abandoned = STATE.sessions, STATE.sessions_failed, STATE.calls_abandoned
    return {"sessions": {"started": started, "failed": failed, "calls_abandoned": abandoned}}


if __name__ == "__main__":
    sys.exit(main())
