"""The files lbtune reads and the paths it writes: one owner for both.

Reading. Every file a user hands lbtune (scenarios, clusters, parameter spaces and sets,
agent configs, traces, tokenizers, ``run.json``/``summary.json``/``study.json``) is opened
by :func:`open_regular` (or read whole by :func:`read_bytes`/:func:`read_text`): it must be
a *regular* file (a FIFO blocks a reader forever; ``/dev/zero`` reports size 0 and never
ends) of at most the reader's cap, and no read takes more than the cap, even from a file
that grows while it is read. Every failure is one :class:`~lbtune.errors.ConfigError` line
that names the path and the problem.

Writing. :func:`check_out_dir` and :func:`check_out_file` check a path a command will write
(``--out``, ``--junit``, ``--html``, ``fit --out``, ``--state-dir``, the reports dir)
before any work starts: empty, a file where a directory is needed (or the reverse), a
device or FIFO, not writable, a report directory that already holds files (``--out`` is
never overwritten silently). :func:`name_part` turns a user's name (a study, a scenario)
into one safe path component, and :func:`inside` keeps a joined path inside its directory.
"""

from __future__ import annotations

import io
import os
import re
import stat
from pathlib import Path
from typing import Any, BinaryIO

from lbtune.errors import ConfigError, printable

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "MAX_REPORT_BYTES",
    "MAX_TOKENIZER_BYTES",
    "MAX_TRACE_BYTES",
    "check_out_dir",
    "check_out_file",
    "inside",
    "kind_of",
    "name_part",
    "open_regular",
    "read_bytes",
    "read_parquet",
    "read_text",
]

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
"""A document a user types (scenario, cluster, space, parameters, agent config): 16 MiB."""
MAX_REPORT_BYTES = 256 * 1024 * 1024
"""lbtune's own JSON read back (``run.json``, ``summary.json``, ``study.json``): 256 MiB."""
MAX_TRACE_BYTES = 2 * 1024 * 1024 * 1024
"""A trace file (CSV, JSONL, JSON, Parquet): 2 GiB."""
MAX_TOKENIZER_BYTES = 64 * 1024 * 1024
"""A Hugging Face ``tokenizer.json``: 64 MiB."""

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words (``a directory``, ``a FIFO (named pipe)``...)."""
    return next((word for test, word in _KINDS if test(mode)), "not a regular file")


def _shown(path: str | Path, where: str | None) -> str:
    return printable(where if where is not None else str(path))


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


class _Capped(io.RawIOBase):
    """A raw, seekable reader over ``fd`` that refuses to read past byte ``cap`` (a file
    that grows while it is read)."""

    def __init__(self, fd: int, cap: int, where: str) -> None:
        self._fd, self._cap, self._where = fd, cap, where

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return os.lseek(self._fd, offset, whence)

    def tell(self) -> int:
        return os.lseek(self._fd, 0, os.SEEK_CUR)

    def readinto(self, buf: memoryview | bytearray) -> int:  # type: ignore[override]
        view = memoryview(buf).cast("B")
        left = self._cap - self.tell()
        if left <= 0:
            # At the cap: one byte more means the file is larger than lbtune reads.
            if os.read(self._fd, 1):
                raise ConfigError(f"{self._where}: larger than the {self._cap} bytes lbtune reads")
            return 0
        return os.readv(self._fd, [view[: min(len(view), left)]])

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def open_regular(path: str | Path, where: str | None = None, *, max_bytes: int) -> BinaryIO:
    """``path`` opened for reading, buffered, after checking that it is a regular file of at
    most ``max_bytes``; reading past ``max_bytes`` raises. ``where`` names it in errors."""
    shown = _shown(path, where)
    try:
        st = os.stat(path)  # before opening: a FIFO or a device is never opened
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{shown}: {kind_of(st.st_mode)}, not a regular file; give a file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot read ({_why(exc)})") from None
    try:
        st = os.fstat(fd)  # what was opened (it may have been swapped since the stat)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{shown}: {kind_of(st.st_mode)}, not a regular file; give a file")
        if st.st_size > max_bytes:
            raise ConfigError(
                f"{shown}: {st.st_size} bytes, more than the {max_bytes} lbtune reads"
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return io.BufferedReader(_Capped(fd, max_bytes, shown))


def read_bytes(
    path: str | Path, where: str | None = None, *, max_bytes: int = MAX_DOCUMENT_BYTES
) -> bytes:
    """The bytes of the regular file ``path`` (at most ``max_bytes``), one line on failure."""
    with open_regular(path, where, max_bytes=max_bytes) as f:
        try:
            return f.read()
        except OSError as exc:
            raise ConfigError(f"{_shown(path, where)}: cannot read ({_why(exc)})") from None


def read_parquet(path: str | Path, where: str | None = None, *, max_bytes: int, what: str) -> Any:
    """The ``pyarrow.Table`` in the regular file ``path`` (at most ``max_bytes``); one
    :class:`ConfigError` line ("not ``what``") when it is not Parquet or is truncated.

    Read without starting any Arrow thread: Arrow's thread pools, once started by a read,
    abort the interpreter at exit in some runs ("terminate called without an active
    exception", exit -6), after the command's work and output are done. ``read_table`` with
    ``use_threads=False`` still starts its I/O pool (2 of 300 exits aborted under load);
    a ``ParquetFile`` without pre-buffering, decoded with ``use_threads=False``, starts
    none. Record files are small; one thread decodes them in milliseconds.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open_regular(path, where, max_bytes=max_bytes) as f:
        try:
            return pq.ParquetFile(f, pre_buffer=False).read(use_threads=False)
        except (OSError, ValueError, pa.ArrowException) as exc:  # truncated, not Parquet
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"{_shown(path, where)}: not {what} ({why})") from None


