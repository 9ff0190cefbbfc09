"""Issue 29's fuzz families around the loaders: output paths, foreign storage files, inputs
that are not regular files, and user names that become paths.

Each family draws a command, an option and a bad kind of path, builds it in a fresh
directory, runs the CLI in this process (``lbtune.cli.main``) and asks for what issue 29
asks: exit 2, one ``error:`` line naming the option or path, no traceback, nothing started,
nothing written, a foreign file left byte for byte as it was. No cluster is reachable:
``LBTUNE_STATE_DIR`` is an empty directory and the one target URL is a closed port, so a
case that were wrongly accepted fails fast instead of sending load.

A fresh seed on every run (``FRESH``: new cases over time; a failure prints the blob that
reproduces it; ``LBTUNE_FUZZ_FIXED=1`` repeats the examples).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import lbtune.run.stress as run_stress_module
import lbtune.tune.optimize as optimize_module
from lbtune.history.dbfile import HISTORY_TABLES, OPTUNA_TABLES
from lbtune.safety.files import inside, name_part
from tests.robustness.test_fuzz import FRESH

pytestmark = pytest.mark.timeout(300)

CLOSED = "http://127.0.0.1:9"
SCENARIO = (
    "name: s\nduration_s: 5\nload: {type: constant, users: 2}\nmodels: {echo: 1}\n"
    "prompt_tokens: {type: fixed, value: 8}\noutput_tokens: {type: fixed, value: 4}\n"
)
TRACE = "timestamp,input_tokens,output_tokens\n0,10,10\n1,10,10\n"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from lbtune.cli import main

    capsys.readouterr()
    old = sys.argv
    sys.argv = ["lbtune", *argv]
    try:
        main()
        rc = 0
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = old
    return rc, capsys.readouterr().err


def _one_line(rc: int, err: str) -> None:
    assert rc == 2, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err


REAL_RUN_STRESS = run_stress_module.run_stress


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory for the cases, the working directory, with no cluster state."""
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("LBTUNE_STATE_DIR", str(state))
    monkeypatch.delenv("LBTUNE_HISTORY_DB", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.chdir(tmp_path)

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("a refused case reached the work itself")

    monkeypatch.setattr(run_stress_module, "run_stress", no_work)
    monkeypatch.setattr(optimize_module, "run_optimize", no_work)
    return tmp_path


def _fresh(box: Path) -> Path:
    d = Path(tempfile.mkdtemp(dir=box))
    (d / "s.yaml").write_text(SCENARIO)
    (d / "t.csv").write_text(TRACE)
    return d


# --- output paths --------------------------------------------------------------------------

BAD_DIRS = ["a-file", "a-fifo", "/dev/null", "holds-files", "", " ", "ctl\x1b[2Jdir", "a-file/sub"]
BAD_FILES = ["a-dir", "a-fifo", "/dev/null", "", "ctl\nfile.xml", "a-file/sub.xml"]


def _make(d: Path, name: str) -> str:
    """``name`` inside ``d`` as the kind it names (or as is: absolute, empty, blank)."""
    (d / "a-file").write_text("x")
    (d / "a-dir").mkdir(exist_ok=True)
    (d / "holds-files").mkdir(exist_ok=True)
    (d / "holds-files" / "report.md").write_text("an earlier report")
    if not (d / "a-fifo").exists():
        os.mkfifo(d / "a-fifo")
    return name if name.startswith("/") or not name.strip() else str(d / name)


OUT_CASES = st.one_of(
    st.tuples(st.sampled_from(["stress", "optimize"]), st.just("--out"), st.sampled_from(BAD_DIRS)),
    st.tuples(
        st.sampled_from(["stress", "optimize", "history", "fit"]),
        st.sampled_from(["--junit", "--html", "--out"]),
        st.sampled_from(BAD_FILES),
    ).filter(lambda c: c[2] == "--junit" or c[0] in ("history", "fit")),
    st.tuples(
        st.sampled_from(["stress", "status"]),
        st.just("--state-dir"),
        # a state dir holds files; an empty --state-dir reaches lbtune as "." (click's Path)
        st.sampled_from([n for n in BAD_DIRS if n.strip() and n != "holds-files"]),
    ),
)
"""(command, option, bad path): directories for ``--out``/``--state-dir`` of the long
commands, files for ``--junit``/``--html`` and ``scenarios fit --out``."""


def _out_argv(command: str, option: str, path: str, d: Path) -> list[str] | None:
    scen, store = str(d / "s.yaml"), f"sqlite:///{d}/studies.db"
    if command == "stress":
        extra = [] if option == "--out" else ["--out", str(d / "new-report")]
        return ["stress", "--scenario", scen, "--target", CLOSED, *extra, option, path]
    if command == "optimize" and option != "--html":
        extra = [] if option == "--out" else ["--out", str(d / "new-report")]
        return ["optimize", "--scenario", scen, "--storage", store, *extra, option, path]
    if command == "history" and option == "--html":
        return ["history", "--storage", str(d / "h.db"), option, path]
    if command == "fit" and option == "--out":
        return ["scenarios", "fit", str(d / "t.csv"), "--format", "lbtune", option, path]
    if command == "status":
        return ["cluster", "status", option, path]
    return None


@FRESH
@given(OUT_CASES)
def test_a_bad_output_path_is_one_line_before_any_work(
    box: Path, capsys: pytest.CaptureFixture[str], case: tuple[str, str, str]
) -> None:
    command, option, name = case
    d = _fresh(box)
    argv = _out_argv(command, option, _make(d, name), d)
    if argv is None:
        return
    before = sorted(p.name for p in d.rglob("*"))
    rc, err = _run(argv, capsys)
    _one_line(rc, err)
    assert option in err or "--out" in err or "state" in err.lower(), err
    assert "\x1b" not in err
    assert sorted(p.name for p in d.rglob("*")) == before  # nothing written
    assert (d / "holds-files" / "report.md").read_text() == "an earlier report"


# --- storage files that are not lbtune's ---------------------------------------------------

OWN_TABLES = OPTUNA_TABLES | HISTORY_TABLES
TABLE = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12).filter(
    lambda t: not t.startswith("sqlite")
)
FOREIGN = st.one_of(
    st.tuples(st.just("sqlite"), st.lists(TABLE, min_size=1, max_size=4, unique=True)),
    st.tuples(st.just("bytes"), st.binary(min_size=1, max_size=200)),
    st.tuples(st.sampled_from(["fifo", "dir", "/dev/zero"]), st.just(b"")),
)


