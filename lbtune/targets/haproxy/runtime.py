"""HAProxy's runtime API (the admin stats socket): weights, maxconn, server state, stats.

One unix-socket connection per call; several commands in one connection are sent on
one line separated by ``;`` (about 50 µs per command). In that non-interactive mode
HAProxy answers each command with its output followed by an empty line, and a
command with no output (a successful ``set ...``) with the empty line alone, so the
replies are split on empty lines. Only commands whose output has no empty line in it
are batched (``set ...``, ``get weight``); ``show ...`` commands go alone.

Every failure is a :class:`~lbtune.errors.TargetError` naming the socket, the
command and HAProxy's own words ("No such server.", "Backend is using a static LB
algorithm ..."). Weights are honoured only by dynamic algorithms (roundrobin,
leastconn, random, consistent hash); with ``static-rr`` or ``map-based`` hashing
HAProxy refuses ``set weight`` and that refusal is reported as is.
"""

from __future__ import annotations

import csv
import io
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from lbtune.errors import TargetError

__all__ = ["MAX_WEIGHT", "HaproxyRuntime", "ServerStat", "ServerState"]

MAX_WEIGHT = 256
"""HAProxy's largest absolute weight (``set weight`` accepts 0..256)."""

AdminState = Literal["ready", "drain", "maint"]
_OP_STATES = {0: "stopped", 1: "starting", 2: "running", 3: "stopping"}
# srv_admin_state bits (HAProxy's SRV_ADMF_*): forced/inherited/config/resolution/hostname
# maintenance, and forced/inherited drain.
_MAINT_BITS = 0x01 | 0x02 | 0x04 | 0x20 | 0x40
_DRAIN_BITS = 0x08 | 0x10
_NAME_RE = re.compile(r"^[^\s;/]+$")
_WEIGHT_RE = re.compile(r"^(\d+) \(initial (\d+)\)$")
# A unix-socket command line must fit HAProxy's buffer (tune.bufsize, 16 KiB by default).
_MAX_LINE = 8000


@dataclass(frozen=True, slots=True)
class ServerState:
    """One row of ``show servers state``."""

    backend: str
    server: str
    addr: str
    port: int | None
    weight: int
    """Current (user) weight, as set by ``set weight``."""
    initial_weight: int
    """The weight in the config file."""
    op_state: str
    """``stopped``, ``starting``, ``running`` or ``stopping`` (health checks)."""
    admin_state: AdminState
    """``ready``, ``drain`` or ``maint`` (``set server ... state``)."""
    admin_bits: int


@dataclass(frozen=True, slots=True)
class ServerStat:
    """One server row of ``show stat`` (the CSV columns lbtune uses, and all of them)."""

    backend: str
    server: str
    status: str
    """``UP``, ``DOWN``, ``DRAIN``, ``MAINT``, ``no check``..."""
    check_status: str
    """The last health check's result (``L7OK``, ``L4CON``...; empty without checks)."""
    scur: int
    """Sessions now."""
    qcur: int
    """Requests queued for this server now."""
    stot: int
    """Sessions since start: the per-server request counter (deltas = share of traffic)."""
    weight: int
    raw: Mapping[str, str] = field(repr=False, compare=False)


def _check_name(kind: str, name: str) -> str:
    if not _NAME_RE.match(name):
        raise ValueError(f"invalid HAProxy {kind} name {name!r} (no spaces, ';' or '/')")
    return name


def _srv(backend: str, server: str) -> str:
    return f"{_check_name('backend', backend)}/{_check_name('server', server)}"


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


