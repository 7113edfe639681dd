"""URLs that name a list of hosts: ``redis+cluster://`` (the seed nodes, cluster.py) and
``redis+sentinel://`` (the sentinels, sentinel.py), read by one parser.

``scheme://[user[:password]@]host[:port][,host[:port]...][/path][?query][#fragment]``, an IPv6
host in brackets (``[::1]:7000``). What the path and the query mean, which ports may be left
out, and how a mistake is worded are each form's own; the splitting is here.

Written by hand: urllib takes one host per URL (it can't read the ports of a list), and raised
a bare ValueError on an unclosed bracket, which reached the user as a crash, not as a setting
that is wrong. The user information ends at the last ``@`` before the query, so a password may
hold any character but ``?`` unencoded (percent-encode it, or all of them, as in a redis:// URL).
Nothing here imports from the package: cluster.py, sentinel.py and broker/urls.py all use it.
"""

from __future__ import annotations

import dataclasses
from urllib.parse import unquote


@dataclasses.dataclass(frozen=True)
class HostListURL:
    """A URL split into its parts, the user name and password percent-decoded, the rest as written."""

    scheme: str
    username: str | None
    password: str | None
    hosts: tuple[str, ...]  # each ``host[:port]`` as written (stripped); read with host_port
    path: str  # what follows the hosts' "/" ("" when none)
    query: str
    fragment: str


class BadHost(ValueError):
    """An item of the host list that can't be read: ``item`` as written; ``port`` when only its port is wrong."""

    def __init__(self, item: str, *, port: bool = False):
        super().__init__(item)
        self.item = item
        self.port = port


def split(url: str) -> HostListURL:
    """``url`` in its parts; never raises (each form says what it refuses)."""
    scheme, _, rest = url.partition("://")
    rest, _, query = rest.partition("?")
    query, _, fragment = query.partition("#")
    userinfo, at, rest = rest.rpartition("@")
    rest, hash_, after = rest.partition("#")
    if hash_:
        fragment = after
    hosts, _, path = rest.partition("/")
    username = password = None
    if at:
        # (as redis-py reads redis://user:password@: no colon, a user name alone)
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    return HostListURL(scheme, username, password, tuple(item.strip() for item in hosts.split(",")), path, query,
                       fragment)


def host_port(item: str, default_port: int | None = None) -> tuple[str, int]:
    """``host:port`` (``[IPv6]:port``) -> (host, port); raise :class:`BadHost`.

    Without a ``default_port`` the port is required, and it follows the last colon (an IPv6
    host reads without brackets too); with one it may be left out, so a host's first colon
    starts the port (brackets are then the only way to write an IPv6 host).
    """
    if item.startswith("["):
        host, bracket, after = item[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            raise BadHost(item)
        port = after[1:]
    elif default_port is None:
        host, _, port = item.rpartition(":")
    else:
        host, _, port = item.partition(":")
    if not host:
        raise BadHost(item)
    if not port:
        if default_port is None:
            raise BadHost(item)
        return host, default_port
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise BadHost(item, port=True)
    return host, int(port)


def netloc(host: str, port: int) -> str:
    """``host:port`` as a URL writes it: an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
