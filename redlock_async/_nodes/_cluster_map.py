"""Reading a Cluster voter's slot map from its seeds: every seed asked at once on a connection of its own
(AUTH, then ``CLUSTER SHARDS``, or ``CLUSTER SLOTS`` where that is unknown), the first answer taken.

A seed may be a replica, paused, or gone: each is asked within the connect timeout, and one that does
not answer is passed over. Used when no shard primary of the voter is connected to ask (at the start,
or after every known primary failed); otherwise a connected primary is asked (:func:`ask_primaries`).
:func:`replication_ids` reads each primary's replication id (a change on one connection: it was a
replica meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import hiredis

from redlock_async._nodes._endpoint import Endpoint
from redlock_async._nodes._handshake import info_fields
from redlock_async._nodes._node import Node
from redlock_async._nodes._slots import Ranges, shards_ranges, slots_ranges
from redlock_async._nodes._wire import Failure, pack, read_replies


class MapError(ConnectionError):
    """No seed said the slot map; the text says what each one did (no password in it)."""


Answer = tuple[Ranges, bool, str]
"""The slot map, whether it came from ``CLUSTER SHARDS`` (a server 7.0+, which has sharded pub/sub), and, when
it came from ``CLUSTER SLOTS`` because the ACL refused ``CLUSTER SHARDS``, what to tell the user (else "")."""


def _plain(refusal: str) -> str:
    """What a user whose ACL refused ``CLUSTER SHARDS`` (*refusal*, the server's words) is told, or ""."""
    if not refusal.startswith("NOPERM"):
        return ""  # a server before 7.0: it has no CLUSTER SHARDS (nor sharded pub/sub) to allow
    return (
        f"{refusal}: the slot map comes from CLUSTER SLOTS, and the hand-off words go by plain PUBLISH, which"
        " every node of the Cluster carries; allow +cluster|shards (ACL) for sharded pub/sub"
    )


def _refused(shards: str, slots: str) -> str:
    """Why neither ``CLUSTER SHARDS`` nor ``CLUSTER SLOTS`` answered, with what to allow when the ACL refused them."""
    if "NOPERM" in shards or "NOPERM" in slots:
        return f"the user may not read the slot map ({slots}): allow +cluster|shards (+cluster|slots before 7.0)"
    return slots


async def ask_seeds(endpoint: Endpoint, timeout: float) -> Answer:
    """The slot map as the first seed of *endpoint* to answer says it (see :data:`Answer`)."""
    asks = [asyncio.ensure_future(_ask(endpoint, host, port, timeout)) for host, port in endpoint.seeds]
    said: list[str] = []
    try:
        for next_answer in asyncio.as_completed(asks):
            try:
                answer = await next_answer
            except (OSError, MapError, ssl.SSLError, ValueError, TimeoutError, hiredis.ProtocolError) as exc:
                said.append(str(exc) or type(exc).__name__)
                continue
            if answer[0]:
                return answer
            said.append("a seed serves no slot")
    finally:
        for ask in asks:
            ask.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*asks, return_exceptions=True)
    raise MapError(f"no seed of the Cluster said its slot map: {'; '.join(said)}")


async def _ask(endpoint: Endpoint, host: str, port: int, timeout: float) -> Answer:
    name = f"{host}:{port}"
    async with asyncio.timeout(timeout):
        try:
            reader, writer = await asyncio.open_connection(
                host, port, ssl=endpoint.tls, server_hostname=host if endpoint.tls is not None else None
            )
        except OSError as exc:
            raise MapError(f"seed {name}: cannot connect ({exc.strerror or exc})") from None
        try:
            username, password = await endpoint.credentials()
            commands: list[tuple[bytes | str | int, ...]] = []
            if password is not None:
                commands.append((b"AUTH", username, password) if username else (b"AUTH", password))
            commands += [(b"CLUSTER", b"SHARDS"), (b"CLUSTER", b"SLOTS")]
            writer.write(b"".join(pack(command) for command in commands))
            replies = await _replies(reader, len(commands), name)
        finally:
            writer.close()
    if password is not None and isinstance(replies[0], hiredis.ReplyError):
        raise MapError(f"seed {name}: AUTH refused ({replies[0]})")
    shards, slots = replies[-2], replies[-1]
    if not isinstance(shards, hiredis.ReplyError):
        return shards_ranges(shards, host), True, ""
    if not isinstance(slots, hiredis.ReplyError):
        return slots_ranges(slots, host), False, _plain(str(shards))
    raise MapError(f"seed {name}: {_refused(str(shards), str(slots))}")


async def _replies(reader: asyncio.StreamReader, count: int, name: str) -> list[object]:
    replies = await read_replies(reader, count)
    if replies is None:
        raise MapError(f"seed {name} closed the connection")
    return replies


async def ask_primaries(primaries: list[Node], timeout: float) -> Answer | None:
    """The map as the first of *primaries* (connected shard primaries) to answer says it, within *timeout*
    (a paused primary is passed over); None when none did."""
    asks = [asyncio.ensure_future(_ask_one(shard)) for shard in primaries]
    try:
        for next_answer in asyncio.as_completed(asks, timeout=timeout):
            answer = await next_answer
            if answer is not None and answer[0]:
                return answer
    except TimeoutError:
        return None
    finally:
        for ask in asks:
            ask.cancel()
    return None


async def _ask_one(shard: Node) -> Answer | None:
    host = shard.endpoint.host or "localhost"
    shards, slots = shard.outbox.send(b"CLUSTER", b"SHARDS"), shard.outbox.send(b"CLUSTER", b"SLOTS")
    refusal = await shards
    if not isinstance(refusal, Failure):
        return shards_ranges(refusal, host), True, ""
    reply = await slots
    return None if isinstance(reply, Failure) else (slots_ranges(reply, host), False, _plain(refusal.detail))


async def replication_ids(primaries: list[Node], timeout: float) -> dict[Node, bytes]:
    """Each of *primaries*' ``master_replid`` (``INFO replication``) that came within *timeout*."""
    asks = {shard: shard.outbox.send(b"INFO", b"replication") for shard in primaries}
    if asks:
        await asyncio.wait(asks.values(), timeout=timeout)
    ids: dict[Node, bytes] = {}
    for shard, fut in asks.items():
        reply = fut.result() if fut.done() else None
        if isinstance(reply, bytes) and (replid := info_fields(reply).get(b"master_replid")):
            ids[shard] = replid
    return ids
