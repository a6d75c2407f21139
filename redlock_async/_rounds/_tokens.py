"""Tokens: the value an acquisition writes on the nodes (a random part, then the holder's owner label), and
the owner label read back from one. Pure: no I/O."""

from __future__ import annotations

import binascii
import secrets

__all__ = ["OWNER_SEPARATOR", "TOKEN_BYTES", "new_token", "owner_of"]

TOKEN_BYTES = 20
"""Random bytes in each acquisition's token (the Redlock spec asks for 20)."""


OWNER_SEPARATOR = b"~"
"""Between a token's random part (URL-safe base64: never this byte) and the holder's owner label."""


_URLSAFE = bytes.maketrans(b"+/", b"-_")


def new_token(owner: bytes) -> bytes:
    """A new acquisition's value on the nodes: random, then the owner label that inspection shows.

    The random part is ``secrets.token_urlsafe(TOKEN_BYTES)``'s, as bytes: URL-safe base64, unpadded, of
    ``secrets.token_bytes`` (which the simulator makes deterministic), encoded in C alone (once per
    acquire: token_urlsafe is three Python calls more, and a decode and an encode)."""
    raw = binascii.b2a_base64(secrets.token_bytes(TOKEN_BYTES), newline=False)
    return raw.translate(_URLSAFE).rstrip(b"=") + OWNER_SEPARATOR + owner


def owner_of(value: bytes) -> str | None:
    """The owner label in a lock key's value, None when it has none (written by an older client)."""
    _, separator, owner = value.partition(OWNER_SEPARATOR)
    return owner.decode(errors="replace") if separator else None
