"""The last known good outlives ``cluster down``: ``up`` puts it back.

``lbtune cluster down`` stops the processes and keeps the state dir, the last known good
(``lkg/<balancer>.json``) included. When ``up`` starts the *same* cluster again (the
cluster file unchanged, ``config.json``), its balancer is launched and then brought back
to that last known good, saying so: a tuned cluster does not come back untuned. Another
cluster started in the same state dir (another file, other replicas) starts untuned: its
predecessor's last known good describes a balancer that no longer runs and is forgotten
(its history file stays, for the record). So is one the balancer no longer accepts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from lbtune import targets
from lbtune.errors import LbtuneError
from lbtune.records.endpoints import Endpoints
from lbtune.targets.lkg import LkgStore

__all__ = ["forget_last_known_good", "restore_last_known_good"]

log = logging.getLogger(__name__)


def forget_last_known_good(state_dir: Path) -> None:
    """Drop every current last known good of ``state_dir`` (the history files stay)."""
    for current in (state_dir / "lkg").glob("*.json"):
        current.unlink(missing_ok=True)


def restore_last_known_good(ep: Endpoints, say: Callable[[str], None] = log.info) -> None:
    """Apply the last known good of ``ep``'s balancer, if one is recorded; one that the
    balancer refuses is forgotten, saying why (the cluster then runs untuned)."""
    store = LkgStore(ep.state_dir, ep.balancer)
    lkg = store.get()
    if lkg is None:
        return
    try:
        targets.get_target(ep.balancer, ep).apply(lkg.params)
    except LbtuneError as exc:
        say(f"the last known good {lkg.describe()} does not fit this cluster ({exc}): untuned")
        forget_last_known_good(Path(ep.state_dir))
        return
    say(f"{ep.balancer} is back on its last known good {lkg.describe()}")