def _foreign(d: Path, kind: str, content: object) -> Path:
    p = d / "their.db"
    if kind == "sqlite":
        assert isinstance(content, list)
        conn = sqlite3.connect(p)
        for t in content:
            conn.execute(f'CREATE TABLE "{t}" (a)')
        conn.commit()
        conn.close()
    elif kind == "bytes":
        assert isinstance(content, bytes)
        p.write_bytes(b"\x00" + content if content.startswith(b"SQLite") else content)
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "dir":
        p.mkdir()
    else:
        return Path(kind)
    return p


@FRESH
@given(FOREIGN, st.sampled_from(["history", "apply", "optimize"]))
def test_a_foreign_storage_file_is_refused_untouched(
    box: Path, capsys: pytest.CaptureFixture[str], foreign: tuple[str, object], command: str
) -> None:
    kind, content = foreign
    d = _fresh(box)
    p = _foreign(d, kind, content)
    regular = stat.S_ISREG(os.stat(p).st_mode)
    digest = hashlib.sha256(p.read_bytes()).hexdigest() if regular else ""
    if kind == "sqlite" and isinstance(content, list) and set(content) <= OWN_TABLES:
        return  # only lbtune's and Optuna's table names: that may be a studies database
    argv = {
        "history": ["history", "--storage", str(p)],
        "apply": ["apply", "--study", "s", "--storage", f"sqlite:///{p}", "--target", "haproxy"],
        "optimize": ["optimize", "--scenario", str(d / "s.yaml"), "--storage", f"sqlite:///{p}"],
    }[command]
    rc, err = _run(argv, capsys)
    _one_line(rc, err)
    if regular:
        assert hashlib.sha256(p.read_bytes()).hexdigest() == digest
    assert not list(d.glob("their.db-*"))  # no journal: never opened for writing


# --- inputs that are not regular files -----------------------------------------------------

NOT_FILES = st.sampled_from(["/dev/zero", "/dev/null", "a-fifo", "a-dir", "/proc/self/fd/0"])
READERS = st.sampled_from(
    [
        ["scenarios", "show", "{x}"],
        ["scenarios", "validate", "{x}"],
        ["apply", "--params", "{x}", "--target", "haproxy"],
        ["apply", "--space", "{x}", "--params", "{d}/p.yaml", "--target", "haproxy"],
        ["agent", "run", "--config", "{x}", "--once"],
        ["stress", "--scenario", "{x}", "--target", CLOSED],
        ["stress", "--trace", "{x}", "--target", CLOSED],
        ["scenarios", "fit", "{x}", "--format", "azure", "--out", "{d}/fit.yaml"],
        ["compare", "{x}", "{d}"],
        ["stress", "--scenario", "{d}/s.yaml", "--tokenizer", "{x}", "--target", CLOSED],
    ]
)


@FRESH
@given(NOT_FILES, READERS)
def test_an_input_that_is_not_a_regular_file_is_one_line(
    box: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    reader: list[str],
) -> None:
    # A tokenizer is read where the run starts (before any load: the target is a closed port).
    monkeypatch.setattr(run_stress_module, "run_stress", REAL_RUN_STRESS)
    d = _fresh(box)
    (d / "p.yaml").write_text("weight.h100-0: 50\n")
    x = _make(d, name)
    argv = [a.replace("{x}", x).replace("{d}", str(d)) for a in reader]
    rc, err = _run(argv, capsys)
    if rc == 2 and "Usage" in err:
        return  # the CLI's own usage error (an option this command lacks): no read happened
    _one_line(rc, err)


# --- names that become paths ---------------------------------------------------------------

NAMES = st.text(max_size=120) | st.sampled_from(
    ["..", ".", "../../../../etc/x", "/abs/x", "a/../../b", "\x1b[31mred", "a\nb", "-", ".hidden"]
)


@FRESH
@given(NAMES)
def test_a_name_never_leaves_its_directory(tmp_path: Path, name: str) -> None:
    part = name_part(name, "study")
    assert part not in ("", ".", "..") and "/" not in part and len(part) <= 80
    assert all(c.isascii() and (c.isalnum() or c in "_.-") for c in part)
    joined = inside(tmp_path, f"20260101-000000-optimize-{part}")
    assert joined.resolve().parent == tmp_path.resolve()


@FRESH
@given(st.sampled_from(["\x1b[2J", "\n", "\r", "\x00", "\u202e"]), st.text(max_size=20))
def test_a_study_name_with_a_control_character_is_refused_escaped(
    box: Path, capsys: pytest.CaptureFixture[str], control: str, text: str
) -> None:
    d = _fresh(box)
    study = f"{text}{control}{text}"
    argv = ["optimize", "--study", study, "--storage", f"sqlite:///{d}/s.db", "--out", f"{d}/o"]
    rc, err = _run(argv, capsys)
    _one_line(rc, err)
    assert "--study" in err and control not in err.rstrip("\n")
    assert not (d / "o").exists() and not (d / "s.db").exists()
