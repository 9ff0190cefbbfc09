"""``--ci`` mode: plain log lines, no prompts, exit codes a pipeline can act on.

What ``--ci`` changes on ``stress``, ``optimize`` and ``compare`` (see ``docs/ci.md``):

* output: no live display and no colour; progress is one plain line every
  :data:`PROGRESS_EVERY_S` seconds (stress) or per finished trial (optimize), logs are
  ``time level logger: message`` lines on stderr; tables print without colour;
* nothing ever prompts (no command does; ``--ci`` keeps it that way);
* exit codes: 0 ok, 1 an SLO breach (stress), a rolled-back winner (optimize) or a
  significant regression beyond the thresholds (compare), 2 bad input or an unreachable
  target, 3 an infrastructure failure, 130 interrupted.

Independent of ``--ci``: ``--junit PATH`` writes JUnit XML
(:mod:`lbtune.report.junit`), and when ``GITHUB_STEP_SUMMARY`` names a file the
command's Markdown summary is appended to it (:func:`append_step_summary`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from lbtune.errors import LbtuneError
from lbtune.safety.files import check_out_file
from lbtune.safety.secrets import ScrubFilter

if TYPE_CHECKING:
    from rich.console import Console

    from lbtune.loadgen.collect import Progress
    from lbtune.metrics.summary import RunSummary
    from lbtune.search.result import StudyResult
    from lbtune.tune.options import StudyProgress

STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
PROGRESS_EVERY_S = 5.0


def console(stderr: bool = False, width: int = 140) -> Console:
    """A rich console that writes plain text: no colour, no markup styling, no live updates."""
    from rich.console import Console

    return Console(
        stderr=stderr,
        color_system=None,
        force_terminal=False,
        force_interactive=False,
        highlight=False,
        emoji=False,
        width=width,
        soft_wrap=True,
    )


def plain_logging() -> None:
    """Replace the rich log handler with plain ``time level logger: message`` lines."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    )
    handler.addFilter(ScrubFilter())  # no secret of this process in a log line
    root.handlers[:] = [handler]


def line(msg: str, stream: TextIO | None = None) -> None:
    """One plain, timestamped progress line on stderr."""
    out = stream or sys.stderr
    out.write(f"{time.strftime('%H:%M:%S')} {msg}\n")
    out.flush()


class StressLines:
    """Stress progress as a plain line every ``every_s`` seconds (and the first snapshot)."""

    def __init__(
        self,
        fmt: Callable[[Progress], str],
        every_s: float = PROGRESS_EVERY_S,
        emit: Callable[[str], None] = line,
    ):
        self.fmt = fmt
        self.every_s = every_s
        self.emit = emit
        self._last: float | None = None

    def __call__(self, p: Progress) -> None:
        now = time.monotonic()
        if self._last is None or now - self._last >= self.every_s:
            self._last = now
            self.emit("progress " + self.fmt(p))


class StudyLines:
    """Optimize progress as one plain line per finished trial."""

    def __init__(self, emit: Callable[[str], None] = line):
        self.emit = emit
        self._done = -1
        self._pruned = 0
        self._failed = 0

    def __call__(self, p: StudyProgress) -> None:
        if self._done < 0:  # first snapshot: counts so far (a resumed study has some)
            self._done, self._pruned, self._failed = p.done, p.pruned, p.failed
            return
        if p.done <= self._done:
            return
        state = "COMPLETE"
        if p.failed > self._failed:
            state = "FAIL"
        elif p.pruned > self._pruned:
            state = "PRUNED"
        self._done, self._pruned, self._failed = p.done, p.pruned, p.failed
        score = "" if p.last_value is None or state == "FAIL" else f" score {p.last_value:.3f}"
        best = "-" if p.best is None else f"{p.best:.3f} (trial {p.best_trial})"
        self.emit(
            f"trial {p.trial} ({p.role}) {state}{score} | best {best} | "
            f"{p.done}/{p.budget} done, {p.pruned} pruned, {p.failed} failed"
        )


def append_step_summary(markdown: str, env: dict[str, str] | None = None) -> Path | None:
    """Append ``markdown`` to the file ``$GITHUB_STEP_SUMMARY`` names; None when unset."""
    target = (env if env is not None else os.environ).get(STEP_SUMMARY_ENV)
    if not target:
        return None
    p = Path(target)
    with p.open("a", encoding="utf-8") as f:
        f.write(markdown if markdown.endswith("\n") else markdown + "\n")
        f.write("\n")
    return p


