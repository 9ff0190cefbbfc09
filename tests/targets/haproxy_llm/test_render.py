"""The scheduler's config, Lua and map as rendered for algorithm: llm, checked by haproxy -c."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lbtune.targets.haproxy import config, llm
from lbtune.targets.haproxy.files import config_alerts
from lbtune.targets.haproxy.target import HaproxyTarget
from tests.targets.haproxy_llm.conftest import M8, endpoints


def test_llm_knobs_are_live_and_only_the_algorithm_is_structural() -> None:
    assert config.kind_of("llm.w_prefix", {"algorithm": "llm"}) == "live"
    assert config.kind_of("weight.h100-0", {"algorithm": "llm"}) == "live"
    assert config.kind_of("algorithm", {"algorithm": "llm"}) == "structural"


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy missing")
def test_rendered_config_and_map_pass_haproxy_check(tmp_path: Path) -> None:
    ep = endpoints(tmp_path, [18101, 18102, 18103], 18000, 18404)
    target = HaproxyTarget(ep)
    params = target.space().complete({"algorithm": "llm", "long_request_bytes": 8192}, {})
    text = config.render_config(target.site, params)
    files = llm.prepare(target.site, params, config.long_context_servers(target.site))
    assert files is not None and files.lua.read_text() == llm.lua_source()
    assert f"lua-load {files.lua}" in text and "http-request lua.llm_pick" in text
    assert "use-server l4-0 if { var(txn.llm_srv) -m str l4-0 }" in text
    long_be = text.split("\nbackend long_model_")[1]
    assert "use-server h100-0" in long_be and "use-server l4-0" not in long_be
    entries = dict(ln.split(" ", 1) for ln in files.map.read_text().splitlines()[1:])
    assert entries["w_prefix"] == "1.0" and entries["admission"] == "route"
    assert entries["long.h100-0"] == "1" and entries["long.l4-0"] == "0"
    # KV facts from the profiles: an H100 holds more KV than an L4
    assert int(entries["kvcap.h100-0"]) > int(entries["kvcap.l4-0"]) > 0
    assert entries[f"kvbpt.model_{M8}"] == "131072"
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(text)
    assert config_alerts(cfg) is None