class HaproxyRuntime:
    """``HaproxyRuntime(socket_path, timeout_s=2)``: a client of HAProxy's admin socket."""

    def __init__(self, socket_path: str, timeout_s: float = 2.0) -> None:
        self.socket_path = str(socket_path)
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"HaproxyRuntime({self.socket_path!r})"

    # -- transport ------------------------------------------------------------------

    def _send(self, line: str) -> str:
        """Send one command line, read until HAProxy closes the connection."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(self.timeout_s)
                s.connect(self.socket_path)
                s.sendall(line.encode() + b"\n")
                chunks: list[bytes] = []
                while data := s.recv(65536):
                    chunks.append(data)
        except FileNotFoundError:
            raise TargetError(
                f"HAProxy runtime socket {self.socket_path} does not exist (is HAProxy "
                f"running? `lbtune cluster status`); command: {_short(line)}"
            ) from None
        except (ConnectionRefusedError, PermissionError) as exc:
            raise TargetError(
                f"HAProxy runtime socket {self.socket_path} refused the connection "
                f"({type(exc).__name__}); command: {_short(line)}"
            ) from None
        except TimeoutError:
            raise TargetError(
                f"HAProxy runtime socket {self.socket_path} did not answer within "
                f"{self.timeout_s:g} s; command: {_short(line)}"
            ) from None
        except OSError as exc:
            raise TargetError(
                f"HAProxy runtime socket {self.socket_path}: {exc}; command: {_short(line)}"
            ) from None
        return b"".join(chunks).decode(errors="replace")

    def execute(self, cmds: list[str]) -> list[str]:
        """Run ``cmds`` in one connection (``;``-separated); one reply per command.

        Replies are stripped of their trailing newline; ``""`` means "no output" (what a
        successful ``set ...`` answers). HAProxy's error replies are returned as they
        are, not raised: the typed methods below check them.
        """
        if not cmds:
            return []
        for c in cmds:
            if ";" in c or "\n" in c:
                raise ValueError(f"one command per list item, without ';' or newlines: {c!r}")
        line = ";".join(cmds)
        text = self._send(line)
        if len(cmds) == 1:
            return [text.rstrip("\n")]
        replies: list[str] = []
        current: list[str] = []
        for ln in text.split("\n"):
            if ln == "":
                replies.append("\n".join(current))
                current = []
            else:
                current.append(ln)
        if current:
            replies.append("\n".join(current))
        replies = replies[: len(cmds)] if len(replies) > len(cmds) else replies
        if len(replies) != len(cmds):
            raise TargetError(
                f"HAProxy answered {len(replies)} replies to {len(cmds)} commands on "
                f"{self.socket_path}: {_short(text)!r}; command: {_short(line)}"
            )
        return replies

    def _execute_all(self, cmds: list[str]) -> list[str]:
        """Like :meth:`execute`, split into several connections only past ~8 KB."""
        out: list[str] = []
        batch: list[str] = []
        size = 0
        for c in cmds:
            if batch and size + len(c) + 1 > _MAX_LINE:
                out += self.execute(batch)
                batch, size = [], 0
            batch.append(c)
            size += len(c) + 1
        return out + self.execute(batch)

    def _expect_empty(self, cmds: list[str]) -> None:
        replies = self._execute_all(cmds)
        failed = [f"`{c}`: {r.strip()}" for c, r in zip(cmds, replies, strict=True) if r.strip()]
        if failed:
            total = f" ({len(failed)} of {len(cmds)} commands failed)" if len(cmds) > 1 else ""
            raise TargetError(f"HAProxy ({self.socket_path}) refused{total}: " + "; ".join(failed))

    # -- weights, maxconn, state --------------------------------------------------------

    def get_weight(self, backend: str, server: str) -> int:
        """The current weight of ``backend/server``."""
        cmd = f"get weight {_srv(backend, server)}"
        reply = self.execute([cmd])[0].strip()
        m = _WEIGHT_RE.match(reply)
        if m is None:
            raise TargetError(f"HAProxy ({self.socket_path}) refused `{cmd}`: {reply}")
        return int(m.group(1))

    def set_weight(self, backend: str, server: str, weight: int) -> None:
        self.set_weights({(backend, server): weight})

    def set_weights(self, weights: Mapping[tuple[str, str], int]) -> None:
        """Set absolute weights (0..256), all in one connection.

        HAProxy applies each command on its own: when some fail, the others are set
        and the TargetError lists the failing ones.
        """
        cmds = []
        for (backend, server), w in weights.items():
            if not isinstance(w, int) or not 0 <= w <= MAX_WEIGHT:
                raise ValueError(f"weight of {backend}/{server} must be 0..{MAX_WEIGHT}, got {w!r}")
            cmds.append(f"set weight {_srv(backend, server)} {w}")
        if cmds:
            self._expect_empty(cmds)

    def set_maxconn(self, backend: str, server: str, maxconn: int) -> None:
        """Per-server ``maxconn`` (0 = unlimited); excess requests wait in HAProxy's queue."""
        if maxconn < 0:
            raise ValueError(f"maxconn must be >= 0, got {maxconn}")
        self._expect_empty([f"set maxconn server {_srv(backend, server)} {maxconn}"])

    def set_state(self, backend: str, server: str, state: AdminState) -> None:
        """``ready``, ``drain`` (no new requests, in-flight ones finish) or ``maint``."""
        if state not in ("ready", "drain", "maint"):
            raise ValueError(f"state must be ready, drain or maint, got {state!r}")
        self._expect_empty([f"set server {_srv(backend, server)} state {state}"])

    # -- read-back ----------------------------------------------------------------------

    def servers_state(self, backend: str | None = None) -> list[ServerState]:
        """Every server (of ``backend``, or of all backends) from ``show servers state``."""
        cmd = "show servers state" + (f" {_check_name('backend', backend)}" if backend else "")
        text = self.execute([cmd])[0]
        return _parse_servers_state(text, cmd, self.socket_path)

    def stat(self, include_aggregates: bool = False) -> list[ServerStat]:
        """Server rows of ``show stat`` (``FRONTEND``/``BACKEND`` rows on request)."""
        text = self.execute(["show stat"])[0]
        if not text.startswith("# pxname,"):
            raise TargetError(f"HAProxy ({self.socket_path}) refused `show stat`: {_short(text)}")
        out: list[ServerStat] = []
        for row in csv.DictReader(io.StringIO(text[2:])):
            name = row.get("svname") or ""
            if not name or (not include_aggregates and name in ("FRONTEND", "BACKEND")):
                continue
            out.append(
                ServerStat(
                    backend=row.get("pxname") or "",
                    server=name,
                    status=row.get("status") or "",
                    check_status=row.get("check_status") or "",
                    scur=_int(row.get("scur")),
                    qcur=_int(row.get("qcur")),
                    stot=_int(row.get("stot")),
                    weight=_int(row.get("weight")),
                    raw={k: v for k, v in row.items() if k},
                )
            )
        return out


