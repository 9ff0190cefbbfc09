"""Kernel receive time stamps of response bytes (``SO_TIMESTAMPNS`` + ``recvmsg``).

With ``SO_TIMESTAMPNS`` set on a TCP socket, every ``recvmsg`` carries in its
ancillary data the arrival time (``CLOCK_REALTIME``, the clock of ``time.time()``)
of the last segment it returned, so however late the event loop gets to a socket,
the stamp is when the bytes came. The kernel keeps one time per read: a read that
returns several segments is stamped with the last one's arrival. :class:`Peek`
recovers the first content event's own arrival in that case by peeking
(``MSG_PEEK``) up to the event's last byte.

Where the kernel gives no stamp (EOF, an unstamped segment) a read is stamped with
``time.time()``; :func:`loop_reader` stamps every read that way (TLS, or for
comparison).
"""

from __future__ import annotations

import platform
import socket
import struct
import sys
from collections.abc import Callable
from time import time
from typing import Any

from lbtune.loadgen.wire import first_content_at

__all__ = [
    "KERNEL_TIMESTAMPS",
    "RECV",
    "SO_TIMESTAMPNS",
    "Peek",
    "Reader",
    "enable",
    "kernel_reader",
    "loop_reader",
]

RECV = 65536
"""Bytes asked for by one read; a read that returns fewer drained the socket's queue."""
SO_TIMESTAMPNS = 35
"""``SO_TIMESTAMPNS_OLD`` = ``SCM_TIMESTAMPNS_OLD`` (asm-generic; Python has no constant):
the ancillary data is a native ``struct timespec``."""
_TIMESPEC = struct.Struct("@ll")
_ANC = socket.CMSG_SPACE(_TIMESPEC.size)
KERNEL_TIMESTAMPS = sys.platform.startswith("linux") and platform.machine() in (
    "x86_64",
    "aarch64",
    "arm64",
    "riscv64",
    "ppc64le",
)
"""Architectures whose socket option numbers are asm-generic's."""

Reader = Callable[[], tuple[bytes, float]]
"""One read of a response: (bytes, arrival time of the last byte); ``b""`` at EOF."""


def enable(sock: Any) -> bool:
    """Ask the kernel to stamp ``sock``'s reads; False where it refuses."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def kernel_reader(sock: Any) -> Reader:
    """Reads stamped with the kernel's arrival time of their last byte."""
    recvmsg = sock.recvmsg
    unpack = _TIMESPEC.unpack
    size = _TIMESPEC.size

    def read() -> tuple[bytes, float]:
        data, anc, _flags, _addr = recvmsg(RECV, _ANC)
        if anc:
            cdata = anc[0][2]
            if len(cdata) == size:
                sec, nsec = unpack(cdata)
                return data, sec + nsec * 1e-9
        return data, time()  # EOF, or a segment the kernel did not stamp

    return read


def loop_reader(sock: Any) -> Reader:
    """Reads stamped with ``time.time()`` when the loop got to them (TLS)."""
    recv = sock.recv

    def read() -> tuple[bytes, float]:
        data = recv(RECV)
        return data, time()

    return read


class Peek:
    """Reads that leave the bytes queued (``MSG_PEEK``), for the first content event.

    The kernel stamps a read with the arrival of the last segment it touched, so a
    peek of ``n`` bytes tells when byte ``n - 1`` arrived. That recovers the first
    event's own arrival when later bytes were already queued behind it, as long as
    the kernel kept them in separate segments (it merges some).
    """

    __slots__ = ("_recv", "_recvmsg")

    def __init__(self, sock: Any) -> None:
        self._recvmsg = sock.recvmsg
        self._recv = sock.recv

    def peek(self, n: int) -> tuple[bytes, float]:
        data, anc, _flags, _addr = self._recvmsg(n, _ANC, socket.MSG_PEEK)
        if anc and len(anc[0][2]) == _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack(anc[0][2])
            return data, sec + nsec * 1e-9
        return data, time()

    def consume(self, n: int) -> None:
        while n > 0:  # the bytes are queued: this never waits
            got = len(self._recv(n))
            if not got:
                return
            n -= got

    def first_event_arrival(self, data: bytes, t: float) -> tuple[float, bool]:
        """(arrival, exact) of the first content event in the peeked ``data``."""
        p = first_content_at(data)
        end = data.find(b"\n\n", p) if p >= 0 else -1
        if end < 0:
            return t, False
        end += 2
        if data[end : end + 2] == b"\r\n":  # the HTTP chunk's own end, same write
            end += 2
        if end >= len(data):
            return t, False
        d1, t1 = self.peek(end)  # stamp of the segment holding the event's last byte
        d2, t2 = self.peek(end + 1)  # ... and of the next byte's
        if len(d1) < end or len(d2) < end + 1:
            return t, False
        return t1, t1 != t2  # different segments: nothing later was merged into it
