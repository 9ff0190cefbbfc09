"""The Envoy config dir on disk: layout, files replaced by rename, validation, readiness.

``<state>/envoy/`` holds ``layout.json`` (where Envoy listens and what it fronts, written
at launch: every later process builds the target from it), ``bootstrap.json``, the xDS
files of :func:`lbtune.targets.envoy.config.render`, ``params.json`` (what lbtune last
applied) and ``validate.json`` (the last config checked with ``envoy --mode validate``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.error import URLError
from urllib.request import urlopen

from pydantic import TypeAdapter

from lbtune.errors import ConfigError, TargetError
from lbtune.targets.base import ParamSet, ParamValue, RejectedBeforeApply
from lbtune.targets.envoy import binary, bootstrap, config
from lbtune.targets.envoy.admin import EnvoyAdmin
from lbtune.targets.envoy.config import Layout

__all__ = [
    "STRUCTURAL_FILES",
    "command",
    "missing",
    "read_layout",
    "read_record",
    "validate",
    "write_files",
    "write_layout",
    "write_record",
]

CONFIG_DIR = "envoy"
LAYOUT = "layout.json"
RECORD = "params.json"
STRUCTURAL_FILES = ("cds.json", "rds.json")
"""Files whose change is structural (Envoy builds a new cluster or route table)."""
_LAYOUT_ADAPTER = TypeAdapter(Layout)


def config_dir(state_dir: str | Path) -> Path:
    return Path(state_dir) / CONFIG_DIR


def write_atomic(path: Path, text: str) -> None:
    """Write beside, then rename over: Envoy sees the old file or the new one, whole."""
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_layout(layout: Layout) -> None:
    layout.config_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(layout.path(LAYOUT), _LAYOUT_ADAPTER.dump_json(layout, indent=2).decode() + "\n")


def read_layout(state_dir: str | Path) -> Layout:
    path = config_dir(state_dir) / LAYOUT
    try:
        return _LAYOUT_ADAPTER.validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{path} is missing: no Envoy launched by lbtune in {state_dir} "
            "(start a cluster with `balancer: envoy`)"
        ) from None
    except ValueError as exc:
        raise ConfigError(f"{path}: unreadable ({exc.__class__.__name__})") from None


def current_files(layout: Layout, names: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = layout.path(name).read_text(encoding="utf-8")
        except FileNotFoundError:
            out[name] = ""
    return out


def write_files(layout: Layout, files: Mapping[str, str]) -> list[str]:
    """Replace the files that differ, endpoints first, then clusters, then routes; return
    the names written. A new cluster reads its endpoints file when it is built, so the
    endpoints are in place before the clusters that use them."""
    current = current_files(layout, list(files))
    order = sorted(files, key=lambda n: (n in STRUCTURAL_FILES, n == "rds.json", n))
    written = []
    for name in order:
        if files[name] != current[name]:
            write_atomic(layout.path(name), files[name])
            written.append(name)
    return written


def _structural_sha(files: Mapping[str, str]) -> str:
    text = "\0".join(files.get(n, "") for n in STRUCTURAL_FILES)
    return hashlib.sha256(text.encode()).hexdigest()


def write_record(
    layout: Layout, params: Mapping[str, ParamValue], files: Mapping[str, str]
) -> None:
    rec = {"params": dict(params), "structural_sha256": _structural_sha(files), "time": time.time()}
    write_atomic(layout.path(RECORD), json.dumps(rec, sort_keys=True) + "\n")


def read_record(layout: Layout) -> ParamSet | None:
    """What lbtune last applied, if the structural files on disk are still the ones it wrote
    (the weights are always read from Envoy: the feedback agent moves them)."""
    try:
        rec: dict[str, Any] = json.loads(layout.path(RECORD).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    on_disk = current_files(layout, list(STRUCTURAL_FILES))
    if rec.get("structural_sha256") != _structural_sha(on_disk):
        return None
    params: ParamSet = rec.get("params", {})
    return params


def validate(layout: Layout, params: Mapping[str, ParamValue]) -> None:
    """``envoy --mode validate`` on one static config holding everything ``params`` renders;
    RejectedBeforeApply (nothing touched) with Envoy's reason."""
    side = layout.path("validate.json")
    write_atomic(side, config.dump(bootstrap.validation_bootstrap(layout, params)))
    problem = binary.validate_file(side)
    if problem is not None:
        raise RejectedBeforeApply(
            f"Envoy rejects the new config (kept the running one; checked {side}): {problem}"
        )


def command(layout: Layout, concurrency: int = 1) -> list[str]:
    """Envoy's command line. No hot restart (changes go through xDS files), so several
    Envoys on one machine do not share a shared-memory region."""
    return [
        binary.find_envoy(),
        "-c",
        str(layout.bootstrap_path),
        "--disable-hot-restart",
        "--concurrency",
        str(concurrency),
        "-l",
        "info",
    ]


def missing(layout: Layout, admin: EnvoyAdmin | None = None) -> str | None:
    """``None`` once Envoy is LIVE, every endpoint of every cluster is healthy and
    ``/health`` through the listener answers 200; else what is missing."""
    admin = admin or EnvoyAdmin(layout.admin_url, timeout=1.0)
    if not admin.ready():
        return f"Envoy admin {layout.admin_url}/ready is not LIVE"
    try:
        hosts = admin.hosts()
    except TargetError as exc:
        return str(exc)
    want = {(c, r) for c, reps in config.members(layout).items() for r in (x.name for x in reps)}
    have = {(h.cluster, h.hostname) for h in hosts if h.healthy}
    lacking = sorted(want - have)
    if lacking:
        return "endpoints not healthy: " + ", ".join(f"{c}/{r}" for c, r in lacking[:6])
    try:
        with urlopen(layout.url + "/health", timeout=1.0) as resp:
            if resp.status == 200:
                return None
            return f"{layout.url}/health answered {resp.status}"
    except (URLError, OSError) as exc:
        return f"{layout.url}/health: {getattr(exc, 'reason', exc)}"