def _parse_servers_state(text: str, cmd: str, where: str) -> list[ServerState]:
    lines = [ln for ln in text.split("\n") if ln.strip()]
    header: list[str] | None = None
    rows: list[ServerState] = []
    for ln in lines:
        if ln.startswith("#"):
            header = ln.lstrip("# ").split()
            continue
        parts = ln.split()
        if header is None:
            if len(parts) == 1 and parts[0].isdigit():  # the format version line
                continue
            raise TargetError(f"HAProxy ({where}) refused `{cmd}`: {_short(text.strip())}")
        if len(parts) < len(header):
            raise TargetError(f"HAProxy ({where}): unexpected `{cmd}` line {ln!r}")
        col = dict(zip(header, parts, strict=False))
        bits = _int(col.get("srv_admin_state"))
        admin: AdminState = (
            "maint" if bits & _MAINT_BITS else "drain" if bits & _DRAIN_BITS else "ready"
        )
        port = col.get("srv_port", "")
        rows.append(
            ServerState(
                backend=col["be_name"],
                server=col["srv_name"],
                addr=col.get("srv_addr", ""),
                port=int(port) if port.isdigit() else None,
                weight=_int(col.get("srv_uweight")),
                initial_weight=_int(col.get("srv_iweight")),
                op_state=_OP_STATES.get(_int(col.get("srv_op_state")), "unknown"),
                admin_state=admin,
                admin_bits=bits,
            )
        )
    return rows


def servers_by_name(states: Iterable[ServerState]) -> dict[str, list[ServerState]]:
    """Server name → its rows in every backend (a replica appears once per model backend)."""
    out: dict[str, list[ServerState]] = {}
    for s in states:
        out.setdefault(s.server, []).append(s)
    return out


def _short(text: str, limit: int = 200) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
