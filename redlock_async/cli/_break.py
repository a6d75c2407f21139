"""``redlock break NAME``: delete the lease of NAME on every node that answers, whoever holds it.

For an operator whose lock was left by a process that died with a long ttl. It shows who holds
NAME (the table of ``redlock status``), asks, then on each node sends the holder's own release
for the value it read there: the compare-and-delete a release sends (``QUEUE_LEAVE`` for a lock
key: a waiter that entered the line again since break dropped it, if any, is granted the key, else the
release is published; ``PERMIT_LEAVE`` for a semaphore's permit: its slot to such a waiter, or freed and
published; ``RELEASE`` of the writer key
for a read/write lock's writer, ``RW_READ_RELEASE`` for each of its readers). So:

* only what was shown is deleted: a value that changed since the table was read (its holder
  released, and someone else took the key) is left alone, and said so;
* the name's lines go first, in one script on each node (``DROP_LINES``: the grant queue's line of
  the lock key, the semaphore's and the read/write lock's, and the read/write lock's waiting
  writers). Break cannot tell a waiter that died in line from a live one, and a release hands the
  key to the first entry that has not expired (an entry lives five retry delays): kept, a dead
  waiter would be handed the key for its whole ttl. A live waiter loses nothing but its place: it
  enters again at its next try, at once when the release word wakes it; no grant is made for it;
* waiters are woken as by a release (with the lines gone, the release word goes out);
* fencing counters are never written (the next holder's token is still larger than the broken
  holder's), nor a semaphore's limit key.

Nodes are read as they are, restart quarantine or not: break concludes nothing from a node that may
have lost keys, it only deletes what each node holds, so it must see it.

The broken holder learns it at its next extension: its key is gone from the nodes whose yes it
counted on, where an extension never takes a free key back, so it cannot extend on a majority
and gets ``LockLost`` (inside ``async with``: its body is cancelled).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from redlock_async._core import Settings, one_slot_voters, quorum, semaphore_keys
from redlock_async._nodes import ClusterVoter, Failure, Node, Reply, endpoints_for
from redlock_async._queue import Permits, queue_keys
from redlock_async._scripts import DROP_LINES, PERMIT_LEAVE, QUEUE_LEAVE, RELEASE, RW_READ_RELEASE
from redlock_async._shared import Keys, digest, inspect, keys_of
from redlock_async.cli._codes import EXIT_NOT_CONFIRMED, EXIT_UNAVAILABLE
from redlock_async.cli._run import resource_name
from redlock_async.cli._status import print_found
from redlock_async.client import Redlock
from redlock_async.inspection import LockInfo

T = TypeVar("T")

Ask = Callable[[str], str]
"""How the question is put to the operator (``input`` on a terminal)."""


@contextmanager
def _quiet() -> Iterator[None]:
    """The table says which nodes could not be reached, and why: no log lines on top of it."""
    logger = logging.getLogger("redlock_async")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def holders_shown(found: LockInfo) -> dict[str, str]:
    """Every holder the table shows, on any node, of the lock, a permit, or the read/write lock's writer or
    a reader: digest -> its label."""
    shown: dict[str, str] = {}
    writer = () if found.writer is None else (found.writer,)
    for info in (found, *found.permits, *writer, *found.readers):
        for view in info.nodes:
            if view.holder is not None:
                shown.setdefault(view.holder, f"{view.holder} ({view.owner})" if view.owner else view.holder)
    return shown


async def break_command(name: str, nodes: list[str], *, yes: bool, ask: Ask | None) -> int:
    """Show who holds *name*, ask (unless *yes*), then delete what was shown on every node that answers.

    *ask* is None when there is no terminal to ask on: then *yes* is required (checked by the caller).
    """
    # Checks the URLs; connects nowhere. No restart quarantine: a node that restarted is read as it is. The
    # quarantine hides what such a node holds (it may have lost keys, so it cannot rule a holder out); break
    # rules nothing out, it deletes what is there, so it must see it (else: "nothing to break" beside a lease).
    redlock = Redlock(nodes, restart_quarantine=0)
    resource, shown_name = resource_name(name)
    settings = redlock.settings
    keys = keys_of(settings, resource, one_slot=one_slot_voters(nodes))
    with _quiet():
        found = await inspect(endpoints_for(nodes), keys, settings)
    print_found(shown_name, found)
    targets = holders_shown(found)
    answered = sum(view.state != "unreachable" for view in found.nodes)
    if targets:
        who = ", ".join(targets.values())
        question = f"break {shown_name}: delete the lease of {who} on every node that has it? [y/N] "
    else:
        # No holder, but a waiter that died in line would be handed the lock by the next acquire that finds
        # the key free (its entry lives five of its retry delays): its lines are worth dropping on their own.
        with _quiet():
            groups = line_groups(keys, _permits(settings, resource, 0))
            waiting = await _on_nodes(nodes, settings, lambda node: _waiting(node, groups))
        most = max((count for _, count in waiting if isinstance(count, int)), default=0)
        if not most:
            if answered >= quorum(len(nodes)):
                print(f"nothing to break: no node that answered holds {shown_name}, and no one waits for it")
                return 0
            print(f"nothing to break on the {answered} of {len(nodes)} nodes that answered: too few to tell")
            return EXIT_UNAVAILABLE
        print(
            f"no one holds {shown_name}, but its lines have up to {_waiters(most)}: one that died there would be "
            "handed the lock by the next acquire (break cannot tell a dead waiter from a live one)"
        )
        question = f"drop the lines of {shown_name} on every node (live waiters enter again at their next try)? [y/N] "
    if not yes:
        assert ask is not None
        if ask(question).strip().lower() not in ("y", "yes"):
            print("not broken: nothing was deleted")
            return EXIT_NOT_CONFIRMED
    with _quiet():
        results = await _delete(nodes, settings, resource, found, set(targets))
    cleared = dropped = 0
    for address, result in results:
        if isinstance(result, str):
            print(f"  {address:<24} {result}")
            continue
        deleted, others, waiters = result
        cleared += 1
        dropped = max(dropped, waiters)
        said = [f"deleted {', '.join(targets[d] for d in deleted)}"] if deleted else ["nothing to delete"]
        said += [f"left alone {d} (it took the key after the table was read)" for d in others]
        if waiters:
            said.append(f"dropped {_waiters(waiters)} from the line")
        print(f"  {address:<24} {'; '.join(said)}")
    need = quorum(len(nodes))
    if not targets:
        if cleared < need:
            print(f"lines dropped on {cleared} of {len(nodes)} nodes (a majority is {need}): run it again later")
            return EXIT_UNAVAILABLE
        print(f"lines dropped on {cleared} of {len(nodes)} nodes: live waiters enter again at their next try")
        return 0
    if cleared < need:
        print(
            f"partly broken: {cleared} of {len(nodes)} nodes are clear of it (a majority is {need}): "
            "it may still be held on the others; run redlock break again once they answer"
        )
        return EXIT_UNAVAILABLE
    print(
        f"broken: {cleared} of {len(nodes)} nodes are clear of {who}; fencing counters are kept (the next "
        "holder's token is larger). The holder finds out at its next extension (LockLost)"
    )
    if dropped:
        print(
            "the waiters' lines were dropped (a waiter that died in line would have been handed the lock): "
            "live waiters enter again at their next try"
        )
    return 0


def _waiters(count: int) -> str:
    return f"{count} waiter{'s' * (count != 1)}"


Result = tuple[list[str], list[str], int] | str
"""One node's outcome: (digests deleted, digests of holders that were not shown: left alone, waiters dropped
from the name's lines), or why it did not answer (then it may still hold the lease)."""