def read_text(
    path: str | Path, where: str | None = None, *, max_bytes: int = MAX_DOCUMENT_BYTES
) -> str:
    """:func:`read_bytes` decoded as UTF-8 (a byte-order mark dropped), one line on failure."""
    raw = read_bytes(path, where, max_bytes=max_bytes)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{_shown(path, where)}: not UTF-8 text (byte {exc.start}: "
            f"{raw[exc.start : exc.start + 1]!r}); save it as UTF-8"
        ) from None


# -- paths lbtune writes ------------------------------------------------------------------


def _check_text(path: str | Path | None, what: str) -> Path:
    text = "" if path is None else str(path)
    if not text.strip():
        raise ConfigError(f"{what}: an empty path; give a path")
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ConfigError(f"{what} {printable(text)}: control characters in a path; rename it")
    return Path(text)


def _creatable(p: Path, what: str) -> None:
    """``p`` does not exist: its nearest existing ancestor is a writable directory."""
    parent = p.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        st = os.stat(parent)
    except OSError as exc:
        raise ConfigError(f"{what} {printable(str(p))}: cannot be created ({_why(exc)})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(
            f"{what} {printable(str(p))}: cannot be created: {printable(str(parent))} is "
            f"{kind_of(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'a file'}, not a directory"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{what} {printable(str(p))}: cannot be created: {printable(str(parent))} is not "
            "writable"
        )


def check_out_dir(
    path: str | Path | None, what: str = "--out", *, fresh: bool = True, writable: bool = True
) -> Path:
    """``path`` as a directory a command may write into, checked before any work: not empty
    text, not a file or device, writable (or creatable; ``writable=False``: only its kind);
    with ``fresh``, empty or new, so an earlier report is never overwritten silently.
    Creates nothing."""
    p = _check_text(path, what)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        if writable:
            _creatable(p, what)
        return p
    except OSError as exc:
        raise ConfigError(f"{what} {printable(str(p))}: cannot be used ({_why(exc)})") from None
    if not stat.S_ISDIR(st.st_mode):
        kind = "a file" if stat.S_ISREG(st.st_mode) else kind_of(st.st_mode)
        raise ConfigError(f"{what} {printable(str(p))}: {kind}, not a directory")
    if writable and not os.access(p, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {printable(str(p))}: not writable")
    if fresh:
        held = sorted(e.name for e in os.scandir(p))
        if held:
            shown = ", ".join(printable(n) for n in held[:3]) + (", ..." if len(held) > 3 else "")
            raise ConfigError(
                f"{what} {printable(str(p))}: already holds files ({shown}); give a new or "
                "empty directory (lbtune does not overwrite a report)"
            )
    return p


def check_out_file(path: str | Path | None, what: str) -> Path:
    """``path`` as a file a command may (over)write, checked before any work: not empty
    text, not a directory, device or FIFO, writable (or creatable). Creates nothing."""
    p = _check_text(path, what)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        _creatable(p, what)
        return p
    except OSError as exc:
        raise ConfigError(f"{what} {printable(str(p))}: cannot be used ({_why(exc)})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} {printable(str(p))}: {kind_of(st.st_mode)}, not a file")
    if not os.access(p, os.W_OK):
        raise ConfigError(f"{what} {printable(str(p))}: not writable")
    return p


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def name_part(text: str, fallback: str = "x", max_len: int = 80) -> str:
    """``text`` as one safe path component: anything but ``[A-Za-z0-9_.-]`` becomes ``-``,
    no leading dot or dash (never ``.`` or ``..``), at most ``max_len`` characters."""
    part = _UNSAFE.sub("-", text).lstrip(".-").rstrip("-")[:max_len].rstrip(".-")
    return part or fallback


def inside(root: str | Path, name: str, what: str = "name") -> Path:
    """``root / name``, refused (ConfigError) when it would leave ``root``."""
    base = Path(root).absolute()
    joined = (base / name).resolve()
    if joined != base.resolve() and base.resolve() not in joined.parents:
        raise ConfigError(f"{what} {printable(name)!s}: leaves {printable(str(root))}; refused")
    return Path(root) / name
