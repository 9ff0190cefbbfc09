"""The generator processes of one run (``python -m lbtune.loadgen.worker``): started with
the run's settings file, their JSON status lines read into a queue, signalled, killed.

:func:`lbtune.loadgen.runner.run_load` supervises them; nothing here imports Locust.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Collection
from pathlib import Path
from typing import IO, Any

from lbtune.loadgen.settings import GeneratorSettings
from lbtune.process import affinity
from lbtune.safety.lifeline import die_with_parent

__all__ = ["Child", "start_children"]


class Child:
    """One generator process, started in its own session (on ``cpus`` when given: off a
    cluster's pinned servers); its status lines are read by a thread into the run's queue.
    It dies with this process, ``kill -9`` included
    (:func:`lbtune.safety.lifeline.die_with_parent`)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_path: Path,
        lines: queue.Queue[Any],
        cpus: Collection[int] | None = None,
    ):
        self.name = name
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,  # the runner decides when its children stop
            preexec_fn=affinity.pin(cpus, die_with_parent()),  # ... and they never outlive it
        )
        self.log_path = log_path
        self.final: dict[str, Any] | None = None
        self.errors: list[str] = []
        self._t = threading.Thread(target=self._read, args=(lines,), daemon=True)
        self._t.start()

    def _read(self, lines: queue.Queue[Any]) -> None:
        out: IO[bytes] | None = self.proc.stdout
        assert out is not None
        for raw in out:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if msg.get("type") == "final":
                self.final = msg
            elif msg.get("type") == "error":
                self.errors.append(str(msg.get("error")))
            lines.put((self.name, msg))

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def kill_group(self) -> None:
        """SIGKILL the child's whole process group (it leads its own session)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def finish(self) -> int | None:
        self._t.join(timeout=2)
        self._log.close()
        return self.proc.poll()

    def failures(self) -> list[str]:
        """Its error messages, and its log's last line when it exited abnormally."""
        out = [f"{self.name}: {e}" for e in self.errors]
        if self.proc.returncode not in (0, None) or (self.final is None and self.name != "master"):
            try:
                tail = self.log_path.read_bytes()[-4096:].decode(errors="replace")
            except OSError:
                tail = ""
            last = next((ln.strip() for ln in reversed(tail.splitlines()) if ln.strip()), "")
            rc = self.proc.returncode
            out.append(f"{self.name} exited {rc}" + (f": {last[:300]}" if last else ""))
        return out


def start_children(
    role: str,
    workers: int,
    settings: GeneratorSettings,
    settings_path: Path,
    lines: queue.Queue[Any],
) -> list[Child]:
    """The generator processes of ``role`` (``local``: one; ``master``: a master and its
    ``workers`` local workers; ``worker``: this machine's ``max(1, workers)`` workers of a
    remote master, which waits for ``settings.expect_workers``), started on
    ``settings.cpus`` with ``settings`` (written in ``settings_path``), their status lines
    going to ``lines``, their logs beside it."""
    rdir = settings_path.parent
    expect, cpus = settings.expect_workers, settings.cpus
    n_local = workers if role != "local" else 0
    run_id = uuid.uuid4().hex[:8]
    base = [sys.executable, "-m", "lbtune.loadgen.worker", "--config", str(settings_path)]
    base += ["--run-id", run_id, "--parent-pid", str(os.getpid())]
    children: list[Child] = []
    if role in ("local", "master"):
        name = "local" if role == "local" else "master"
        argv = [*base, "--role", role, "--name", name]
        children.append(Child(name, argv, rdir / f"{name}.log", lines, cpus))
    for k in range(n_local if role == "master" else (max(1, workers) if role == "worker" else 0)):
        wname = f"w{k}"
        idx = ["--worker-index", str(k)] if role == "master" else []
        children.append(
            Child(
                wname,
                [*base, "--role", "worker", "--name", wname, *idx, "--worker-count", str(expect)],
                rdir / f"{wname}.log",
                lines,
                cpus,
            )
        )
    return children