async def _delete(
    nodes: list[str], settings: Settings, resource: str | bytes, found: LockInfo, targets: set[str]
) -> list[tuple[str, Result]]:
    """On every node at once: drop the name's lines, read the lock key and the permits' slots, and release
    each value shown."""
    keys = keys_of(settings, resource, one_slot=one_slot_voters(nodes))
    slots: list[bytes] = []
    if found.limit is not None and keys.semaphore is not None:
        slots = [keys.semaphore.slot_key(i) for i in range(found.limit)]
    permits = _permits(settings, resource, found.limit or 0)
    return await _on_nodes(nodes, settings, lambda node: _release_shown(node, keys, slots, permits, targets))


def _permits(settings: Settings, resource: str | bytes, limit: int) -> Permits:
    """Semaphore *resource*'s keys (a permit's release names them; so do its lines)."""
    return Permits(semaphore_keys(settings.key_prefix, resource), limit)


async def _on_nodes(
    nodes: list[str], settings: Settings, work: Callable[[Node], Awaitable[T]]
) -> list[tuple[str, T | str]]:
    """*work* on a connection of its own to every node at once: each node's result, or why it has none."""
    kwargs: dict[str, Any] = {
        "max_unanswered": settings.max_unanswered,
        "stall_after": settings.connect_timeout,
        "connect_timeout": settings.connect_timeout,
        "reconnect_delay": settings.reconnect_delay,
    }
    connections = [
        ClusterVoter(endpoint, shard_settings=kwargs) if endpoint.seeds else Node(endpoint, **kwargs)
        for endpoint in endpoints_for(nodes)
    ]
    try:
        return list(await asyncio.gather(*(_on_node(node, settings, work) for node in connections)))
    finally:
        for node in connections:
            node.close_now()
        await asyncio.sleep(0)  # the transports close their sockets on the next loop turn


