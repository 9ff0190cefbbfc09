"""The HAProxy target: parameters → balancer state, implemented once.

Both paths call :meth:`HaproxyTarget.apply`: the direct one (optimizer trials, ~ms) and
the Ansible module ``playbooks/library/lbtune_haproxy.py`` (``lbtune apply``).

An apply:

1. validates the parameters against the space and completes them with what is live;
2. renders ``haproxy.cfg`` from the full set (weights and maxconn included: one source of
   truth) and decides what changed — live knobs (runtime API), agent knobs (agent.yaml)
   or structural knobs (reload);
3. structural: ``haproxy -c -q`` on a side file *before* the live file is replaced (a
   rejected config is a :class:`RejectedBeforeApply` with HAProxy's words and nothing is
   touched), dump ``show servers state`` to the server-state-file, replace the file,
   reload through the master socket and wait for the new worker;
4. sets weights/maxconn through the runtime API (every backend a server is in);
5. reads back: runtime weights and maxconn, the config file's hash, the new worker.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from lbtune.cluster import render
from lbtune.cluster.state import Endpoints
from lbtune.errors import ApplyError, TargetError
from lbtune.targets.base import ApplyResult, ParamSet, ParamValue, RejectedBeforeApply
from lbtune.targets.haproxy import config, master
from lbtune.targets.haproxy.runtime import HaproxyRuntime
from lbtune.targets.space import ParameterSpace

__all__ = ["SPACE_FILE", "HaproxyTarget"]

log = logging.getLogger(__name__)

SPACE_FILE = Path(__file__).with_name("space.yaml")
RECORD_NAME = "haproxy-params.json"
AGENT_FILE = "agent.yaml"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".lbtune-tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class HaproxyTarget:
    """``HaproxyTarget(endpoints)``: the embedded (or any local) HAProxy as a tunable target.

    ``template_overrides`` replaces template variables after the knobs are mapped (a test
    hook: e.g. ``{"haproxy_timeout_queue": "bogus"}`` renders a config HAProxy rejects).
    """

    name = "haproxy"

    def __init__(
        self,
        endpoints: Endpoints,
        *,
        space_file: str | Path | None = None,
        template_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.state_dir = Path(endpoints.state_dir)
        self.space_file = Path(space_file) if space_file else SPACE_FILE
        self.template_overrides = dict(template_overrides or {})
        self.runtime = HaproxyRuntime(endpoints.runtime_socket)
        self.cfg_path = Path(endpoints.haproxy_cfg)
        self.record_path = self.state_dir / RECORD_NAME
        self._space: ParameterSpace | None = None

    def __repr__(self) -> str:
        return f"HaproxyTarget({self.state_dir})"

    # -- space & read-back -------------------------------------------------------------

    def space(self) -> ParameterSpace:
        if self._space is None:
            self._space = ParameterSpace.load(
                self.space_file, replicas=[r.name for r in self.endpoints.replicas]
            )
        return self._space

    def _record(self) -> dict[str, Any] | None:
        """What lbtune last applied, if haproxy.cfg is still the file it wrote."""
        try:
            rec: dict[str, Any] = json.loads(self.record_path.read_text(encoding="utf-8"))
            cfg = self.cfg_path.read_text(encoding="utf-8")
        except (FileNotFoundError, ValueError):
            return None
        return rec if rec.get("cfg_sha256") == _sha(cfg) else None

    def _runtime_values(self) -> tuple[dict[str, int], dict[str, int], dict[str, list[str]]]:
        """(weights, maxconn, backends per server) from the runtime API."""
        states = self.runtime.servers_state()
        rows: dict[str, list[str]] = {}
        for s in states:
            rows.setdefault(s.server, []).append(s.backend)
        all_be = self.endpoints.all_backend
        weights = {s.server: s.weight for s in states if s.backend == all_be}
        maxconn = {
            s.server: int(s.raw.get("slim") or 0)
            for s in self.runtime.stat()
            if s.backend == all_be
        }
        return weights, maxconn, rows

    def read_live(self) -> ParamSet:
        """Weights and maxconn from the runtime API; the other knobs from lbtune's record of
        the config it wrote (the baseline when haproxy.cfg is not lbtune's)."""
        space = self.space()
        rec = self._record()
        base = dict(rec["params"]) if rec else {}
        weights, maxconn, _ = self._runtime_values()
        live: ParamSet = {k: v for k, v in base.items() if k in space.params}
        for server, w in weights.items():
            live[f"weight.{server}"] = w
        for server, m in maxconn.items():
            live[f"maxconn.{server}"] = m
        return space.complete({}, live)

    # -- apply ---------------------------------------------------------------------------

    def plan(self, params: Mapping[str, object]) -> tuple[ParamSet, ParamSet, str, bool, bool]:
        """(desired, live, desired config text, reload needed, config file differs)."""
        space = self.space()
        checked = space.validate(params)
        live = self.read_live()
        desired = space.complete(checked, live)
        text = config.render_config(self.endpoints, desired, self.template_overrides)
        try:
            current = self.cfg_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            current = ""
        changed = [k for k in desired if desired[k] != live.get(k)]
        needs_reload = config.structure(text) != config.structure(current) or any(
            config.kind_of(k, desired) == "structural" for k in changed
        )
        return desired, live, text, needs_reload, text != current

    def apply(self, params: Mapping[str, object], *, check: bool = False) -> ApplyResult:
        t0 = time.perf_counter()
        desired, live, text, needs_reload, file_differs = self.plan(params)
        diff: dict[str, tuple[ParamValue | None, ParamValue | None]] = {
            k: (live.get(k), v) for k, v in desired.items() if live.get(k) != v
        }
        if check or not (diff or file_differs):
            return ApplyResult(
                changed=bool(diff or file_differs),
                applied=desired if check else live,
                diff=diff,
                reloaded=needs_reload and check,
                check=check,
                seconds=time.perf_counter() - t0,
            )
        if needs_reload:
            self._validate(text)
            self._reload_with(text)
        self._set_runtime(desired)
        if not needs_reload and file_differs:
            _write_atomic(self.cfg_path, text)  # weights/maxconn only: no reload needed
        if (
            any(k.startswith(config.AGENT_PREFIX) for k in diff)
            or not (self.state_dir / AGENT_FILE).exists()
        ):
            self._write_agent(desired)
        self._write_record(desired, text)
        applied = self.verify(desired, text)
        return ApplyResult(
            changed=True,
            applied=applied,
            diff=diff,
            reloaded=needs_reload,
            seconds=time.perf_counter() - t0,
        )

    def rollback(self) -> ApplyResult:
        """Re-apply the last known good (``lbtune.apply.lkg``)."""
        from lbtune.apply.lkg import LkgStore

        lkg = LkgStore(self.state_dir, self.name).get()
        if lkg is None:
            raise ApplyError(f"No last known good recorded for haproxy in {self.state_dir}")
        return self.apply(lkg.params)

    def verify(self, desired: ParamSet, text: str) -> ParamSet:
        """Read back; raise ApplyError naming every knob that is not what was applied."""
        live = self.read_live()
        bad = [
            f"{k}: wanted {v!r}, live {live.get(k)!r}"
            for k, v in desired.items()
            if live.get(k) != v
        ]
        _, _, rows = self._runtime_values()
        states = {(s.backend, s.server): s.weight for s in self.runtime.servers_state()}
        for server, backends in rows.items():
            want = desired.get(f"weight.{server}")
            for be in backends:
                if want is not None and states.get((be, server)) != want:
                    bad.append(
                        f"weight.{server} in {be}: wanted {want}, live {states[(be, server)]}"
                    )
        if _sha(self.cfg_path.read_text(encoding="utf-8")) != _sha(text):
            bad.append(f"{self.cfg_path} is not the rendered config")
        if bad:
            raise ApplyError("Read-back does not match what was applied: " + "; ".join(bad[:5]))
        return live

    # -- steps ---------------------------------------------------------------------------

    def _validate(self, text: str) -> None:
        side = self.cfg_path.with_name(self.cfg_path.name + ".new")
        side.write_text(text, encoding="utf-8")
        cmd = [render.require("haproxy"), "-c", "-q", "-f", str(side)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        if proc.returncode == 0:
            return
        loud = subprocess.run(cmd[:2] + cmd[3:], capture_output=True, text=True, timeout=30)
        lines = [ln.strip() for ln in (loud.stderr + loud.stdout).splitlines() if ln.strip()]
        alerts = [ln.split(" : ", 1)[-1] for ln in lines if "ALERT" in ln] or lines
        raise RejectedBeforeApply(
            f"HAProxy rejects the new config (kept the running one; the rejected file is "
            f"{side}): " + " | ".join(alerts[:3])
        )

    def _reload_with(self, text: str) -> None:
        """Save runtime state, replace the config, hitless reload, wait for the worker."""
        state = self.runtime.execute(["show servers state"])[0]
        _write_atomic(Path(self.endpoints.server_state_file), state.rstrip("\n") + "\n")
        _write_atomic(self.cfg_path, text)
        self.cfg_path.with_name(self.cfg_path.name + ".new").unlink(missing_ok=True)
        master.reload(
            self.endpoints.master_socket, self.runtime, self.state_dir / "logs" / "haproxy.log"
        )

    def _set_runtime(self, desired: ParamSet) -> None:
        """weights/maxconn of every server, in every backend it is in, in one connection."""
        _, _, rows = self._runtime_values()
        weights = config.per_server(desired, "weight")
        maxconn = config.per_server(desired, "maxconn")
        cmds: list[str] = []
        dynamic = config.is_live("weight.x", desired)
        for server, backends in rows.items():
            for be in backends:
                if dynamic and server in weights:
                    cmds.append(f"set weight {be}/{server} {weights[server]}")
                if server in maxconn:
                    cmds.append(f"set maxconn server {be}/{server} {maxconn[server]}")
        replies = self.runtime.execute(cmds) if cmds else []
        failed = [f"`{c}`: {r.strip()}" for c, r in zip(cmds, replies, strict=True) if r.strip()]
        if failed:
            raise ApplyError("HAProxy refused runtime changes: " + "; ".join(failed[:3]))

    def _write_agent(self, desired: ParamSet) -> None:
        """``<state>/agent.yaml`` for ``lbtune agent`` (checked against AgentConfig), and
        SIGHUP to a running agent so it re-reads it."""
        settings = config.agent_settings(self.endpoints, desired)
        try:
            from lbtune.agent.config import AgentConfig
        except ImportError:  # pragma: no cover - the agent ships with lbtune
            pass
        else:
            try:
                AgentConfig.model_validate(settings)
            except ValueError as exc:
                raise RejectedBeforeApply(f"agent settings rejected: {exc}") from None
        path = self.state_dir / AGENT_FILE
        _write_atomic(path, yaml.safe_dump({"agent": settings}, sort_keys=False))
        self._signal_agent()

    def _signal_agent(self) -> None:
        pid_file = self.state_dir / "agent.pid"
        try:
            pid = int(json.loads(pid_file.read_text(encoding="utf-8"))["pid"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGHUP)
            log.info("signalled the agent (pid %d) to re-read %s", pid, AGENT_FILE)

    def _write_record(self, desired: ParamSet, text: str) -> None:
        rec = {"params": desired, "cfg_sha256": _sha(text), "time": time.time()}
        _write_atomic(self.record_path, json.dumps(rec, sort_keys=True) + "\n")

    def reload_count(self) -> int:
        return master.reload_count(self.endpoints.master_socket)

    def worker_pid(self) -> int:
        return master.worker_pid(self.runtime)


def connect(state_dir: str | Path | None = None) -> HaproxyTarget:
    """The HAProxy target of the cluster running in ``state_dir`` (see ``lbtune cluster``)."""
    from lbtune.cluster.api import find_state_dir
    from lbtune.cluster.state import StatePaths, read_endpoints

    paths = StatePaths(find_state_dir(state_dir))
    ep = read_endpoints(paths)
    if ep is None:
        raise TargetError(
            f"No running cluster in {paths.root} (endpoints.json missing); "
            "start one with `lbtune cluster up`"
        )
    return HaproxyTarget(ep)
