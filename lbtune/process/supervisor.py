"""Start and stop the cluster's processes by PID, and wait for readiness with deadlines.

Each process runs in its own session (so it outlives the CLI), logs to
``<state>/logs/<name>.log`` and has a PID file ``<state>/<name>.pid`` holding its PID,
create time and command line. A PID is only ever signalled after checking that the
process behind it is still the one we started (same create time and command line);
nothing is ever found or killed by name.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass

import psutil

from lbtune.errors import ClusterError
from lbtune.process import affinity
from lbtune.records.statedir import StatePaths, write_json_atomic

log = logging.getLogger(__name__)

# Popen objects of processes started by this interpreter: kept so that they are reaped
# (no zombies when up() and down() run in one process, e.g. in tests) and never warned
# about as "still running" by Popen.__del__.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
_EXIT_CODES: dict[int, int] = {}


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """What a PID file holds."""

    name: str
    pid: int
    create_time: float
    cmdline: list[str]
    log: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def start(
    name: str,
    cmd: Sequence[str],
    paths: StatePaths,
    env: dict[str, str] | None = None,
    cpus: Collection[int] | None = None,
) -> ProcessRecord:
    """Start ``cmd`` in its own session, output to its log, and write its PID file; on
    ``cpus`` when given (:func:`lbtune.process.affinity.pin`), else where this process runs."""
    log_path = paths.log(name)
    with open(log_path, "ab") as out:
        out.write(f"--- lbtune: starting {' '.join(cmd)}\n".encode())
        out.flush()
        try:
            proc = subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=str(paths.root),
                start_new_session=True,
                close_fds=True,
                env=None if env is None else {**os.environ, **env},
                preexec_fn=affinity.pin(cpus),
            )
        except OSError as exc:
            raise ClusterError(f"Cannot start {name} ({cmd[0]}): {exc}") from None
    _CHILDREN[proc.pid] = proc
    _EXIT_CODES.pop(proc.pid, None)
    try:
        create_time = psutil.Process(proc.pid).create_time()
    except psutil.Error:  # already gone: wait_until reports it with its log
        create_time = 0.0
    record = ProcessRecord(name, proc.pid, create_time, list(cmd), str(log_path))
    write_json_atomic(paths.pid_file(name), record.to_json())
    where = "" if cpus is None else f" on CPUs {sorted(cpus)}"
    log.info("started %s (pid %d%s), log %s", name, proc.pid, where, log_path)
    return record


def read_record(paths: StatePaths, name: str) -> ProcessRecord | None:
    try:
        data = json.loads(paths.pid_file(name).read_text(encoding="utf-8"))
        return ProcessRecord(
            name=str(data["name"]),
            pid=int(data["pid"]),
            create_time=float(data["create_time"]),
            cmdline=[str(a) for a in data["cmdline"]],
            log=str(data["log"]),
        )
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        log.warning("ignoring unreadable PID file %s", paths.pid_file(name))
        return None


def _reap(pid: int) -> None:
    child = _CHILDREN.get(pid)
    if child is not None and (code := child.poll()) is not None:
        _CHILDREN.pop(pid, None)
        _EXIT_CODES[pid] = code


def _process(record: ProcessRecord) -> psutil.Process | None:
    """The live process behind ``record``, or ``None`` if it is gone or is another process.

    Identity is the PID plus its create time (a recycled PID has a later one); the
    program name is checked too once the child has exec'd (HAProxy's master re-executes
    itself with extra arguments on reload: same PID, same create time).
    """
    _reap(record.pid)
    try:
        ps = psutil.Process(record.pid)
        if ps.status() == psutil.STATUS_ZOMBIE:
            return None
        if abs(ps.create_time() - record.create_time) > 0.05:
            return None
        child = _CHILDREN.get(record.pid)
        if child is not None and child.poll() is None:
            return ps  # our own child: it may not have exec'd yet
        cmdline = ps.cmdline()
        if not cmdline or os.path.basename(cmdline[0]) != os.path.basename(record.cmdline[0]):
            return None
        return ps
    except psutil.Error:
        return None


def alive(record: ProcessRecord) -> bool:
    """The process we started is still running (not a recycled PID, not a zombie)."""
    return _process(record) is not None


def send_signal(record: ProcessRecord, sig: int) -> bool:
    """Send ``sig`` to the process we started (identity-checked like :func:`stop`);
    False when it is gone or its PID now belongs to another process."""
    ps = _process(record)
    if ps is None:
        return False
    try:
        ps.send_signal(sig)
    except psutil.Error:
        return False
    return True


def exited(record: ProcessRecord) -> int | None:
    """Exit status when we started it in this interpreter and it has exited."""
    _reap(record.pid)
    return _EXIT_CODES.get(record.pid)


def _gone(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The subset of ``procs`` still running (zombies of our own children are reaped)."""
    out = []
    for p in procs:
        _reap(p.pid)
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def stop(record: ProcessRecord, paths: StatePaths, timeout: float = 10.0) -> list[int]:
    """SIGTERM the process we started (and its descendants), SIGKILL after ``timeout``.

    Returns the PIDs that were signalled; removes the PID file. Idempotent.
    """
    ps = _process(record)
    pids: list[int] = []
    left = _left_behind(record) if ps is None else []
    if ps is not None or left:
        try:
            family = [ps, *ps.children(recursive=True)] if ps is not None else left
        except psutil.Error:
            family = [ps]
        pids = [p.pid for p in family]
        for p in [ps] if ps is not None else left:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        remaining = _gone(family)
        while remaining and time.monotonic() < deadline:
            time.sleep(0.05)
            remaining = _gone(family)
            if ps is None or ps not in remaining:
                # Leader gone: its workers should follow; give them a moment, then insist.
                for p in remaining:
                    with contextlib.suppress(psutil.Error):
                        p.send_signal(signal.SIGTERM)
        for p in _gone(family):
            log.warning("%s (pid %d) did not stop in %.0f s: SIGKILL", record.name, p.pid, timeout)
            with contextlib.suppress(psutil.Error):
                p.kill()
        # Wait only for what still runs: a zombie whose parent is not us (an orphan
        # adopted by init) counts as stopped, however slowly init reaps it.
        psutil.wait_procs(_gone(family), timeout=2.0)
        _reap(record.pid)
        log.info("stopped %s (pid %d)", record.name, record.pid)
    with contextlib.suppress(FileNotFoundError):
        paths.pid_file(record.name).unlink()
    return pids


