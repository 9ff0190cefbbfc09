"""Two scheduler paths the other files do not reach: an empty candidate set (``no_candidate``,
counted, the request left to the model backend's leastconn), and the context-length filter from
the ``ctx.<backend>`` fact lbtune writes from the model profile."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lbtune.sim.profiles import MODEL_PROFILES
from lbtune.targets.base import pool_names
from lbtune.targets.haproxy import llm
from lbtune.targets.haproxy.files import ALL_BACKEND, Site
from lbtune.targets.haproxy.target import HaproxyTarget
from tests.targets.haproxy_llm.conftest import M8, Cluster, endpoints
from tests.targets.haproxy_llm.test_scheduler import fallback, llm_on, words

__all__ = ["llm_on"]  # the fixture, re-used

BE = pool_names([M8])[M8]


def test_the_map_holds_each_known_models_context_length(tmp_path: Path) -> None:
    target = HaproxyTarget(endpoints(tmp_path, [1, 2, 3], 4, 5))
    site = Site.from_endpoints(target.endpoints)
    entries = dict(
        ln.split(" ", 1) for ln in llm.map_text(site, {"algorithm": "llm"}, []).splitlines()[1:]
    )
    assert entries[f"ctx.{BE}"] == str(MODEL_PROFILES[M8].context_length) == "131072"
    assert entries[f"ctx.long_{BE}"] == entries[f"ctx.{BE}"]
    assert llm.is_fact(f"ctx.{BE}")


def _scrapes(c: Cluster) -> float:
    return c.metrics()["lbtune_llm_scrapes_total"]


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy missing")
def test_no_candidate_is_counted_and_leaves_the_answer_to_haproxy(llm_on: Cluster) -> None:
    """Every server of the ``all`` backend (the one the scrape task reads UP from, and the one
    the model backends ``track``) in maintenance: the scheduler finds no replica up, counts
    ``no_candidate`` and places nothing; leastconn has no server either, so the answer is
    HAProxy's own 503 (no server available), not a Lua error. Back to ready, the scheduler
    places requests again."""
    rt = llm_on.target.runtime
    names = list(llm_on.replicas)
    before, errors = fallback(llm_on, "no_candidate"), fallback(llm_on, "lua_error")
    try:
        seen = _scrapes(llm_on)
        rt.execute([f"set server {ALL_BACKEND}/{n} state maint" for n in names])
        # two scrape rounds after the change: one whole loop has read every status since
        llm_on.wait_metric("lbtune_llm_scrapes_total", lambda v: v >= seen + 2 * len(names))
        codes = [llm_on.chat(words(20)).status_code for _ in range(3)]
        assert codes == [503, 503, 503]
        assert fallback(llm_on, "no_candidate") == before + 3
        assert fallback(llm_on, "lua_error") == errors
    finally:
        rt.execute([f"set server {ALL_BACKEND}/{n} state ready" for n in names])
    seen = _scrapes(llm_on)
    llm_on.wait_metric("lbtune_llm_scrapes_total", lambda v: v >= seen + 2 * len(names))
    assert llm_on.chat(words(20)).status_code == 200
    assert fallback(llm_on, "no_candidate") == before + 3  # the scheduler placed it


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy missing")
def test_a_request_longer_than_the_context_gets_the_admission_answer(llm_on: Cluster) -> None:
    """The profile's 131072 tokens would need a 512 KiB body; the test lowers the live
    ``ctx.<backend>`` fact to 300 tokens (the Lua reads it per request) instead. A ~1.2k-token
    prompt then fits no replica: under ``admission: reject`` it is a 429, and a short one is
    still routed."""
    rt = llm_on.target.runtime
    live = llm.read_live(rt, llm.LlmFiles.in_dir(llm_on.target.state_dir))
    assert live[f"ctx.{BE}"] == "131072"  # written by lbtune, loaded by the worker
    llm_on.target.apply({"llm.admission": "reject"})
    m = llm.LlmFiles.in_dir(llm_on.target.state_dir).map
    rt.execute([f"set map {m} ctx.{BE} 300"])
    try:
        before = llm_on.metrics()["lbtune_llm_rejected_total"]
        long = llm_on.chat(words(150))  # ~4.6 kB of body: ~1.2k tokens at 4 bytes each
        assert long.status_code == 429 and "kv_cache_full" in long.text
        assert llm_on.metrics()["lbtune_llm_rejected_total"] == before + 1
        assert llm_on.chat("hi " + words(3)).status_code == 200
    finally:
        rt.execute([f"set map {m} ctx.{BE} {live[f'ctx.{BE}']}"])
    assert llm_on.chat(words(150)).status_code == 200
