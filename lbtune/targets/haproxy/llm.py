"""The LLM-aware scheduler (``algorithm: llm``): its files, its knobs, its live changes.

The scheduler is ``lua/scheduler.lua`` (package data), loaded by HAProxy with ``lua-load``.
It reads every ``llm.*`` knob, and the per-replica facts it filters on (KV capacity in
bytes, the model's KV bytes per token, which replicas are long-context), from one map
file. lbtune writes both files next to ``haproxy.cfg`` (``<state>/llm/``); a knob changes
live by rewriting the map file (what the next reload loads) and ``set map`` on the
runtime API (what the running worker uses): no reload. Only switching the algorithm to or
from ``llm`` changes ``haproxy.cfg``.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lbtune.errors import ApplyError
from lbtune.records.calibration import read_calibration
from lbtune.sim.costmodel import engine_rates
from lbtune.sim.profiles import GPU_PROFILES, MODEL_PROFILES
from lbtune.targets.base import ParamValue, pool_names
from lbtune.targets.haproxy.files import ALL_BACKEND, Site
from lbtune.targets.haproxy.runtime import HaproxyRuntime
from lbtune.targets.space import ParamSpec

__all__ = [
    "ALGORITHM",
    "KNOB_PREFIX",
    "LlmFiles",
    "facts",
    "is_llm",
    "knob_values",
    "live_knobs",
    "lua_source",
    "map_text",
    "prepare",
    "rate_entries",
    "rate_facts",
    "read_live",
    "set_live",
    "template_context",
    "write_files",
]

ALGORITHM = "llm"
KNOB_PREFIX = "llm."
METRICS_PATH = "/llm/metrics"
"""Where the stats frontend serves the scheduler's counters (Prometheus text)."""
GPU_MEMORY_UTILIZATION = 0.90
"""vLLM's default share of GPU memory for weights + KV (what the simulator uses too)."""

# Map keys the Lua reads beside the knobs (never knobs themselves).
_FACT_PREFIXES = ("kvcap.", "kvbpt.", "long.", "ctx.", "tps.", "step.", "stepk.", "ovh.")


@dataclass(frozen=True)
class LlmFiles:
    """The scheduler's files in a state dir."""

    lua: Path
    map: Path

    @classmethod
    def in_dir(cls, state_dir: str | Path) -> LlmFiles:
        root = Path(state_dir) / "llm"
        return cls(lua=root / "scheduler.lua", map=root / "knobs.map")


def lua_source() -> str:
    """The scheduler's Lua, read from the package."""
    res = importlib.resources.files("lbtune.targets.haproxy").joinpath("lua/scheduler.lua")
    return res.read_text(encoding="utf-8")


def is_llm(params: Mapping[str, ParamValue]) -> bool:
    return str(params.get("algorithm", "")) == ALGORITHM


def knob_values(params: Mapping[str, ParamValue]) -> dict[str, str]:
    """``llm.<key>`` knobs → map entries ``<key> value``."""
    out: dict[str, str] = {}
    for k, v in sorted(params.items()):
        if k.startswith(KNOB_PREFIX):
            out[k[len(KNOB_PREFIX) :]] = _text(v)
    return out


def _text(v: ParamValue) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def facts(site: Site, long_servers: list[str]) -> dict[str, str]:
    """Per-replica facts from the simulator's GPU and model profiles (where known): KV
    capacity in bytes per server, KV bytes per token and context length (tokens) per
    model backend, long-context servers, and for ``mode predict`` each server's engine
    rates per backend (:func:`rate_facts`). Unknown GPUs or models leave the key out; the
    Lua then filters on KV usage alone and predicts with its default rates."""
    out: dict[str, str] = {
        "all_backend": ALL_BACKEND,
        "fault": "none",
        "time_scale": repr(float(site.time_scale)),
    }
    backends = pool_names(site.models)
    for model, be in backends.items():
        if model in MODEL_PROFILES:
            out[f"kvbpt.{be}"] = str(MODEL_PROFILES[model].kv_bytes_per_token)
            out[f"kvbpt.long_{be}"] = out[f"kvbpt.{be}"]
            out[f"ctx.{be}"] = str(MODEL_PROFILES[model].context_length)
            out[f"ctx.long_{be}"] = out[f"ctx.{be}"]
    for r in site.replicas:
        gpu = GPU_PROFILES.get(r.gpu or "")
        profiles = [MODEL_PROFILES.get(m) for m in r.models]
        if gpu is not None and all(p is not None for p in profiles):
            weights = sum(p.weight_bytes for p in profiles if p is not None)
            kv = int(gpu.memory_bytes * GPU_MEMORY_UTILIZATION) - weights
            if kv > 0:
                out[f"kvcap.{r.name}"] = str(kv)
        out[f"long.{r.name}"] = "1" if r.name in long_servers else "0"
    out |= rate_facts(site)
    return out


