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
read-back reports the agent's weights (``owned_elsewhere`` tells ``lbtune.apply``).
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

from lbtune.agent.config import AgentConfig, owns_weights, read_agent_file, write_agent_file
from lbtune.errors import ApplyError, ConfigError
from lbtune.process import supervisor
from lbtune.records.endpoints import Endpoints
from lbtune.records.statedir import AGENT, StatePaths
from lbtune.targets.base import (
    ApplyResult,
    ParamSet,
    ParamValue,
    RejectedBeforeApply,
    zero_weight_replicas,
)
from lbtune.targets.haproxy import config, llm, master
from lbtune.targets.haproxy.files import ALL_BACKEND, HaproxyFiles, Site, config_alerts
from lbtune.targets.haproxy.runtime import HaproxyRuntime
from lbtune.targets.lkg import LkgStore
from lbtune.targets.space import ParameterSpace

__all__ = ["SPACE_FILE", "HaproxyTarget"]

log = logging.getLogger(__name__)

SPACE_FILE = Path(__file__).with_name("space.yaml")
RECORD_NAME = "haproxy-params.json"
AGENT_FILE = "agent.yaml"
WEIGHT_PREFIX = "weight."


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".lbtune-tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


_BACKEND_RE = re.compile(r"^backend\s+(\S+)", re.MULTILINE)
_OLD_WORKER_REPLIES = ("Proxy is disabled", "No such backend", "No such server")


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
        self.files = HaproxyFiles.of(endpoints)
        self.site = Site.from_endpoints(endpoints)
        self.runtime = HaproxyRuntime(self.files.runtime_socket)
        self.cfg_path = self.files.cfg
        self.record_path = self.state_dir / RECORD_NAME
        self.agent_path = Path(endpoints.agent_config or self.state_dir / AGENT_FILE)
        self._space: ParameterSpace | None = None
        self._warned_weights = False

    def __repr__(self) -> str:
        return f"HaproxyTarget({self.state_dir})"

    # -- space & read-back -------------------------------------------------------------

    def agent_owns_weights(self) -> bool:
        """The cluster's feedback agent sets the weights (then ``weight.*`` are fixed)."""
        return owns_weights(self.endpoints)

    def owned_elsewhere(self) -> frozenset[str]:
        """Knobs another controller sets (the agent's weights): ``lbtune.apply`` does not
        hold them to a value in its read-back."""
        if not self.agent_owns_weights():
            return frozenset()
        return frozenset(n for n in self.space().params if n.startswith(WEIGHT_PREFIX))

    def replicas_out(self, params: ParamSet) -> frozenset[str]:
        """Weight 0 takes no new request (maxconn 0 is unlimited); the agent's weights are
        its own to set."""
        return frozenset() if self.agent_owns_weights() else zero_weight_replicas(params)

    def space(self) -> ParameterSpace:
        if self._space is None:
            space = ParameterSpace.load(
                self.space_file, replicas=[r.name for r in self.endpoints.replicas]
            )
            # Knobs nobody acts on are fixed, so a study does not search noise: the
            # weights while the agent sets them, the agent's knobs while no agent runs.
            idle: tuple[str, ...] = ()
            if self.agent_owns_weights():
                idle = (WEIGHT_PREFIX,)
            elif self.endpoints.agent_config is None:
                idle = (config.AGENT_PREFIX,)
            if idle:
                fixed = {
                    n: s.model_copy(update={"fixed": True}) if n.startswith(idle) else s
                    for n, s in space.params.items()
                }
                space = ParameterSpace(space.target, fixed, space.source)
            self._space = space
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
        space = self.space()
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

    def validate(self, params: Mapping[str, object]) -> ParamSet:
        """The space's checks; while the agent owns the weights, a set of nothing but
        weights is refused and weights in a larger set are dropped."""
        checked = self.space().validate(params)
        return self._without_weights(checked) if self.agent_owns_weights() else checked

    def plan(self, params: Mapping[str, object]) -> tuple[ParamSet, ParamSet, str, bool, bool]:
        """(desired, live, desired config text, reload needed, config file differs)."""
        space = self.space()
        checked = self.validate(params)
        owned = self.agent_owns_weights()
        live = self.read_live()
        if owned:
            self._warn_ignored_weights(params, live)
        desired = space.complete(checked, live)
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
        differs = config.structure(text) != config.structure(current) if owned else text != current
        return desired, live, text, needs_reload, differs

    def _without_weights(self, checked: ParamSet) -> ParamSet:
        weights = [k for k in checked if k.startswith(WEIGHT_PREFIX)]
        if weights and len(weights) == len(checked):
            raise RejectedBeforeApply(
                f"{', '.join(weights)}: the feedback agent owns the per-server weights of this "
                f"cluster (agent.enabled in its cluster YAML; settings {self.agent_path}); tune "
                "its agent.* knobs instead, or run the cluster without the agent"
            )
        return {k: v for k, v in checked.items() if not k.startswith(WEIGHT_PREFIX)}

    def _warn_ignored_weights(self, params: Mapping[str, object], live: ParamSet) -> None:
        ignored = sorted(
            k for k, v in params.items() if k.startswith(WEIGHT_PREFIX) and live.get(k) != v
        )
        if ignored and not self._warned_weights:
            self._warned_weights = True
            log.warning(
                "ignoring %s: the feedback agent owns the per-server weights of this cluster",
                ", ".join(ignored),
            )

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
        agent_doc = (
            self._agent_doc(desired)
            if any(k.startswith(config.AGENT_PREFIX) for k in diff) or not self.agent_path.exists()
            else None
        )
        llm_files = llm.prepare(self.site, desired, config.long_context_servers(self.site))
        if needs_reload:
            self._validate(text)
            self._reload_with(text)
        self._set_runtime(desired, text)
        if llm_files is not None:
            llm.set_live(self.runtime, llm_files, desired)  # the scheduler's knobs, no reload
        if not needs_reload:
            _write_atomic(self.cfg_path, text)  # weights/maxconn only: no reload needed
        if agent_doc is not None:
            self._write_agent(agent_doc)
        self._write_record(desired, text)
        applied = self.verify(desired, text)
        return ApplyResult(
            changed=True,
            applied=applied,
            diff=diff,
            reloaded=needs_reload,
            seconds=time.perf_counter() - t0,
        )

    def rollback(self, *, check: bool = False) -> ApplyResult:
        """Re-apply the last known good (``lbtune.targets.lkg``)."""
        lkg = LkgStore(self.state_dir, self.name).get()
        if lkg is None:
            raise ApplyError(f"No last known good recorded for haproxy in {self.state_dir}")
        return self.apply(lkg.params, check=check)

    def verify(self, desired: ParamSet, text: str) -> ParamSet:
        """Read back; raise ApplyError naming every knob that is not what was applied."""
        live = self.read_live()
        owned = self.agent_owns_weights()  # then the agent may have moved them since
        bad = [
            f"{k}: wanted {v!r}, live {live.get(k)!r}"
            for k, v in desired.items()
            if live.get(k) != v and not (owned and k.startswith(WEIGHT_PREFIX))
        ]
        _, _, rows = self._runtime_values()
        states = {(s.backend, s.server): s.weight for s in self.runtime.servers_state()}
        for server, backends in {} if owned else rows.items():
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