# --- summaries and exit codes -------------------------------------------------------


def slo_breaches(summary: RunSummary) -> list[str]:
    """One phrase per failed SLO check, e.g. ``p99_ttft 512 ms > 350 ms``."""
    from lbtune.report.junit import _check_text

    out = []
    for c in summary.slo_checks:
        if c.ok is False:
            value, target = _check_text(c)
            out.append(f"{c.name} {value} > {target}")
    return out


def stress_markdown(summary: RunSummary, report_dir: str | None = None) -> str:
    """A short step summary: verdict, headline figures, SLO checks, warnings."""
    from lbtune.report import frame
    from lbtune.report.markdown import table

    breaches = slo_breaches(summary)
    mark = (
        "❌ SLO breached: " + ", ".join(breaches) if breaches else f"✅ {frame.slo_head(summary)}"
    )
    if not summary.slo_checks:
        mark = "no SLO checked"
    parts = [f"### lbtune stress `{summary.scenario}`: {mark}", ""]
    parts += [f"> ⚠ {w}" for w in frame.warnings(summary)]
    parts += ["", table(frame.headline(summary))]
    if summary.slo_checks:
        parts += ["", table(frame.slo_table(summary))]
    if report_dir:
        parts += ["", f"Report: `{report_dir}`"]
    return "\n".join(parts) + "\n"


def study_markdown(result: StudyResult) -> str:
    """A short step summary: headline, before/after, confirmation, rollout."""
    from lbtune.report.markdown import table
    from lbtune.report.study_frame import before_after, confirmation_table, headline

    r = result.rollout
    bad = r is not None and (r.rolled_back or not r.applied)
    parts = [
        f"### {'❌' if bad else '✅'} lbtune optimize `{result.study}`",
        "",
        f"**{headline(result)}**",
        "",
        f"Scenario `{result.scenario}`, target `{result.target}`: {len(result.trials)} trials "
        f"({result.count('COMPLETE')} complete, {result.count('PRUNED')} pruned, "
        f"{result.count('FAIL')} failed) in {result.elapsed_s / 60:.1f} min.",
        "",
        table(before_after(result)),
    ]
    conf = confirmation_table(result)
    if conf.rows:
        parts += ["", table(conf)]
    if result.notes:
        parts += [""] + [f"- {n}" for n in result.notes]
    if result.report_dir:
        parts += ["", f"Report: `{result.report_dir}`"]
    return "\n".join(parts) + "\n"


def study_exit_code(result: StudyResult) -> int:
    """``--ci`` exit code of a finished study (see the module docstring).

    3: no trial could be measured, the rollout or the restore of the last known good
    failed, or the study stopped on an error after the search; 1: the applied winner
    was worse in its verification and was rolled back; 130: interrupted; else 0.
    """
    if result.interrupted:
        return 130
    r = result.rollout
    infra = result.count("COMPLETE") == 0 or (r is not None and not r.applied)
    infra = infra or any(
        n.startswith(("could not restore", "stopped after the search")) for n in result.notes
    )
    if infra:
        return 3
    if r is not None and r.rolled_back:
        return 1
    return 0


def start(ci: bool, junit: Path | None) -> Console:
    """Before a command's work: ``--junit`` must be writable (exit 2 before any load), and
    under ``--ci`` logs become plain lines. The console for progress on stderr."""
    from rich.console import Console

    check_writable(junit)
    if not ci:
        return Console(stderr=True)
    plain_logging()
    return console(stderr=True)


def check_writable(path: Path | None, option: str = "--junit") -> None:
    """Fail early (exit 2), before any load is sent, when ``path`` cannot be written: a
    directory, a device or FIFO, empty, not writable
    (:func:`lbtune.safety.files.check_out_file`)."""
    if path is not None:
        check_out_file(path, option)


def junit_on_error(path: Path | None, command: str, exc: BaseException) -> None:
    """With ``--junit``, record a command that stopped on an error as one errored case."""
    from lbtune.report.junit import error_suite, write_junit

    if path is None:
        return
    code = exc.exit_code if isinstance(exc, LbtuneError) else 3
    with contextlib.suppress(OSError):
        write_junit(path, [error_suite(command, exc, code)])
