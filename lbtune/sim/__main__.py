"""``python -m lbtune.sim``: serve simulated vLLM replicas until SIGTERM/SIGINT.

Either a spec file (a :class:`~lbtune.sim.spec.HostSpec` as JSON, what
``lbtune cluster up`` writes)::

    python -m lbtune.sim --spec host.json

or quick flags (repeat ``--replica``; models separated by commas)::

    python -m lbtune.sim --replica h100-0:8001:h100-80g:llama-3.1-8b-instruct \\
        --replica a100-0:8002:a100-80g:llama-3.1-8b-instruct --time-scale 4 --seed 1

Flags given with ``--spec`` override the file's ``time_scale``, ``seed``,
``ground_truth_path`` and ``host``. One line per replica is printed on stdout
once every port listens (``sim replica NAME listening on URL gpu=... models=...``).
SIGTERM or SIGINT stops serving, flushes the ground truth and exits 0. An
invalid spec exits 2, a busy port 3 — one line on stderr, nothing left listening.
uvloop is used when importable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lbtune.errors import ConfigError, LbtuneError, validation_error
from lbtune.safety.files import read_bytes
from lbtune.sim.host import SimHost
from lbtune.sim.spec import HostSpec


def parse_args(argv: list[str] | None = None) -> HostSpec:
    ap = argparse.ArgumentParser(prog="python -m lbtune.sim", description=__doc__.split("\n")[0])
    ap.add_argument("--spec", type=Path, help="HostSpec JSON file")
    ap.add_argument(
        "--replica",
        action="append",
        default=[],
        metavar="NAME:PORT:GPU:MODEL[,MODEL]",
        help="a replica (repeatable)",
    )
    ap.add_argument("--time-scale", type=float, help="4 = four times faster than real")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--ground-truth", metavar="FILE", help="JSONL file for per-request truth")
    ap.add_argument("--host", help="address to bind (default 127.0.0.1)")
    ns = ap.parse_args(argv)
    data: dict[str, Any] = {}
    if ns.spec is not None:
        try:
            data = json.loads(read_bytes(ns.spec))
        except (ValueError, RecursionError) as exc:
            raise ConfigError(f"{ns.spec}: cannot read a JSON HostSpec: {exc}") from None
    if ns.replica:
        data["replicas"] = [*data.get("replicas", []), *map(_replica_flag, ns.replica)]
    for key, value in (
        ("time_scale", ns.time_scale),
        ("seed", ns.seed),
        ("ground_truth_path", ns.ground_truth),
        ("host", ns.host),
    ):
        if value is not None:
            data[key] = value
    if not data.get("replicas"):
        raise ConfigError("No replicas: pass --spec FILE or at least one --replica")
    try:
        return HostSpec.model_validate(data)
    except ValidationError as exc:
        src = f"{ns.spec}: sim spec" if ns.spec else "sim spec from the command line"
        raise validation_error(exc, src, HostSpec, data) from None


def _replica_flag(text: str) -> dict[str, Any]:
    parts = text.split(":")
    if len(parts) != 4 or not parts[1].isdigit():
        raise ConfigError(f"--replica {text!r}: expected NAME:PORT:GPU:MODEL[,MODEL]")
    name, port, gpu, models = parts
    return {"name": name, "port": int(port), "gpu": gpu, "models": models.split(",")}


async def serve(spec: HostSpec) -> None:
    """Serve ``spec`` until SIGTERM/SIGINT."""
    host = SimHost(spec)
    await host.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    for r in host.replicas:
        models = ",".join(r.spec.models)
        url = host.urls[r.name]
        print(f"sim replica {r.name} listening on {url} gpu={r.spec.gpu} models={models}")
    sys.stdout.flush()
    try:
        await stop.wait()
    finally:
        await host.close()


def main(argv: list[str] | None = None) -> int:
    try:
        spec = parse_args(argv)
        try:
            import uvloop  # type: ignore[import-not-found, unused-ignore]

            runner: Any = uvloop.run
        except ImportError:
            runner = asyncio.run
        runner(serve(spec))
    except LbtuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
