"""HAProxy's master CLI (``-S master.sock``): hitless reload and the worker's identity.

From Python the master socket needs ``shutdown(SHUT_WR)`` after the command, and it
refuses connections for a few ms right after a reload: both are handled here. A reload
is confirmed by the runtime socket answering from a new worker PID (``show info``).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from lbtune.errors import ApplyError, TargetError
from lbtune.targets.haproxy.runtime import HaproxyRuntime

__all__ = ["master_command", "reload", "reload_count", "worker_pid"]


def master_command(master_socket: str, command: str, timeout_s: float = 5.0) -> str:
    """Send one command to the master CLI and return its reply (retrying briefly while the
    master is busy re-executing itself)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout_s)
                s.connect(master_socket)
                s.sendall(command.encode() + b"\n")
                s.shutdown(socket.SHUT_WR)
                chunks = []
                while data := s.recv(65536):
                    chunks.append(data)
                return b"".join(chunks).decode(errors="replace")
        except (ConnectionRefusedError, FileNotFoundError, ConnectionResetError) as exc:
            if time.monotonic() > deadline:
                raise TargetError(
                    f"HAProxy master socket {master_socket} does not answer ({exc}); "
                    f"command: {command}"
                ) from None
            time.sleep(0.005)
        except OSError as exc:
            raise TargetError(f"HAProxy master socket {master_socket}: {exc}") from None


def worker_pid(runtime: HaproxyRuntime) -> int:
    """The PID of the worker answering the runtime socket."""
    text = runtime.execute(["show info"])[0]
    for line in text.splitlines():
        if line.startswith("Pid:"):
            return int(line.split(":", 1)[1])
    raise TargetError(f"HAProxy ({runtime.socket_path}): no Pid in `show info`")


def reload_count(master_socket: str) -> int:
    """The master's reload counter (``show proc``: the master's ``<reloads>`` column)."""
    text = master_command(master_socket, "show proc")
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "master":
            return int(parts[2])
    raise TargetError(f"HAProxy master socket {master_socket}: no master in `show proc`")


NEW_WORKER_STREAK = 5
"""Consecutive runtime answers from the new worker that end a reload."""


def reload(
    master_socket: str, runtime: HaproxyRuntime, log_hint: Path | None = None, timeout_s: float = 10
) -> int:
    """Hitless reload; returns the new worker PID once it answers the runtime socket.

    A worker that does not change within ``timeout_s`` means HAProxy refused the new
    config at load time and kept the old one: an ApplyError.
    """
    old = worker_pid(runtime)
    master_command(master_socket, "reload")
    deadline = time.monotonic() + timeout_s
    # Until the old worker lets go of the runtime socket (soft-stop), either process may
    # answer a new connection: only several new-worker answers in a row mean it is gone.
    streak, new = 0, None
    while time.monotonic() < deadline:
        try:
            pid = worker_pid(runtime)
        except TargetError:
            pid = old
        if pid != old:
            streak = streak + 1 if pid == new else 1
            new = pid
            if streak >= NEW_WORKER_STREAK:
                return pid
        else:
            streak = 0
        time.sleep(0.01)
    if new is not None:
        return new
    where = f" (see {log_hint})" if log_hint else ""
    raise ApplyError(
        f"HAProxy did not start a new worker within {timeout_s:g} s after `reload`: it kept "
        f"the previous config{where}"
    )
