"""Voter URLs beyond one standalone master: ``redis+cluster://`` (a Redis/Valkey Cluster) and
``redis+sentinel://`` (a Sentinel-managed primary), read into what :mod:`_endpoint` builds on.

Pure string work: the credentials, the db and the TLS options stay in a plain ``redis://`` or
``rediss://`` URL (:attr:`VoterURL.base`) that redis-py parses as for a standalone voter; this
takes out the parts only these shapes have (the extra seeds or Sentinels, the service, the
Sentinels' own credentials) and says what to change when they are wrong. No error quotes the
URL: it may hold a password.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

CLUSTER = "cluster"
SENTINEL = "sentinel"

_SCHEMES = {
    "redis+cluster": (CLUSTER, "redis"),
    "rediss+cluster": (CLUSTER, "rediss"),
    "redis+sentinel": (SENTINEL, "redis"),
    "rediss+sentinel": (SENTINEL, "rediss"),
}
_DEFAULT_PORT = {CLUSTER: 6379, SENTINEL: 26379}
_MORE = {CLUSTER: "seed", SENTINEL: "sentinel"}
_FORMS = {
    CLUSTER: "redis+cluster://HOST:PORT[?seed=HOST:PORT...] (rediss+cluster:// for TLS)",
    SENTINEL: "redis+sentinel://HOST:PORT/SERVICE[?sentinel=HOST:PORT...] (rediss+sentinel:// for TLS)",
}


@dataclass(frozen=True, slots=True)
class VoterURL:
    """A ``redis+cluster://`` or ``redis+sentinel://`` URL, taken apart."""

    kind: str
    """:data:`CLUSTER` or :data:`SENTINEL`."""
    base: str
    """A ``redis://``/``rediss://`` URL of the first address, with the URL's credentials, db and options."""
    addresses: tuple[tuple[str, int], ...]
    """Every seed (cluster) or Sentinel, the URL's own address first, each once."""
    service: str = ""
    """The Sentinel service (master group) name; "" for a cluster."""
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    """The Sentinels' own credentials (``sentinel_username=``, ``sentinel_password=``): the URL's are the
    data nodes'; Sentinels are asked without any unless these are given."""


def voter_url(url: str, index: int) -> VoterURL | None:
    """*url* taken apart when its scheme is a cluster's or a Sentinel's; None for any other URL."""
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep or "+" not in scheme:
        return None
    if scheme not in _SCHEMES:
        raise ValueError(
            f"nodes[{index}] has scheme {scheme}://, which is not a voter: write {_FORMS[CLUSTER]}, "
            f"{_FORMS[SENTINEL]}, or redis://HOST:PORT for one standalone master"
        )
    kind, plain = _SCHEMES[scheme]
    form = _FORMS[kind]
    if "#" in url:
        raise ValueError(
            f"nodes[{index}] is not a usable {scheme}:// URL: it holds a '#' (if a password holds '#', '/', '?', "
            "'@' or '%', percent-encode it: urllib.parse.quote(password, safe=''))"
        )
    parts = urllib.parse.urlsplit(url)
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise ValueError(f"nodes[{index}] has a port that is not a number (1 to 65535): write {form}") from None
    if not host:
        raise ValueError(f"nodes[{index}] names no host: write {form}")
    port = port or _DEFAULT_PORT[kind]
    path = parts.path.strip("/")
    service = ""
    if kind == SENTINEL:
        if not path:
            raise ValueError(f"nodes[{index}] names no service (the Sentinels' master name): write {form}")
        if "/" in path:
            raise ValueError(
                f"nodes[{index}] has more than a service in its path ({urllib.parse.unquote(path)!r}): "
                f"write {form}, and a db as ?db=N"
            )
        service = urllib.parse.unquote(path)
    elif path not in ("", "0"):
        raise ValueError(f"nodes[{index}] names db {path!r}: a Cluster has db 0 only; write {form}")
    more, sentinel_username, sentinel_password, rest = _query(parts.query, kind, index, form)
    addresses = [(host, port)]
    for address in more:
        if address not in addresses:
            addresses.append(address)
    netloc = parts.netloc.rpartition("@")
    userinfo = netloc[0] + netloc[1]
    base = f"{plain}://{userinfo}{_spell(host, port)}" + (f"?{urllib.parse.urlencode(rest)}" if rest else "")
    return VoterURL(kind, base, tuple(addresses), service, sentinel_username, sentinel_password)


def _query(
    query: str, kind: str, index: int, form: str
) -> tuple[list[tuple[str, int]], str | None, str | None, list[tuple[str, str]]]:
    """The extra addresses, the Sentinels' credentials, and the options left for redis-py."""
    more: list[tuple[str, int]] = []
    username = password = None
    rest: list[tuple[str, str]] = []
    own, other = _MORE[kind], _MORE[SENTINEL if kind == CLUSTER else CLUSTER]
    for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if name == own:
            more.append(_address(value, own, index, form))
        elif name == other:
            raise ValueError(f"nodes[{index}] has {other}=, which is not for this kind of voter: write {form}")
        elif name in ("sentinel_username", "sentinel_password"):
            if kind != SENTINEL:
                raise ValueError(f"nodes[{index}] has {name}=, which only a redis+sentinel:// URL takes")
            if name == "sentinel_username":
                username = value or None
            else:
                password = value
        elif name == "db" and kind == CLUSTER:
            raise ValueError(f"nodes[{index}] names a db: a Cluster has db 0 only; write {form}")
        else:
            rest.append((name, value))
    return more, username, password, rest


def _address(value: str, option: str, index: int, form: str) -> tuple[str, int]:
    """HOST:PORT (``[v6]:PORT`` for an IPv6 host) of a ``seed=`` or ``sentinel=`` option."""
    try:
        parts = urllib.parse.urlsplit(f"//{value}")
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or port is None or parts.path or parts.username is not None or value.count("@"):
        raise ValueError(
            f"nodes[{index}] has {option}={value!r}: each {option}= is HOST:PORT ([v6-address]:PORT); write {form}"
        )
    return host, port


def _spell(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
