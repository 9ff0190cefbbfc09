"""nginx as a process: its command line, ``nginx -t``, the master and a graceful reload.

lbtune runs its own master in the foreground (``daemon off``) as the current user:
``nginx -p <state>/nginx -c <state>/nginx/nginx.conf -e stderr``. A reload is SIGHUP to
that master: it re-reads the file, starts new workers, and tells the old ones to stop
accepting and exit once their requests (streams included) have finished. The master is
found through nginx's own pid file and identity-checked (an nginx whose command line
names this config) before it is signalled.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil

from lbtune.errors import ApplyError, DependencyError, TargetError
from lbtune.safety.lifeline import die_with_parent
from lbtune.targets.nginx.config import Site

__all__ = ["argv", "binary", "exporter_binary", "master", "reload", "test_config", "workers"]

INSTALL_HINT = "install it with `sudo apt-get install nginx prometheus-nginx-exporter`"
RELOAD_TIMEOUT_S = 10.0


def _find(name: str) -> str:
    # Debian puts nginx in /usr/sbin, which is not on every user's PATH.
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if found is None:
        raise DependencyError(f"`{name}` not found on PATH; {INSTALL_HINT}")
    return found


def binary() -> str:
    return _find("nginx")


def exporter_binary() -> str:
    return _find("prometheus-nginx-exporter")


def argv(site: Site, conf: Path | None = None) -> list[str]:
    """The master's command line (``conf``: another file, e.g. for ``nginx -t``)."""
    return [binary(), "-p", str(site.prefix), "-c", str(conf or site.conf), "-e", "stderr"]


def test_config(site: Site, conf: Path) -> str | None:
    """``nginx -t`` on ``conf``: ``None`` when nginx accepts it, else nginx's complaint."""
    cmd = [*argv(site, conf), "-t", "-q"]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            preexec_fn=die_with_parent(),
        )
    except subprocess.TimeoutExpired:
        return "`nginx -t` did not finish within 30 s"
    if proc.returncode == 0:
        return None
    lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    # "nginx: [emerg] unknown directive "bogus" in /path/nginx.conf:12"
    found = [ln.split("] ", 1)[-1] for ln in lines if "[emerg]" in ln or "[alert]" in ln]
    return " | ".join((found or lines)[:3]) or f"`nginx -t` exited with {proc.returncode}"


def master(site: Site) -> psutil.Process:
    """The running master of ``site`` (TargetError when none runs)."""
    try:
        pid = int(site.pid_file.read_text(encoding="utf-8").strip())
        proc = psutil.Process(pid)
        cmdline = proc.cmdline()
    except (FileNotFoundError, ValueError, psutil.Error):
        raise TargetError(
            f"No nginx master is running for {site.prefix} (no live pid in {site.pid_file}); "
            "start the cluster with `balancer: nginx`"
        ) from None
    # The master retitles itself "nginx: master process <argv>": match words, not argv[0].
    words = " ".join(cmdline).split()
    if str(site.conf) not in words or not os.path.basename(words[0]).startswith("nginx"):
        raise TargetError(
            f"pid {pid} in {site.pid_file} is not this nginx master ({' '.join(cmdline)!r})"
        )
    return proc


def workers(proc: psutil.Process) -> set[int]:
    """The master's live children (its workers, old ones still draining included)."""
    try:
        return {c.pid for c in proc.children() if c.status() != psutil.STATUS_ZOMBIE}
    except psutil.Error:
        return set()


def _accepting(pids: set[int]) -> set[int]:
    """The workers among ``pids`` that still run and are not shutting down."""
    out = set()
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE and "shutting" not in " ".join(proc.cmdline()):
                out.add(pid)
        except psutil.Error:
            continue
    return out


def reload(site: Site, timeout_s: float = RELOAD_TIMEOUT_S) -> set[int]:
    """SIGHUP the master; return the new workers' PIDs once at least one runs and every
    old worker has stopped accepting (it may still be finishing streams).

    No new worker within ``timeout_s`` means the master refused the file at load time
    (it keeps running the previous one): an ApplyError naming the log.
    """
    proc = master(site)
    old = workers(proc)
    try:
        proc.send_signal(signal.SIGHUP)
    except psutil.Error as exc:
        raise TargetError(f"Cannot signal the nginx master (pid {proc.pid}): {exc}") from None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        new = workers(proc) - old
        # Until an old worker has closed its listeners (it retitles itself "... is
        # shutting down"), it still accepts new requests under the previous config.
        if new and not _accepting(old):
            return new
        time.sleep(0.005)
    if workers(proc) - old:
        return workers(proc) - old
    raise ApplyError(
        f"nginx (master pid {proc.pid}) started no new worker within {timeout_s:g} s after "
        "SIGHUP: it kept the previous config (see the cluster's logs/nginx.log)"
    )
