"""The protected side of fencing: writes that refuse a token older than one already seen.

A lease cannot stop a client that paused past its validity from writing
late; the resource can, by remembering the largest fencing token it has
seen and refusing smaller ones. See docs/fencing.md.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from redlock_async._scripts import FENCED_SET
from redlock_async.errors import RedlockError

__all__ = ["StaleFencingToken", "fenced_set"]


class StaleFencingToken(RedlockError):
    """Raised when a protected resource refuses a write: a later lock holder has already written.

    ``token`` is the refused one, ``seen`` the largest the resource accepted.
    """

    def __init__(self, message: str, *, resource: str, token: int, seen: int) -> None:
        super().__init__(message, resource=resource)
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
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise TypeError(f"token must be a fencing token (an int >= 0, lock.fencing_token), got {token!r}")
    if fence_key is None:
        fence_key = key + b":fence" if isinstance(key, bytes) else key + ":fence"
    script = client.register_script(FENCED_SET.source)
    applied, seen = await script(keys=[key, fence_key], args=[token, value])
    if not applied:
        name = key if isinstance(key, str) else repr(key)
        raise StaleFencingToken(
            f"write to {name} refused: fencing token {token} is older than {seen}, already written",
            resource=name,
            token=token,
            seen=int(seen),
        )
