"""Plain progress lines for a log: when stderr is not a terminal there is no live display.

A pipe (CI, ``| tee``, the demo's log) gets one timestamped line every
:data:`EVERY_S` seconds from a daemon thread, whatever the run is doing (a trial,
confirmation, a rollout), so a reader of the log never waits long for a sign of life.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

EVERY_S = 5.0
"""Seconds between lines: well inside the 10 s a reader of a log should wait at most."""


def plain(markup: str) -> str:
    """Rich markup as one plain line (line breaks become `` | ``)."""
    from rich.text import Text

    return " | ".join(s.strip() for s in Text.from_markup(markup).plain.splitlines() if s.strip())


@contextlib.contextmanager
def ticking(
    render: Callable[[], str | None],
    emit: Callable[[str], None],
    enabled: bool,
    every_s: float = EVERY_S,
) -> Iterator[None]:
    """Call ``emit("progress " + render())`` every ``every_s`` seconds while the block runs.

    ``render`` returns rich markup (made plain here) or None for "nothing to say yet".
    """
    if not enabled:
        yield
        return
    done = threading.Event()

    def loop() -> None:
        while not done.wait(every_s):
            text = render()
            if text:
                emit("progress " + plain(text))

    thread = threading.Thread(target=loop, name="lbtune-progress-lines", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=every_s)
