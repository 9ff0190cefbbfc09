"""The nginx target: parameters → ``nginx.conf`` → ``nginx -t`` → graceful reload → read-back.

Open-source nginx (1.22) has no runtime API, so every change is structural. An apply:

1. validates the parameters against the space and completes them with what is live;
2. renders ``nginx.conf`` from the full set; an identical file is no change;
3. ``nginx -t`` on a side file *before* the live file is replaced (a rejected config is
   a :class:`RejectedBeforeApply` with nginx's words, and nothing is touched);
4. replaces the file and SIGHUPs the master, which starts new workers on it while the old
   ones finish their requests (streams in flight complete; see docs/nginx.md); no new
   worker → the previous file is put back and reloaded, and the apply fails;
5. reads back: parses the live file (:mod:`lbtune.targets.nginx.readback`) and compares.

Both paths call :meth:`NginxTarget.apply`: the direct one (optimizer trials) and the
Ansible module ``lbtune/data/playbooks/library/lbtune_nginx.py`` (``lbtune apply --target nginx``).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lbtune.errors import ApplyError, TargetError
from lbtune.targets.base import ApplyResult, ParamSet, Plan, RejectedBeforeApply
from lbtune.targets.nginx import process, readback
from lbtune.targets.nginx.config import Site, render_config
from lbtune.targets.targetbase import TargetBase

__all__ = ["SPACE_FILE", "NginxTarget"]

SPACE_FILE = Path(__file__).with_name("space.yaml")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".lbtune-tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class NginxTarget(TargetBase):
    """``NginxTarget(site)``: an nginx lbtune started (see :mod:`.balancer`) as a target.

    ``template_overrides`` replaces template variables after the knobs are mapped (a test
    hook: e.g. ``{"keepalive": "bogus"}`` renders a config nginx rejects).
    """

    name = "nginx"
    packaged_space = SPACE_FILE

    def __init__(
        self,
        site: Site,
        *,
        space_file: str | Path | None = None,
        template_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        self.site = site
        self.state_dir = site.state_dir
        self.space_file = Path(space_file) if space_file else SPACE_FILE
        self.template_overrides = dict(template_overrides or {})

    def __repr__(self) -> str:
        return f"NginxTarget({self.site.prefix})"

    # -- space & read-back -------------------------------------------------------------

    def replica_names(self) -> list[str]:
        return [r.name for r in self.site.replicas]

    def live_text(self) -> str:
        """The config the running master loaded (TargetError when no master runs)."""
        process.master(self.site)
        try:
            return self.site.conf.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise TargetError(
                f"{self.site.conf} is missing: nginx was not started by lbtune"
            ) from None

    def read_live(self) -> ParamSet:
        """Every knob, parsed from the live ``nginx.conf``."""
        parsed = readback.parse_config(self.live_text(), self.site.replicas)
        space = self.limits()
        return space.complete({}, {k: v for k, v in parsed.items() if k in space.params})

    def render(self, params: ParamSet) -> str:
        return render_config(self.site, params, self.template_overrides)

    # -- apply ---------------------------------------------------------------------------

    def apply(self, params: Mapping[str, object], *, check: bool = False) -> ApplyResult:
        """Every change is a reload (no runtime API); one apply at a time per nginx."""
        began = time.perf_counter()
        checked = self.validate(params)
        with self._locked():
            current = self.live_text()
            live = self.read_live()
            desired = self.limits().complete(checked, live)
            text = self.render(desired)
            plan = Plan(live, desired, reload=True, began=began, drift=text != current)
            if check or not plan.changed:
                return plan.untouched(check=check)
            self._validate(text)
            self._reload_with(text, current)
            return plan.done(self.read_back(desired))

    # -- steps ---------------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One apply at a time per nginx (the optimizer and `lbtune apply` may race)."""
        with open(self.site.prefix / ".apply.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _validate(self, text: str) -> None:
        side = self.site.conf.with_name(self.site.conf.name + ".new")
        side.write_text(text, encoding="utf-8")
        problem = process.test_config(self.site, side)
        if problem is not None:
            raise RejectedBeforeApply(
                f"nginx rejects the new config (kept the running one; the rejected file is "
                f"{side}): {problem}"
            )

    def _reload_with(self, text: str, previous: str) -> None:
        """Replace the file, SIGHUP, wait for a new worker; on failure restore and reload."""
        _write_atomic(self.site.conf, text)
        self.site.conf.with_name(self.site.conf.name + ".new").unlink(missing_ok=True)
        try:
            process.reload(self.site)
        except ApplyError:
            _write_atomic(self.site.conf, previous)
            process.reload(self.site)
            raise

    def worker_pids(self) -> set[int]:
        return process.workers(process.master(self.site))
