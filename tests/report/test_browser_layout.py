"""Both reports in headless Chromium: no table overflows sideways, every plot names its axes.

The page is loaded with a small script appended that measures the laid-out DOM (each
table's width against the space it has, the page's own width, each image's alt text and
decoded size) and writes the result as JSON into the DOM; ``chromium --dump-dom`` prints
it back. Nothing is read from pixels. ``LBTUNE_SKIP_BROWSER=1`` skips the module.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from lbtune.objective import Figures, ObjectiveSpec
from lbtune.report import write_report
from lbtune.report.study import write_study_report
from lbtune.search.result import Comparison, Confirmation, StudyResult, TrialResult
from lbtune.targets.base import ParamSet
from tests.report import data

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.environ.get("LBTUNE_SKIP_BROWSER") == "1", reason="LBTUNE_SKIP_BROWSER=1"
    ),
]

PROBE = """<script>
window.addEventListener("load", () => {
  const main = document.querySelector("main");
  const tables = [...document.querySelectorAll("table")].map((t) => {
    const box = t.closest(".scroll") || t.parentElement;
    return {head: t.querySelector("th") ? t.querySelector("th").textContent : "",
            width: t.getBoundingClientRect().width, room: box.clientWidth,
            scroll: box.scrollWidth, client: box.clientWidth, main: main.clientWidth};
  });
  const images = [...document.querySelectorAll("figure img")].map((i) => ({
    alt: i.alt, natural: i.naturalWidth, width: i.getBoundingClientRect().width,
    room: i.parentElement.clientWidth}));
  const out = document.createElement("pre");
  out.id = "lbtune-layout";
  out.textContent = JSON.stringify({tables, images, page: document.documentElement.scrollWidth,
                                    viewport: window.innerWidth});
  document.body.appendChild(out);
});
</script>"""

FIG = Figures(p99_e2e_s=1.2, p99_ttft_s=0.3, requests_per_s=5.0, p50_ttft_s=0.1, completed=50)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    pytest.fail("chromium is needed for the browser layout test (or set LBTUNE_SKIP_BROWSER=1)")


def measure(page: Path, width: int) -> dict[str, Any]:
    probe = page.with_name(page.stem + "-probe.html")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"))
    with tempfile.TemporaryDirectory(prefix="lbtune-chromium-") as profile:
        out = subprocess.run(
            [
                _chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                f"--window-size={width},2000",
                "--virtual-time-budget=10000",
                "--dump-dom",
                probe.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    found = re.search(r'<pre id="lbtune-layout">(.*?)</pre>', out.stdout, re.S)
    assert found, f"no layout from chromium (rc {out.returncode}): {out.stderr[-2000:]}"
    text = found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
    result: dict[str, Any] = json.loads(text.replace("&amp;", "&"))
    return result


def study() -> StudyResult:
    algos = ["roundrobin", "leastconn", "random", "hash", "leastconn", "roundrobin"]
    trials = []
    for i, algo in enumerate(algos):
        params: ParamSet = {
            "weight.h100-0": 100 + 20 * i,
            "weight.l4-0": 100 - 10 * i,
            "algorithm": algo,
            "random_draws": 2 + i % 3,
            "hash_bytes": 256,
            "hash_balance_factor": 150,
            "queue_timeout_s": 60,
            "agent.a": 0.5,
        }
        note = "load generator fell behind: local: TTFT P50 34.7 ms may be overstated" * (i == 2)
        trials.append(
            TrialResult(
                i,
                "COMPLETE" if i != 2 else "FAIL",
                "live" if i == 0 else "sampled",
                params,
                None if i == 2 else 1.0 - 0.1 * i,
                None,
                FIG,
                True,
                fail_reason=note or None,
                duration_s=9.0,
            )
        )
    comp = Comparison(4, trials[4].params, (0.6,), (1.0,), -0.4, -0.5, -0.3, -0.4, True, True, FIG)
    conf = Confirmation("improved", 0, FIG, (comp,), winner=4, runs_per_arm=1, order=("A", "B1"))
    return StudyResult(
        study="layout",
        storage="sqlite://",
        target="haproxy",
        scenario="chat",
        sampler="tpe",
        spec=ObjectiveSpec(),
        budget=6,
        trials=tuple(trials),
        best=4,
        baseline=0,
        importances={"algorithm": 0.6, "weight.h100-0": 0.3, "weight.l4-0": 0.1},
        confirmation=conf,
        elapsed_s=60.0,
    )


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("browser")
    stress = write_report(root / "stress", data.summary(), data.records()).report_html
    one_stage = write_report(root / "one", data.summary(stages=()), data.records()).report_html
    studied = write_study_report(root / "study", study()).report_html
    return {"stress": stress, "one-stage": one_stage, "study": studied}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["stress", "one-stage", "study"])
def test_no_table_overflows_and_every_plot_names_its_axes_at_1400_px(
    pages: dict[str, Path], name: str
) -> None:
    got = measure(pages[name], 1400)
    assert got["tables"], "no table measured"
    for t in got["tables"]:
        assert t["scroll"] <= t["client"] + 1, f"{name}: table {t['head']!r} overflows: {t}"
        assert t["width"] <= t["main"] + 1, f"{name}: table {t['head']!r} wider than the page"
    assert got["page"] <= got["viewport"], f"{name}: the page scrolls sideways"
    assert got["images"], "no plot measured"
    for img in got["images"]:
        assert img["natural"] > 0, f"{name}: a plot did not decode: {img['alt']}"
        assert img["width"] <= img["room"] + 1
        panels = [p for p in img["alt"].split(";") if "x = " in p or "colour = " in p]
        assert panels, f"{name}: a plot names no axes: {img['alt']!r}"
        for p in panels:
            assert "(none)" not in p, f"{name}: an unlabelled axis: {p!r}"
            if "colour = " not in p:
                assert re.search(r"x = \S.*, y = \S", p), f"{name}: {p!r}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["stress", "study"])
def test_at_800_px_the_page_itself_does_not_scroll_sideways(
    pages: dict[str, Path], name: str
) -> None:
    got = measure(pages[name], 800)
    assert got["page"] <= got["viewport"], f"{name}: page {got['page']} > {got['viewport']} px"
    for img in got["images"]:
        assert img["width"] <= img["room"] + 1, f"{name}: a plot wider than its frame"
