"""Last known good: the parameter set that was last applied *and verified*, per target.

Stored under the state dir as ``lkg/<target>.json`` (the current one) and
``lkg/<target>-history.jsonl`` (every record, oldest first). Each record carries the time,
its source (``file:examples/weights.yaml``, ``study:s1#12``, ``baseline``, ``rollback``)
and the sha256 of the canonical JSON of the parameters, so that two records of the same
parameters have the same hash.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lbtune.targets.params import ParamSet

__all__ = ["Lkg", "LkgStore", "params_hash"]


def params_hash(params: ParamSet) -> str:
    """sha256 of the canonical JSON of ``params`` (sorted keys, no spaces)."""
    text = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Lkg:
    target: str
    params: ParamSet
    time: str
    """ISO 8601, UTC."""
    source: str
    sha256: str

    def describe(self) -> str:
        return f"{self.sha256[:12]} from {self.source} at {self.time}"


class LkgStore:
    """``LkgStore(state_dir, target)``: read and record the last known good."""

    def __init__(self, state_dir: str | Path, target: str) -> None:
        self.dir = Path(state_dir) / "lkg"
        self.target = target
        self.path = self.dir / f"{target}.json"
        self.history_path = self.dir / f"{target}-history.jsonl"

    def get(self) -> Lkg | None:
        try:
            data: dict[str, Any] = json.loads(self.path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return None
        return Lkg(**data)

    def record(self, params: ParamSet, source: str) -> Lkg:
        lkg = Lkg(
            target=self.target,
            params=dict(params),
            time=datetime.now(UTC).isoformat(timespec="seconds"),
            source=source,
            sha256=params_hash(params),
        )
        self.dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps(asdict(lkg), sort_keys=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, self.path)
        with self.history_path.open("a", encoding="utf-8") as fh:
            fh.write(text + "\n")
        return lkg

    def history(self) -> list[Lkg]:
        try:
            lines = self.history_path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        return [Lkg(**json.loads(ln)) for ln in lines if ln.strip()]
