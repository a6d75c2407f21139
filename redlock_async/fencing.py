"""The protected side of fencing: writes that refuse a token older than one already seen.

A lease cannot stop a client that paused past its validity from writing
late; the resource can, by remembering the largest fencing token it has
seen and refusing smaller ones. See docs/fencing.md.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from redlock_async._scripts import FENCED_SET
from redlock_async.errors import RedlockError

__all__ = ["StaleFencingToken", "fenced_set"]

MAX_TOKEN = 2**53
"""Largest token fenced_set takes: the script compares tokens as Lua numbers (doubles), exact up to here."""


class StaleFencingToken(RedlockError):
    """Raised when a protected resource refuses a write: a later lock holder has already written.

    ``token`` is the refused one, ``seen`` the largest the resource accepted.
    """

    def __init__(
        self, message: str, *, name: str | None = None, token: int, seen: int, resource: str | None = None
    ) -> None:
        super().__init__(message, name=name, resource=resource)
        self.token = token
        self.seen = seen


async def fenced_set(
    client: Redis, key: str | bytes, value: Any, token: int, *, fence_key: str | bytes | None = None
) -> None:
    """``SET key value`` on *client*, only if *token* is not smaller than any token seen for *key*.

    The largest token seen is kept in *fence_key* (default: *key* + ``":fence"``),
    a key that never expires. Raises :class:`StaleFencingToken` when refused;
    nothing is written then.
    """
    if isinstance(client, redis.Redis) or not hasattr(client, "register_script"):
        kind = f"{type(client).__module__}.{type(client).__qualname__}"
        raise TypeError(f"client must be a redis.asyncio.Redis client of the protected resource, got {kind}")
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise TypeError(f"token must be a fencing token (an int >= 0, lock.fencing_token), got {token!r}")
    if token > MAX_TOKEN:
        raise ValueError(f"token {token} is larger than 2**53: the resource could not compare it exactly")
    _check_key("key", key)
    if fence_key is None:
        fence_key = key + b":fence" if isinstance(key, bytes) else key + ":fence"
    if _check_key("fence_key", fence_key) == _check_key("key", key):
        raise ValueError(f"fence_key {fence_key!r} is the key written: give the largest token a key of its own")
    script = client.register_script(FENCED_SET.source)
    try:
        applied, seen = await script(keys=[key, fence_key], args=[token, value])
    except ResponseError as exc:
        if "compare" in str(exc) or "WRONGTYPE" in str(exc):  # Redis 6.2 words it "Error running script ...: WRONGTYPE"
            raise ValueError(
                f"fence_key {fence_key!r} holds something other than a fencing token ({exc}): "
                "give fenced_set a key that only it writes"
            ) from exc
        raise
    if not applied:
        name = key if isinstance(key, str) else repr(key)
        raise StaleFencingToken(
            f"write to {name} refused: fencing token {token} is older than {seen}, already written",
            name=name,
            token=token,
            seen=int(seen),
        )


def _check_key(what: str, key: object) -> bytes:
    """*key* as bytes, after checking that it is a name."""
    if not isinstance(key, str | bytes):
        raise TypeError(f"{what} must be str or bytes, got {type(key).__name__}")
    if not key:
        raise ValueError(f"{what} is empty: name the key written (and the key of its largest token)")
    return key.encode(errors="surrogatepass") if isinstance(key, str) else key
