"""Where lbtune may connect or listen: loopback, unless the user opted in, and never with
credentials in a URL.

Every address a user configures (a load target, a Prometheus, a Locust master or the
address it listens on, a cluster's external replica, the agent's Prometheus) is checked
here: a host that is not loopback needs an explicit opt-in (``--allow-remote``, or
``allow_remote: true`` in the file that names it), and a URL with a ``user:secret@`` part
is refused, its userinfo never echoed (:func:`without_userinfo`). The messages are one
line and name the option or field, so a user can fix it.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import SplitResult, urlsplit

from lbtune.errors import ConfigError

__all__ = [
    "LOOPBACK_HOSTS",
    "check_host",
    "check_url",
    "is_loopback",
    "without_userinfo",
]

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
"""The usual spellings of this machine (any ``127.0.0.0/8`` address is loopback too)."""

ALLOW_REMOTE = "--allow-remote"


def is_loopback(host: str | None) -> bool:
    """``host`` is this machine: ``localhost`` or a loopback IP address."""
    if not host:
        return False
    if host.lower() in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost: another machine, as far as we know


def without_userinfo(url: str) -> str:
    """``url`` with any ``user:secret@`` part replaced by ``***@`` (for messages and logs)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return parts._replace(netloc=f"***@{host}").geturl()


def check_url(
    url: str,
    what: str,
    *,
    allow_remote: bool,
    opt_in: str = ALLOW_REMOTE,
) -> SplitResult:
    """``url`` split, when it is an ``http(s)://HOST[:PORT]`` URL without userinfo whose
    host is loopback or ``allow_remote``; else ConfigError naming ``what`` (the option or
    field) and, for a remote host, ``opt_in``."""
    shown = without_userinfo(url)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (urlsplit checks the port only when asked)
    except ValueError:
        raise ConfigError(
            f"{what} {shown}: expected http(s)://HOST[:PORT] with a port in 1..65535"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{what}: expected an http(s) URL like http://127.0.0.1:8000, got {shown}"
        )
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ConfigError(
            f"{what} {shown}: credentials in a URL are refused (they would land in logs and "
            "reports); give the URL without user:password@"
        )
    check_host(parts.hostname, f"{what} {shown}", allow_remote=allow_remote, opt_in=opt_in)
    return parts


def check_host(host: str, what: str, *, allow_remote: bool, opt_in: str = ALLOW_REMOTE) -> None:
    """ConfigError unless ``host`` is loopback or ``allow_remote``."""
    if not allow_remote and not is_loopback(host):
        raise ConfigError(
            f"{what}: {host} is not a loopback address; reaching or opening lbtune to another "
            f"machine needs {opt_in}"
        )
