"""``POST /admin/crash``: a replica dies like a killed process, its neighbours live on."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from http.client import HTTPException

from lbtune.sim.host import run_in_thread
from tests.sim.conftest import M8, http, make_spec, wait_for


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return True
    return False


def test_crash_resets_streams_closes_port_and_spares_other_replicas() -> None:
    spec = make_spec(time_scale=5.0, a=("h100-80g", [M8], {}), b=("h100-80g", [M8], {}))
    with run_in_thread(spec) as host:
        a, b = host.urls["a"], host.urls["b"]
        body = json.dumps(
            {
                "model": M8,
                "prompt": "hello there",
                "max_tokens": 400,
                "ignore_eos": True,
                "stream": True,
            }
        ).encode()
        outcome: dict[str, object] = {}

        def stream() -> None:
            req = urllib.request.Request(
                a + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
            )
            got = b""
            try:
                with urllib.request.urlopen(req, timeout=20) as resp:
                    while chunk := resp.read1(4096):
                        got += chunk
                        outcome["started"] = True
            except (OSError, ValueError, HTTPException) as exc:  # reset mid-chunk
                outcome["error"] = type(exc).__name__
            outcome["done"] = b"[DONE]" in got

        t = threading.Thread(target=stream)
        t.start()
        assert wait_for(lambda: outcome.get("started") is True, timeout=10)
        status, state, _ = http(a + "/admin/crash", body={})
        assert status == 200 and state["state"] == "crashing"
        t.join(timeout=15)
        assert not t.is_alive()
        assert outcome.get("done") is False, "a crashed replica must not finish its stream"
        assert wait_for(lambda: _refused(host.ports["a"]), timeout=5)
        status, payload, _ = http(b + "/health")
        assert status == 200
        status, payload, _ = http(
            b + "/v1/completions", body={"model": M8, "prompt": "hi", "max_tokens": 4}
        )
        assert status == 200 and payload["usage"]["completion_tokens"] == 4
