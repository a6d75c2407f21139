"""A holder leaves the grant queue: each key it holds goes straight to the next waiter in line.

A lock's release (``QUEUE_LEAVE``), a ``lock_many``'s (``QUEUE_LEAVE_ALL``: every name in one script
per node, one reply for the ballot) and a semaphore permit's (``PERMIT_LEAVE``: every slot of its
token) are queued on every node at once, synchronously (they survive cancellation), and hand each key
still holding the token to the first live waiter there, or free it and publish the release word.
"""

from __future__ import annotations

from collections.abc import Sequence

from redlock_async._nodes import IGNORED, Fallback, Node, Receiver, bulk, pack_script, script_head
from redlock_async._queue._claim import mark_key, queue_keys
from redlock_async._queue._lines import Permits
from redlock_async._scripts import PERMIT_LEAVE, QUEUE_LEAVE, QUEUE_LEAVE_ALL, QUEUE_LEAVE_NATIVE


class Leave:
    """One lock's :func:`release`, packed once up to its token: its keys (the lock key, its line, its waits,
    the name's fencing counter, the key's listening mark) never change, only the token does. A node whose
    user may run the server's DELIFEQ (``Node.delifeq``, from its connection's handshake) gets
    ``QUEUE_LEAVE_NATIVE`` (the same keys, effects and reply, one call fewer where no one is in line)."""

    __slots__ = ("head", "key", "keys", "native")

    def __init__(self, key: bytes, fence_key: bytes) -> None:
        self.key = key
        self.keys = (*queue_keys(key, fence_key), mark_key(key))
        self.head = script_head(QUEUE_LEAVE, self.keys, 1)
        self.native = script_head(QUEUE_LEAVE_NATIVE, self.keys, 1)

    def send(self, nodes: Sequence[Node], token: bytes, into: Receiver | None, skip: Sequence[int] = ()) -> None:
        """:func:`release` of *token* (this lock's)."""
        arg = bulk(token)
        packed = self.head + arg  # = pack_script(QUEUE_LEAVE, self.keys, (token,))
        native = b""  # packed at the first node that takes it, with its fallback (one for every node)
        args = (token,)
        fallback: Fallback = (QUEUE_LEAVE, self.keys, args)
        again: Fallback = None
        receiver: Receiver = IGNORED if into is None else into  # replies as RELEASE's: 1 deleted, 0 not ours
        for i, node in enumerate(nodes):
            if i in skip:  # (rare: a first try skips only a stalled node)
                continue
            if node.delifeq:
                if not native:
                    native, again = self.native + arg, (QUEUE_LEAVE_NATIVE, self.keys, args)
                node.send_packed(receiver, i, native, fallback=again)
            else:
                node.send_packed(receiver, i, packed, fallback=fallback)


def release(
    nodes: Sequence[Node],
    key: bytes,
    fence_key: bytes,
    token: bytes,
    into: Receiver | None,
    skip: Sequence[int] = (),
) -> None:
    """Release a lease taken through the queue, on every node but *skip* (synchronous: survives
    cancellation): the key goes to the next live waiter there (with the name's fencing counter in the
    grant's word), or is deleted and the release published where someone listens (the key's mark).
    Its entries still in a line (nodes that granted late, or never) go too. *skip*: nodes the
    acquisition never sent its token to (a first try that skipped a stalled node), where there is
    nothing of it to take away. (A lock that releases often keeps its :class:`Leave`.)"""
    Leave(key, fence_key).send(nodes, token, into, skip)


def release_all(
    nodes: Sequence[Node],
    keys: Sequence[bytes],
    fence_keys: Sequence[bytes],
    token: bytes,
    into: Receiver | None,
    skip: Sequence[int] = (),
) -> None:
    """:func:`release` for a lock of several names (lock_many): one script per node but *skip* leaves every
    name's line and hands each key still ours to that line's next waiter; its reply says whether every
    key was ours."""
    flat = tuple(k for key, fence_key in zip(keys, fence_keys, strict=True) for k in queue_keys(key, fence_key))
    args: tuple[bytes | int, ...] = (token,)
    packed = pack_script(QUEUE_LEAVE_ALL, flat, args)
    receiver: Receiver = IGNORED if into is None else into  # replies as RELEASE_ALL's
    for i, node in enumerate(nodes):
        if i not in skip:
            node.send_packed(receiver, i, packed, fallback=(QUEUE_LEAVE_ALL, flat, args))


def release_permit(
    nodes: Sequence[Node], permits: Permits, token: bytes, into: Receiver | None, skip: Sequence[int] = ()
) -> None:
    """Release a permit on every node but *skip* (synchronous: survives cancellation): every slot that holds
    *token* goes to the first live waiter in the semaphore's line, or is freed and the release published;
    an entry of the token still in line goes too. Replies as RELEASE's (1: a slot held it)."""
    keys = permits.keys()
    args: tuple[bytes | int, ...] = (token,)
    packed = pack_script(PERMIT_LEAVE, keys, args)
    receiver: Receiver = IGNORED if into is None else into
    for i, node in enumerate(nodes):
        if i not in skip:
            node.send_packed(receiver, i, packed, fallback=(PERMIT_LEAVE, keys, args))
