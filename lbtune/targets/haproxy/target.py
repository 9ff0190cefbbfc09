"""The HAProxy target: parameters → balancer state, implemented once.

Both paths call :meth:`HaproxyTarget.apply`: the direct one (optimizer trials, ~ms) and
the Ansible module ``lbtune/data/playbooks/library/lbtune_haproxy.py`` (``lbtune apply``).

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

While the cluster runs the feedback agent (``agent.enabled`` in its YAML; endpoints'
``agent_config``) the agent owns the per-server weights: the space marks ``weight.*``
fixed, a parameter set holding nothing but weights is refused (RejectedBeforeApply,
nothing touched), weights inside a larger set are ignored (a warning names them), and
read-back reports the agent's weights: the policy of
:class:`~lbtune.targets.targetbase.TargetBase`, which also gives the rollback.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lbtune.agent.config import AgentConfig, read_agent_file, write_agent_file
from lbtune.errors import ApplyError, ConfigError
from lbtune.process import supervisor
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import AGENT, StatePaths
from lbtune.targets.base import ApplyResult, ParamSet, Plan, RejectedBeforeApply
from lbtune.targets.haproxy import config, llm, master
from lbtune.targets.haproxy.files import ALL_BACKEND, HaproxyFiles, Site, config_alerts
from lbtune.targets.haproxy.runtime import HaproxyRuntime
from lbtune.targets.targetbase import TargetBase

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


_BACKEND_RE = re.compile(r"^backend\s+(\S+)", re.MULTILINE)
_OLD_WORKER_REPLIES = ("Proxy is disabled", "No such backend", "No such server")


class HaproxyTarget(TargetBase):
    """``HaproxyTarget(endpoints)``: the embedded (or any local) HAProxy as a tunable target.

    ``template_overrides`` replaces template variables after the knobs are mapped (a test
    hook: e.g. ``{"haproxy_timeout_queue": "bogus"}`` renders a config HAProxy rejects).
    """

    name = "haproxy"
    packaged_space = SPACE_FILE

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
        self.files = HaproxyFiles.of(endpoints)
        self.site = Site.from_endpoints(endpoints)
        self.runtime = HaproxyRuntime(self.files.runtime_socket)
        self.cfg_path = self.files.cfg
        self.record_path = self.state_dir / RECORD_NAME
        self.agent_settings = Path(endpoints.agent_config) if endpoints.agent_config else None
        self.agent_path = self.agent_settings or self.state_dir / AGENT_FILE

    def __repr__(self) -> str:
        return f"HaproxyTarget({self.state_dir})"

    # -- space & read-back -------------------------------------------------------------

    def replica_names(self) -> list[str]:
        return [r.name for r in self.endpoints.replicas]

    def idle_knobs(self) -> tuple[str, ...]:
        """The weights while the agent sets them; the agent's knobs while no agent runs."""
        owned = super().idle_knobs()
        if not owned and self.endpoints.agent_config is None:
            return (config.AGENT_PREFIX,)
        return owned

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
        all_be = ALL_BACKEND
        weights = {s.server: s.weight for s in states if s.backend == all_be}
        maxconn = {
            s.server: int(s.raw.get("slim") or 0)
            for s in self.runtime.stat()
            if s.backend == all_be
        }
        return weights, maxconn, rows

    def read_live(self) -> ParamSet:
        """Weights and maxconn from the runtime API; ``agent.*`` from the agent's file; the
        other knobs from lbtune's record of the config it wrote (the baseline when
        haproxy.cfg is not lbtune's)."""
        space = self.limits()
        rec = self._record()
        base = dict(rec["params"]) if rec else {}
        weights, maxconn, _ = self._runtime_values()
        live: ParamSet = {k: v for k, v in base.items() if k in space.params}
        for key, value in read_agent_file(self.agent_path).items():
            if config.AGENT_PREFIX + key in space.params:
                live[config.AGENT_PREFIX + key] = value
        for server, w in weights.items():
            live[f"weight.{server}"] = w
        for server, m in maxconn.items():
            live[f"maxconn.{server}"] = m
        if llm.is_llm(live):  # the scheduler's knobs as the worker holds them
            files = llm.LlmFiles.in_dir(self.state_dir)
            live.update(llm.live_knobs(self.runtime, files, space.params))
        return space.complete({}, live)

    # -- apply ---------------------------------------------------------------------------

    def plan(self, params: Mapping[str, object]) -> tuple[Plan, str]:
        """What the apply would do, and the config text ``desired`` renders."""
        began = time.perf_counter()
        checked = self.validate(params)
        live = self.read_live()
        desired = self.limits().complete(checked, live)
        text = config.render_config(self.site, desired, self.template_overrides)
        try:
            current = self.cfg_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            current = ""
        changed = [k for k in desired if desired[k] != live.get(k)]
        needs_reload = config.structure(text) != config.structure(current) or any(
            config.kind_of(k, desired) == "structural" for k in changed
        )
        # The agent's weights drift from the file's between applies: not a change of ours.
        if self.agent_owns_weights():
            differs = config.structure(text) != config.structure(current)
        else:
            differs = text != current
        return Plan(live, desired, reload=needs_reload, began=began, drift=differs), text

    def apply(self, params: Mapping[str, object], *, check: bool = False) -> ApplyResult:
        plan, text = self.plan(params)
        if check or not plan.changed:
            return plan.untouched(check=check)
        desired = plan.desired
        agent_doc = (
            self._agent_doc(desired)
            if any(k.startswith(config.AGENT_PREFIX) for k in plan.diff)
            or not self.agent_path.exists()
            else None
        )
        llm_files = llm.prepare(self.site, desired, config.long_context_servers(self.site))
        if plan.reload:
            self._validate(text)
            self._reload_with(text)
        self._set_runtime(desired, text)
        if llm_files is not None:
            # the scheduler's knobs and rates, no reload
            llm.set_live(self.runtime, llm_files, self.site, desired)
        if not plan.reload:
            _write_atomic(self.cfg_path, text)  # weights/maxconn only: no reload needed
        if agent_doc is not None:
            self._write_agent(agent_doc)
        self._write_record(desired, text)
        return plan.done(self.verify(desired, text))

    def take_rates(self) -> bool:
        """Under ``algorithm: llm``, give the running scheduler the engine rates the state
        dir now holds (after ``lbtune cluster calibrate``): its map file and its worker's
        map, no reload. ``False`` when the balancer runs another algorithm."""
        live = self.read_live()
        files = llm.prepare(self.site, live, config.long_context_servers(self.site))
        if files is None:
            return False
        llm.set_live(self.runtime, files, self.site, live)
        return True

    def verify(self, desired: ParamSet, text: str) -> ParamSet:
        """Read back (:meth:`read_back`), also each server's weight in every backend it
        is in and the config file's hash."""
        return self.read_back(desired, also=lambda: self._backend_mismatches(desired, text))

    def _backend_mismatches(self, desired: ParamSet, text: str) -> list[str]:
        bad = []
        _, _, rows = self._runtime_values()
        states = {(s.backend, s.server): s.weight for s in self.runtime.servers_state()}
        # While the agent owns the weights it may have moved them since.
        for server, backends in {} if self.agent_owns_weights() else rows.items():
            want = desired.get(f"weight.{server}")
            for be in backends:
                if want is not None and states.get((be, server)) != want:
                    bad.append(
                        f"weight.{server} in {be}: wanted {want}, live {states[(be, server)]}"
                    )
        if _sha(self.cfg_path.read_text(encoding="utf-8")) != _sha(text):
            bad.append(f"{self.cfg_path} is not the rendered config")
        return bad

    # -- steps ---------------------------------------------------------------------------

    def _validate(self, text: str) -> None:
        side = self.cfg_path.with_name(self.cfg_path.name + ".new")
        side.write_text(text, encoding="utf-8")
        alerts = config_alerts(side)
        if alerts is None:
            return
        raise RejectedBeforeApply(
            f"HAProxy rejects the new config (kept the running one; the rejected file is "
            f"{side}): " + " | ".join(alerts)
        )

    def _reload_with(self, text: str) -> None:
        """Save runtime state, replace the config, hitless reload, wait for the worker."""
        state = self.runtime.execute(["show servers state"])[0]
        _write_atomic(self.files.server_state, state.rstrip("\n") + "\n")
        _write_atomic(self.cfg_path, text)
        self.cfg_path.with_name(self.cfg_path.name + ".new").unlink(missing_ok=True)
        master.reload(
            self.files.master_socket, self.runtime, self.state_dir / "logs" / "haproxy.log"
        )

    def _set_runtime(self, desired: ParamSet, text: str) -> None:
        """weights/maxconn of every server, in every backend it is in, in one connection."""
        weights = config.per_server(desired, "weight")
        maxconn = config.per_server(desired, "maxconn")
        dynamic = config.is_live("weight.x", desired) and not self.agent_owns_weights()
        deadline = time.monotonic() + 3.0
        while True:
            cmds: list[str] = []
            for server, backends in self._rows_of(text).items():
                for be in backends:
                    if dynamic and server in weights:
                        cmds.append(f"set weight {be}/{server} {weights[server]}")
                    if server in maxconn:
                        cmds.append(f"set maxconn server {be}/{server} {maxconn[server]}")
            replies = self.runtime.execute(cmds) if cmds else []
            failed = [(c, r.strip()) for c, r in zip(cmds, replies, strict=True) if r.strip()]
            # An old worker in soft-stop answering instead of the new one: try again (the
            # commands are idempotent). Anything else is a real refusal.
            stale = all(r.startswith(_OLD_WORKER_REPLIES) for _, r in failed)
            if not failed or not stale or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if failed:
            shown = "; ".join(f"`{c}`: {r}" for c, r in failed[:3])
            raise ApplyError("HAProxy refused runtime changes: " + shown)

    def _rows_of(self, text: str, timeout_s: float = 3.0) -> dict[str, list[str]]:
        """Backends per server as the worker running ``text`` reports them.

        Right after a reload the old worker can still answer a runtime connection for a
        moment (both share the listener until it lets go), reporting backends the new
        config no longer has: wait until the runtime shows exactly the config's backends.
        """
        expected = set(_BACKEND_RE.findall(text))
        deadline = time.monotonic() + timeout_s
        while True:
            _, _, rows = self._runtime_values()
            seen = {be for backends in rows.values() for be in backends}
            if seen <= expected or time.monotonic() > deadline:
                return rows
            time.sleep(0.02)

    def _agent_doc(self, desired: ParamSet) -> dict[str, Any]:
        """The agent file's new contents: what it holds (the cluster's wiring, settings
        that are not knobs) with the ``agent.*`` knobs of ``desired`` over it; checked
        against AgentConfig before anything is touched."""
        doc = read_agent_file(self.agent_path)
        doc.update(config.agent_settings(desired))
        try:
            AgentConfig.model_validate(doc)
        except ValueError as exc:
            raise RejectedBeforeApply(f"agent settings rejected: {exc}") from None
        return doc

    def _write_agent(self, doc: dict[str, Any]) -> None:
        """Write the agent file and SIGHUP a running agent so that it re-reads it."""
        try:
            write_agent_file(self.agent_path, doc)
        except ConfigError as exc:  # pragma: no cover - checked by _agent_doc
            raise ApplyError(str(exc)) from None
        self._signal_agent()

    def _signal_agent(self) -> None:
        """SIGHUP the agent of ``<state>/agent.pid`` (the supervisor's record, identity
        checked: a recycled PID is never signalled)."""
        record = supervisor.read_record(StatePaths(self.state_dir), AGENT)
        if record is not None and supervisor.send_signal(record, signal.SIGHUP):
            log.info("signalled the agent (pid %d) to re-read %s", record.pid, self.agent_path)

    def _write_record(self, desired: ParamSet, text: str) -> None:
        rec = {"params": desired, "cfg_sha256": _sha(text), "time": time.time()}
        _write_atomic(self.record_path, json.dumps(rec, sort_keys=True) + "\n")

    def reload_count(self) -> int:
        return master.reload_count(self.files.master_socket)

    def worker_pid(self) -> int:
        return master.worker_pid(self.runtime)