async def _on_node(node: Node, settings: Settings, work: Callable[[Node], Awaitable[T]]) -> tuple[str, T | str]:
    limit = settings.connect_timeout * 2  # a connect, then a round trip (as the inspection waits)
    try:
        async with asyncio.timeout(limit):
            if isinstance(node, ClusterVoter) and not await node.refresh():  # its slot map before any key
                return node.name, f"no answer: {node.map_error}"
            return node.name, await work(node)
    except TimeoutError:
        return node.name, f"no answer within {limit:g} s: it may still hold the lease"
    except _Unanswered as exc:
        return node.name, str(exc)


class _Unanswered(Exception):
    """A node's read or release failed: what to print for it."""


def _checked(reply: Reply, what: str) -> Reply:
    if isinstance(reply, Failure):
        raise _Unanswered(f"{what} ({reply.detail or reply.vote.value})")
    return reply


Lines = tuple[tuple[bytes, ...], tuple[bytes, ...]]
"""A primitive's lines: its sorted sets of waiting tokens, and the hashes of their entries."""


def line_groups(keys: Keys, permits: Permits) -> list[Lines]:
    """The name's lines by primitive, each (its sorted sets of waiting tokens, the hashes of their entries):
    the lock key's, the semaphore's, the read/write lock's and its waiting writers. One script or command per
    primitive: its keys share a cluster slot, those of two primitives need not."""
    lock = queue_keys(keys.lock)
    groups: list[Lines] = [((lock[1],), (lock[2],)), ((permits.names.line,), (permits.names.waits,))]
    if keys.rw is not None:
        groups.append(((keys.rw.line, keys.rw.writers), (keys.rw.waits,)))
    return groups


async def _waiting(node: Node, groups: Sequence[Lines]) -> int:
    """How many waiters *node* has in the lines of *groups* (read only)."""
    asks = [node.send(b"ZUNION", b"%d" % len(sets), *sets) for sets, _ in groups]
    count = 0
    for ask in asks:
        members = _checked(await ask, "unreachable")
        assert isinstance(members, list)
        count += len(members)
    return count