def _left_behind(record: ProcessRecord) -> list[psutil.Process]:
    """What a dead process we started left running: the processes of the session it led
    (each is started in its own, :func:`start`) created after it, e.g. nginx's workers
    after a SIGKILL of their master. The kernel does not hand out a PID while a session
    of that id has members, so while they run, the id is still ours; a PID already
    recycled (a live process of that number) leaves nothing of ours to find. The dead
    leader may still be a zombie that its parent has not reaped (the process that ran
    ``up`` is still running, and the keeper that relaunches is not that parent): one with
    the record's create time is ours, dead, and its session is searched all the same."""
    try:
        leader = psutil.Process(record.pid)
        dead = leader.status() == psutil.STATUS_ZOMBIE
        if not dead or abs(leader.create_time() - record.create_time) > 0.05:
            return []
    except psutil.ZombieProcess:  # a zombie we cannot tell from a recycled PID's
        return []
    except psutil.NoSuchProcess:
        pass
    except psutil.Error:
        return []
    out = []
    for p in psutil.process_iter(["create_time"]):
        try:
            if (
                p.pid != record.pid
                and os.getsid(p.pid) == record.pid
                and p.info["create_time"] >= record.create_time
            ):
                out.append(p)
        except (OSError, psutil.Error):
            continue
    return out


def log_tail(path: str, lines: int = 3) -> str:
    """The last non-empty lines of a log, joined with ' | ' (for one-line errors)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    tail = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("---")]
    return " | ".join(tail[-lines:])


def wait_until(
    check: Callable[[], str | None],
    timeout: float,
    what: str,
    watch: Sequence[ProcessRecord] = (),
    interval: float = 0.05,
) -> None:
    """Poll ``check`` (``None`` = ready, else what is still missing) until ``timeout``.

    Raises ClusterError naming the log when a watched process exits or time runs out.
    """
    deadline = time.monotonic() + timeout
    while True:
        for rec in watch:
            if not alive(rec):
                code = exited(rec)
                status = f"exited with status {code}" if code is not None else "is not running"
                tail = log_tail(rec.log)
                raise ClusterError(
                    f"{rec.name} {status} while waiting for {what}"
                    + (f": {tail}" if tail else "")
                    + f" (log: {rec.log})"
                )
        missing = check()
        if missing is None:
            return
        if time.monotonic() >= deadline:
            logs = ", ".join(r.log for r in watch)
            raise ClusterError(
                f"Timed out after {timeout:.0f} s waiting for {what}: {missing}"
                + (f" (logs: {logs})" if logs else "")
            )
        time.sleep(interval)


def records(paths: StatePaths) -> list[ProcessRecord]:
    """Every PID file of the state dir, in start order (``down`` stops them in reverse)."""
    found = [r for p in paths.root.glob("*.pid") if (r := read_record(paths, p.stem)) is not None]
    return sorted(found, key=lambda r: (r.create_time, r.name))


class ClusterSupervisor:
    """:class:`lbtune.targets.base.Supervisor` over one state dir.

    ``started`` collects what it starts (the cluster stops those when ``up`` fails);
    ``wait_until`` fails early when any process in ``watch`` or ``started`` dies; what it
    starts runs on ``cpus`` when given (the cluster's CPUs outside its servers' own).
    """

    def __init__(
        self,
        paths: StatePaths,
        started: list[ProcessRecord] | None = None,
        watch: Sequence[ProcessRecord] = (),
        cpus: Collection[int] | None = None,
    ) -> None:
        self.paths = paths
        self.started = started if started is not None else []
        self.watch = list(watch)
        self.cpus = cpus

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.started.append(start(name, argv, self.paths, dict(env) if env else None, self.cpus))

    def wait_until(self, check: Callable[[], str | None], timeout_s: float, what: str) -> None:
        wait_until(check, timeout_s, what, [*self.watch, *self.started])

    def stop(self, name: str) -> None:
        record = read_record(self.paths, name)
        if record is not None:
            stop(record, self.paths)
        self.started[:] = [r for r in self.started if r.name != name]
