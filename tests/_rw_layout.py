"""The read/write lock's readers as a node keeps them (``_scripts/_rw.py``): one hash, the SHA1 of a reader's
token -> ``"<token> <expiry, node ms>"``; an entry past its expiry by the node's clock counts as absent."""

from __future__ import annotations

import hashlib
from typing import Any


def node_ms(node: Any) -> int:
    seconds, micros = node.command("TIME")
    return int(seconds) * 1000 + int(micros) // 1000


def entry(node: Any, readers: bytes, token: bytes) -> tuple[bytes, int] | None:
    """The reader's entry (its token and expiry, node ms), dead or alive; None when there is none."""
    value = node.command("HGET", readers, hashlib.sha1(token).hexdigest())
    if value is None:
        return None
    held, _, expiry = bytes(value).rpartition(b" ")
    return held, int(expiry)


def reader_left(node: Any, readers: bytes, token: bytes) -> int | None:
    """The ms the reader holding *token* has left on *node* (by its clock), None when it holds nothing live."""
    found = entry(node, readers, token)
    if found is None or found[0] != token:
        return None
    left = found[1] - node_ms(node)
    return left if left > 0 else None


def live_readers(node: Any, readers: bytes) -> list[bytes]:
    """The tokens of the live readers on *node*."""
    now = node_ms(node)
    found = []
    for value in dict(node.command("HGETALL", readers)).values():
        held, _, expiry = bytes(value).rpartition(b" ")
        if int(expiry) > now:
            found.append(held)
    return found


def entries(node: Any, readers: bytes) -> int:
    """How many entries the hash holds, dead ones included."""
    return int(node.command("HLEN", readers))