def rate_facts(site: Site) -> dict[str, str]:
    """What ``mode predict`` reads per server ``s`` and model backend ``b`` (and its
    ``long_b``), in GPU seconds: ``tps.b.s`` prompt tokens prefilled a second, ``step.b.s``
    a lone decode step, ``stepk.b.s`` what each further running request adds to it,
    ``ovh.s`` the per-request front-end time; from the simulator's cost model where the
    GPU and model profiles are known (:func:`lbtune.sim.costmodel.engine_rates`), else as
    ``lbtune cluster calibrate`` measured them (``calibration.json`` in the state dir)."""
    out: dict[str, str] = {}
    backends = pool_names(site.models)
    calibration = read_calibration(site.state_dir)
    measured = calibration.by_name() if calibration else {}
    for r in site.replicas:
        gpu = GPU_PROFILES.get(r.gpu or "")
        if gpu is not None:
            out[f"ovh.{r.name}"] = repr(gpu.request_overhead_s)
        for model in r.models:
            profile = MODEL_PROFILES.get(model)
            if gpu is not None and profile is not None:
                rates = engine_rates(gpu, profile)
                tps, step, stepk = rates.prefill_tokens_per_s, rates.step_s, rates.step_per_seq_s
            elif calibration is not None and (m := measured.get(r.name)) and m.model == model:
                scale = calibration.time_scale  # measured in wall seconds = GPU s / scale
                out.setdefault(f"ovh.{r.name}", f"{m.overhead_s * scale:.6g}")
                tps, step = m.prefill_tokens_per_s / scale, m.step_s * scale
                stepk = m.step_per_seq_s * scale
            else:
                continue
            out |= rate_entries(backends[model], r.name, tps, step, stepk)
    return out


def rate_entries(
    backend: str, server: str, tps: float, step: float, stepk: float
) -> dict[str, str]:
    """The map entries of one server's rates for model backend ``backend`` (and its
    ``long_`` twin): prompt tokens a second, lone decode step, per-request slope."""
    out: dict[str, str] = {}
    for be in (backend, "long_" + backend):
        out[f"tps.{be}.{server}"] = f"{tps:.6g}"
        out[f"step.{be}.{server}"] = f"{step:.6g}"
        out[f"stepk.{be}.{server}"] = f"{stepk:.6g}"
    return out


def map_text(site: Site, params: Mapping[str, ParamValue], long_servers: list[str]) -> str:
    entries = {**facts(site, long_servers), **knob_values(params)}
    lines = ["# lbtune LLM scheduler: knobs (llm.*) and replica facts; `set map` changes them"]
    lines += [f"{k} {v}" for k, v in entries.items()]
    return "\n".join(lines) + "\n"


def template_context(state_dir: str | Path) -> dict[str, str]:
    """``haproxy_llm`` of the template; the Lua's hash goes into the config, so that a
    new scheduler.lua (an lbtune upgrade) is a config change and reloads."""
    files = LlmFiles.in_dir(state_dir)
    sha = hashlib.sha256(lua_source().encode()).hexdigest()[:16]
    return {"lua": str(files.lua), "map": str(files.map), "metrics_path": METRICS_PATH, "sha": sha}


def write_files(files: LlmFiles, text: str) -> None:
    """Write the Lua and the map (atomically: a reload never sees half a file)."""
    files.lua.parent.mkdir(parents=True, exist_ok=True)
    for path, content in ((files.lua, lua_source()), (files.map, text)):
        tmp = path.with_name(path.name + ".lbtune-tmp")
        tmp.write_text(content, encoding="utf-8")
        os.replace(tmp, path)


def set_live(
    runtime: HaproxyRuntime, files: LlmFiles, site: Site, params: Mapping[str, ParamValue]
) -> None:
    """Make the running worker's map hold every ``llm.*`` knob of ``params`` and the
    site's engine rates (:func:`rate_facts`: a calibration since the last reload adds
    some): ``set map`` where it differs, ``add map`` where it has none."""
    want = {**knob_values(params), **rate_facts(site)}
    live = read_live(runtime, files)
    cmds = [
        f"{'set' if k in live else 'add'} map {files.map} {k} {v}"
        for k, v in want.items()
        if live.get(k) != v
    ]
    if not cmds:
        return
    replies = runtime.execute(cmds)
    failed = [f"`{c}`: {r.strip()}" for c, r in zip(cmds, replies, strict=True) if r.strip()]
    if failed:
        raise ApplyError("HAProxy refused the scheduler's knobs: " + "; ".join(failed[:3]))


def read_live(runtime: HaproxyRuntime, files: LlmFiles) -> dict[str, str]:
    """The running worker's map: ``{key: value}`` (knobs and facts)."""
    text = runtime.execute([f"show map {files.map}"])[0]
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].startswith("0x"):
            out[parts[1]] = parts[2]
    return out


def is_fact(key: str) -> bool:
    return key in ("all_backend", "fault", "time_scale") or key.startswith(_FACT_PREFIXES)


def prepare(
    site: Site, params: Mapping[str, ParamValue], long_servers: list[str]
) -> LlmFiles | None:
    """Under ``algorithm: llm``, write the Lua and the map HAProxy will load (before
    ``haproxy -c``: it loads both); ``None`` under any other algorithm."""
    if not is_llm(params):
        return None
    files = LlmFiles.in_dir(site.state_dir)
    write_files(files, map_text(site, params, long_servers))
    return files


def live_knobs(
    runtime: HaproxyRuntime, files: LlmFiles, specs: Mapping[str, ParamSpec]
) -> dict[str, ParamValue]:
    """The ``llm.*`` knobs as the running worker holds them (``show map``), typed by their
    specs; empty when the worker has no such map (it does not run the scheduler)."""
    out: dict[str, ParamValue] = {}
    for key, text in read_live(runtime, files).items():
        spec = specs.get(KNOB_PREFIX + key)
        if spec is None:
            continue
        try:
            value: ParamValue = (
                int(text) if spec.type == "int" else float(text) if spec.type == "float" else text
            )
        except ValueError:
            continue
        out[KNOB_PREFIX + key] = value
    return out