async def _release_shown(
    node: Node, keys: Keys, slots: Sequence[bytes], permits: Permits, targets: set[str]
) -> tuple[list[str], list[str], int]:
    """Drop the name's lines on *node*, read its keys (the lock, the permits' slots, the read/write lock's
    writer and its readers), then send the holder's own release for each value whose holder was shown."""
    # The lines go before any release is sent (one connection: in this order): a release hands the key to
    # the first unexpired entry in line, and that may be a waiter that died there.
    drops = [node.send_script(DROP_LINES, sets + hashes, ()) for sets, hashes in line_groups(keys, permits)]
    writer = () if keys.writer is None else (keys.writer,)
    # One read per primitive (its keys share a cluster slot): the lock key, the permits' slots, the writer key.
    reads = [node.send(b"MGET", *group) for group in ((keys.lock,), tuple(slots), writer) if group]
    hashed = node.send(b"HGETALL", keys.rw.readers) if keys.rw is not None else None
    dropped = 0
    for drop in drops:
        count = _checked(await drop, "unreachable: nothing deleted here")
        assert isinstance(count, int)
        dropped += count
    values: list[Reply] = []
    for read in reads:
        found = _checked(await read, "unreachable: nothing deleted here")
        assert isinstance(found, list)
        values += found
    # Each key read, with the release its holder would send: (keys, script) by kind.
    places: list[tuple[bytes, str]] = [(keys.lock, "lock"), *((slot, "permit") for slot in slots)]
    places += [(key, "writer") for key in writer]
    if keys.rw is not None and hashed is not None:
        readers, tokens = await _readers(node, keys.rw.readers, keys.rw.prefix, await hashed)
        values = [*values, *tokens]
        places += readers
    deleted: list[str] = []
    others: list[str] = []
    for (key, kind), value in zip(places, values, strict=True):
        if not isinstance(value, bytes):
            continue
        holder = digest(value)
        if holder not in targets:
            others.append(holder)  # a holder that came after the table was read: not ours to break
            continue
        if kind == "lock":  # the holder's own leave: the line's next waiter gets the key
            reply = node.send_script(QUEUE_LEAVE, queue_keys(keys.lock, keys.fence), (value,))
        elif kind == "permit":  # its slot to the first in the semaphore's line, or freed and told
            reply = node.send_script(PERMIT_LEAVE, permits.keys(), (value,))
        elif kind == "writer":  # a writer releases as a mutex does, told on its own key
            reply = node.send_script(RELEASE, (key,), (value,))
        elif kind == "reader":  # a reader: its entry out of the readers' hash, told on the writer key's channel
            assert keys.writer is not None
            reply = node.send_script(RW_READ_RELEASE, (key, keys.writer), (value,))
        else:  # a reader of the layout before: its own key, compare-and-deleted and told, and out of its set
            assert keys.writer is not None
            assert keys.rw is not None
            reply = node.send_script(RELEASE, (key, keys.writer), (value,))
            node.send(b"SREM", keys.rw.readers, key[len(keys.rw.prefix) :])
        if _checked(await reply, f"failed: it may still hold {holder}") == 1:
            deleted.append(holder)
        # 0: released or expired between the read and the delete; gone all the same
    return deleted, others, dropped if isinstance(dropped, int) else 0


async def _readers(
    node: Node, hashed: bytes, prefix: bytes, reply: Reply
) -> tuple[list[tuple[bytes, str]], list[Reply]]:
    """The readers on *node*, as (key, kind) and the token each holds: entries of the readers' hash *hashed*
    (*reply*, its HGETALL; the key named is the hash), or, where the node keeps the layout before there (a set:
    WRONGTYPE), each reader's own key (*prefix* and the digest the set names). Dead entries too: their release
    answers 0 and drops them."""
    if isinstance(reply, Failure) and "WRONGTYPE" in reply.detail:
        ids = _checked(await node.send(b"SMEMBERS", hashed), "unreachable: nothing deleted here")
        assert isinstance(ids, list)
        keys = [prefix + one for one in ids if isinstance(one, bytes)]
        if not keys:
            return [], []
        found = _checked(await node.send(b"MGET", *keys), "unreachable: nothing deleted here")
        assert isinstance(found, list)
        return [(key, "old reader") for key in keys], found
    entries = _checked(reply, "unreachable: nothing deleted here")
    values = list(entries.values()) if isinstance(entries, dict) else entries[1::2] if isinstance(entries, list) else []
    tokens: list[Reply] = [value.rpartition(b" ")[0] for value in values if isinstance(value, bytes)]
    return [(hashed, "reader")] * len(tokens), tokens


def confirm_on_terminal() -> Ask | None:
    """A question put on the terminal (end of input answers no), or None without one (then ``--yes`` is needed)."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        return None

    def ask(question: str) -> str:
        try:
            return input(question)
        except EOFError:
            print()
            return ""

    return ask
