"""A thin ansible-runner wrapper: run a playbook from ``lbtune/data/playbooks/``, keep its
output in a log file, and sum it up as one line per host.

``ansible_runner.run()`` finds ``ansible-playbook`` on ``PATH``: the interpreter's bin dir
(the venv) is put first. The private data dir lives under the state dir
(``<state>/ansible/``, last 5 artifact dirs kept); the full runner output goes to
``<state>/logs/ansible-<time>-<playbook>.log``.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lbtune.errors import ConfigError
from lbtune.resources import playbooks_dir

__all__ = ["PLAYBOOKS_DIR", "HostResult", "PlaybookRun", "check_inventory", "run_playbook"]

PLAYBOOKS_DIR = playbooks_dir()
LOCAL_INVENTORY = PLAYBOOKS_DIR / "inventory" / "local.yml"
_HOST_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
}


@dataclass(frozen=True)
class HostResult:
    host: str
    status: str
    """``ok``, ``changed``, ``failed`` or ``unreachable``."""
    task: str = ""
    """The failing task (failures only)."""
    msg: str = ""
    result: dict[str, Any] = field(default_factory=dict, repr=False)
    """The lbtune module's result, when it ran on this host."""

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "changed")

    def line(self) -> str:
        if not self.ok:
            return f"{self.host}: {self.status.upper()} at task '{self.task}': {self.msg}"
        lb = self.result
        extra = ""
        if lb.get("diff"):
            extra = f" ({len(lb['diff'])} knobs{', reloaded' if lb.get('reloaded') else ''})"
        return f"{self.host}: {self.status}{extra}"


@dataclass(frozen=True)
class PlaybookRun:
    playbook: str
    rc: int
    status: str
    hosts: list[HostResult]
    log_path: Path
    seconds: float
    inventory: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0 and bool(self.hosts) and all(h.ok for h in self.hosts)

    def failure(self) -> str:
        bad = [h.line() for h in self.hosts if not h.ok]
        if not bad and not self.hosts:
            bad = [f"no host of the inventory {self.inventory} ran the play (no balancers in it?)"]
        elif not bad:
            bad = [
                f"ansible-playbook {self.playbook} ended with status {self.status} (rc {self.rc})"
            ]
        return "; ".join(bad) + f" (log: {self.log_path})"


def _msg(res: dict[str, Any]) -> str:
    msg = res.get("msg") or res.get("stderr") or res.get("reason") or res.get("exception") or ""
    return " ".join(str(msg).split())[:500]


def check_inventory(inventory: str | Path) -> None:
    """ConfigError when ``inventory`` is missing or not text (Ansible would only warn,
    find no host and end "successful")."""
    path = Path(inventory)
    if path.is_dir():
        return
    try:
        head = path.read_bytes()  # an inventory file is small
    except FileNotFoundError:
        raise ConfigError(f"inventory {inventory}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"inventory {inventory}: cannot read it ({exc.strerror})") from None
    try:
        if b"\0" in head:
            raise UnicodeDecodeError("utf-8", head, 0, 1, "NUL byte")
        head.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(
            f"inventory {inventory}: not a text file (expected an Ansible YAML or INI inventory)"
        ) from None


def _on_event(hosts: dict[str, HostResult], event: dict[str, Any]) -> bool:
    """ansible-runner's event handler: fold a per-host event into ``hosts`` (the first
    failure kept, ``changed`` sticky, the module's ``lbtune`` result carried on)."""
    status = _HOST_EVENTS.get(event.get("event", ""))
    data = event.get("event_data") or {}
    host = data.get("host")
    if status is None or host is None:
        return True
    res = data.get("res") or {}
    if status == "ok" and res.get("changed"):
        status = "changed"
    prev = hosts.get(host)
    if status == "skipped" and prev is not None:
        return True
    if prev is not None and not prev.ok:
        return True  # keep the first failure
    lb = res.get("lbtune") if isinstance(res.get("lbtune"), dict) else None
    if prev is not None and prev.status == "changed" and status == "ok":
        status = "changed"
    result = lb if lb is not None else (prev.result if prev else {})
    failed = status in ("failed", "unreachable")
    task = str(data.get("task", "")) if failed else ""
    hosts[host] = HostResult(host, status, task, _msg(res) if failed else "", result)
    return True


def run_playbook(
    playbook: str,
    *,
    state_dir: str | Path,
    extravars: dict[str, Any],
    inventory: str | Path | None = None,
    check: bool = False,
    diff: bool = False,
) -> PlaybookRun:
    """Run ``lbtune/data/playbooks/<playbook>`` through ansible-runner; per-host results."""
    import ansible_runner

    check_inventory(inventory or LOCAL_INVENTORY)
    state = Path(state_dir)
    private = state / "ansible"
    private.mkdir(parents=True, exist_ok=True)
    # ansible-runner reuses env/cmdline and env/extravars of the previous run when a call
    # does not pass them: a stale --check or test hook must not leak into this run.
    shutil.rmtree(private / "env", ignore_errors=True)
    (state / "logs").mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_path = state / "logs" / f"ansible-{stamp}-{Path(playbook).stem}.log"
    bindir = str(Path(sys.executable).parent)
    env = {
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_CONFIG": str(PLAYBOOKS_DIR / "ansible.cfg"),
        "ANSIBLE_LIBRARY": str(PLAYBOOKS_DIR / "library"),
        "ANSIBLE_LOCAL_TEMP": str(private / "tmp"),
        "ANSIBLE_HOME": str(private / "home"),
    }
    cmdline = " ".join(x for x, on in (("--check", check), ("--diff", diff)) if on)
    hosts: dict[str, HostResult] = {}
    on_event = functools.partial(_on_event, hosts)

    t0 = time.perf_counter()
    # ansible-runner chdirs and rewrites env; extravars are passed as a file.
    run = ansible_runner.run(
        private_data_dir=str(private),
        project_dir=str(PLAYBOOKS_DIR),
        playbook=str(PLAYBOOKS_DIR / playbook),
        inventory=str(Path(inventory or LOCAL_INVENTORY).absolute()),
        extravars=extravars,
        envvars=env,
        cmdline=cmdline or None,
        quiet=True,
        rotate_artifacts=5,
        event_handler=on_event,
    )
    seconds = time.perf_counter() - t0
    try:
        log_path.write_text(run.stdout.read(), encoding="utf-8")
    except (OSError, AttributeError):
        log_path.write_text(f"(no runner output; status {run.status})\n", encoding="utf-8")
    return PlaybookRun(
        playbook=playbook,
        rc=int(run.rc if run.rc is not None else 1),
        status=str(run.status),
        hosts=list(hosts.values()),
        log_path=log_path,
        seconds=seconds,
        inventory=str(inventory or LOCAL_INVENTORY),
    )
