"""A stand-in for ``lbtune`` that the nightly script's own logic is tested with, no cluster:
``LBTUNE_BIN="python tests/fake_lbtune.py"``.

Each call's arguments are appended to ``$FAKE_CALLS`` (one JSON list a line). ``cluster
status`` answers as a running ``mini2`` at time scale 4 (exit 1 with ``$FAKE_DOWN``);
``twin fit`` writes a profile to ``--save`` (``measured_at``: ``$FAKE_AT``), prints a rates
line and, with ``--baseline``, a drift line, and exits ``$FAKE_FIT_RC`` (1: with the drift
verdict on stderr, as lbtune prints it). Anything else succeeds silently.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

CLUSTER, TIME_SCALE = "mini2", 4.0


def main(args: list[str]) -> int:
    with open(os.environ["FAKE_CALLS"], "a") as f:
        f.write(json.dumps(args) + "\n")
    if args[:2] == ["cluster", "status"]:
        if os.environ.get("FAKE_DOWN"):
            return 1
        if "--json" in args:
            ep = {"config_name": CLUSTER, "time_scale": TIME_SCALE, "balancer": "haproxy"}
            print(json.dumps({"running": True, "endpoints": ep}))
        return 0
    if args[:2] == ["twin", "fit"]:
        profile = {
            "version": 1,
            "measured_at": os.environ.get("FAKE_AT", "2026-01-01T02:17:00+00:00"),
            "cluster": CLUSTER,
            "time_scale": TIME_SCALE,
            "replicas": [],
        }
        Path(args[args.index("--save") + 1]).write_text(json.dumps(profile))
        print("h100-0     38,531 ±1%")
        if "--baseline" in args:
            print("drift h100-0: decode +50%, prefill +0%, overhead +0%")
        rc = int(os.environ.get("FAKE_FIT_RC", "0"))
        if rc == 1:
            print("drift: h100-0 is 50% slower than in B (more than 10%)", file=sys.stderr)
        return rc
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
