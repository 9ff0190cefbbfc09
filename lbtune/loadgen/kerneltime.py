"""Kernel receive time stamps of response bytes (``SO_TIMESTAMPNS`` + ``recvmsg``).

With ``SO_TIMESTAMPNS`` set on a TCP socket, every ``recvmsg`` carries in its
ancillary data the arrival time (``CLOCK_REALTIME``, the clock of ``time.time()``)
of the last segment it returned, so however late the event loop gets to a socket,
the stamp is when the bytes came. The kernel keeps one time per read: a read that
returns several segments is stamped with the last one's arrival. :class:`Peek`
recovers the first content event's own arrival in that case by peeking
(``MSG_PEEK``) up to the event's last byte.

Every read says whether the kernel stamped it. Where it did not (EOF, or a segment
that came while the kernel's stamping was off) the read carries ``time.time()`` after
it returned: an upper bound of the arrival, never claimed as exact
(:mod:`lbtune.loadgen.response` bounds it by the last stamped read instead).
:func:`loop_reader` stamps every read that way (TLS, or for comparison).

The kernel stamps arriving segments only while some socket on the machine asks for
stamps, and turns that on *lazily* (``net_enable_timestamp`` flips a static key from a
work queue), so segments that come just after the first socket asked go unstamped.
:func:`hold` asks once per process, keeps asking for the process's lifetime, and waits
until a probe segment comes back stamped.
"""

from __future__ import annotations

import platform
import select
import socket
import struct
import sys
from collections.abc import Callable
from time import monotonic, sleep, time
from typing import Any

from lbtune.loadgen.wire import first_content_at

__all__ = [
    "KERNEL_TIMESTAMPS",
    "RECV",
    "SO_TIMESTAMPNS",
    "Peek",
    "Read",
    "Reader",
    "enable",
    "hold",
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

Read = tuple[bytes, float, bool]
"""One read of a response: (bytes, time, stamped): ``stamped`` — the time is the kernel's
arrival time of the last byte; else ``time.time()`` after the read returned (an upper
bound of the arrival). ``b""`` at EOF."""
Reader = Callable[[], Read]
_held: list[socket.socket] = []
_tried: list[bool] = []


def enable(sock: Any) -> bool:
    """Ask the kernel to stamp ``sock``'s reads; False where it refuses."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def hold(timeout_s: float = 2.0) -> bool:
    """Keep the kernel's receive stamping on for this process's lifetime; True once a
    probe segment over loopback came back stamped (within ``timeout_s``).

    A socket that asks for stamps keeps them on while it is open: one loopback pair is
    kept open (module-wide, made once); the probe is repeated until the deferred switch
    has flipped. False where the kernel refuses or never stamps (asked once: a later call
    answers at once).
    """
    if _held or _tried:
        return bool(_held)
    ok = _probe(timeout_s)
    _tried.append(ok)  # answered once per process (callers meanwhile probe for themselves)
    return ok


def _probe(timeout_s: float) -> bool:
    """One loopback pair asking for stamps, probed until a segment comes back stamped."""
    if not KERNEL_TIMESTAMPS:
        return False
    with socket.create_server(("127.0.0.1", 0)) as srv:
        a = socket.create_connection(srv.getsockname(), timeout=timeout_s)
        b, _ = srv.accept()
    if not enable(b):
        a.close()
        b.close()
        return False
    deadline = monotonic() + timeout_s
    while monotonic() < deadline:
        a.sendall(b"x")
        if not select.select([b], [], [], max(0.0, deadline - monotonic()))[0]:
            break
        if kernel_reader(b)()[2]:
            _held.extend((a, b))
            return True
        sleep(0.001)  # the switch is flipped from a work queue
    a.close()
    b.close()
    return False


def kernel_reader(sock: Any) -> Reader:
    """Reads stamped with the kernel's arrival time of their last byte, where it gave one."""
    recvmsg = sock.recvmsg
    unpack = _TIMESPEC.unpack
    size = _TIMESPEC.size

    def read() -> Read:
        data, anc, _flags, _addr = recvmsg(RECV, _ANC)
        if anc:
            cdata = anc[0][2]
            if len(cdata) == size:
                sec, nsec = unpack(cdata)
                return data, sec + nsec * 1e-9, True
        return data, time(), False  # EOF, or a segment the kernel did not stamp

    return read


def loop_reader(sock: Any) -> Reader:
    """Reads stamped with ``time.time()`` when the loop got to them (TLS)."""
    recv = sock.recv

    def read() -> Read:
        data = recv(RECV)
        return data, time(), False

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

    def peek(self, n: int) -> Read:
        data, anc, _flags, _addr = self._recvmsg(n, _ANC, socket.MSG_PEEK)
        if anc and len(anc[0][2]) == _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack(anc[0][2])
            return data, sec + nsec * 1e-9, True
        return data, time(), False

    def consume(self, n: int) -> None:
        while n > 0:  # the bytes are queued: this never waits
            got = len(self._recv(n))
            if not got:
                return
            n -= got

    def first_event_arrival(self, data: bytes, t: float) -> tuple[float, bool]:
        """(arrival, exact) of the first content event in the peeked ``data`` (stamped
        ``t`` by the kernel, the arrival of its last byte).

        Exact when the event ends the read (``t`` is then its own arrival; through
        HAProxy a chunk's closing CRLF comes with the next chunk, so this is the common
        case) or from kernel-stamped peeks that fall in different segments.

        A queued segment's stamp is not fixed: bytes that arrive later may be merged
        into the queue's last segment, which then takes *their* arrival. Between two
        peeks that can happen, and a stamp that moved looks like a segment boundary.
        So the event's segment is peeked again after the next byte's: only a stamp that
        held still across both is its own.
        """
        p = first_content_at(data)
        end = data.find(b"\n\n", p) if p >= 0 else -1
        if end < 0:
            return t, False
        end += 2
        if data[end : end + 2] == b"\r\n":  # the HTTP chunk's own end, same write
            end += 2
        if end >= len(data):
            return t, True
        d1, t1, s1 = self.peek(end)  # stamp of the segment holding the event's last byte
        d2, t2, s2 = self.peek(end + 1)  # ... and of the next byte's
        d3, t3, s3 = self.peek(end)  # ... and the first again: nothing merged meanwhile
        if len(d1) < end or len(d2) < end + 1 or len(d3) < end or not (s1 and s2 and s3):
            return t, False
        return t1, t1 == t3 and t1 != t2  # a still stamp, and different segments
