"""A Cluster voter's scripts as each shard primary runs them: on sharded pub/sub, and with the native release
where that primary's connection may run it.

Each script that publishes a hand-off word (``PUBLISH``) has a twin that says it with ``SPUBLISH`` instead
(servers 7.0+), on the same channel, which is one of the script's keys: in the name's slot, so only the shard
primary that serves the name carries it, not every node of the Cluster. And a lock's release
(``QUEUE_LEAVE``) goes as ``QUEUE_LEAVE_NATIVE`` (``DELIFEQ`` in place of ``GET`` and ``DEL``) to a primary
whose connection found DELIFEQ and the user's right to run it (``Node.delifeq``, asked by each primary's
handshake as a standalone node's is): a Cluster whose primaries differ mixes the two. The ``ClusterVoter``
swaps the EVALSHA's digest (:func:`for_shard`) once it knows the primary (again after a ``MOVED`` or an
``ASK`` sends it to another one); a standalone voter's scripts are never touched. Pure: no I/O.
"""

from __future__ import annotations

from redlock_async import _scripts
from redlock_async._nodes._wire import Fallback
from redlock_async._scripts import HANDED_RELEASE, QUEUE_LEAVE, QUEUE_LEAVE_NATIVE, Script

_PLAIN, _SHARDED = b"'PUBLISH'", b"'SPUBLISH'"


def sharded(script: Script) -> Script:
    """*script*'s twin that publishes with ``SPUBLISH`` (*script* itself when it publishes nothing)."""
    if _PLAIN not in script.source:
        return script
    return Script(script.source.replace(_PLAIN, _SHARDED), creates=script.creates)


Choices = tuple[Script, Script, Script, Script]
"""What a script goes as to a shard primary: on plain pub/sub without / with the native release, then on
sharded pub/sub without / with it (index ``2 * sharded + native``)."""


def _every_script() -> dict[bytes, Choices]:
    every = [getattr(_scripts, name) for name in _scripts.__all__]
    choices: dict[bytes, Choices] = {}
    for script in every:
        if not isinstance(script, Script) or script is QUEUE_LEAVE_NATIVE:
            continue
        native = QUEUE_LEAVE_NATIVE if script is QUEUE_LEAVE else script
        ways = (script, native, sharded(script), sharded(native))
        if len({way.sha for way in ways}) > 1:  # a script that publishes, or the release
            for way in ways:
                choices[way.sha] = ways
    return choices


ROUTES: dict[bytes, Choices] = _every_script()
"""Each script that publishes, or has a native twin, by the digest of any of its forms: its forms."""

TWINS: dict[bytes, Script] = {sha: ways[2] for sha, ways in ROUTES.items() if ways[2].sha != sha and ways[0].sha == sha}
"""Each script that publishes, by its digest: its sharded twin."""

NATIVE_TWIN = sharded(QUEUE_LEAVE_NATIVE)
"""What a shard primary's connection loads besides the sharded twins of the scripts: the release's native form,
which a primary without DELIFEQ loads and never runs (loading runs nothing)."""


PUBLISH, _SPUBLISH = b"*3\r\n$7\r\nPUBLISH\r\n", b"*3\r\n$8\r\nSPUBLISH\r\n"
"""How a ``PUBLISH`` packed alone begins (a Cluster voter on sharded pub/sub sends it as ``SPUBLISH``)."""


def sharded_publish(packed: bytes) -> bytes:
    """A ``PUBLISH`` (a release word said alone, a leader's announcement) as ``SPUBLISH`` on the same channel, so
    that it goes to the primary serving the channel's slot and reaches the waiters and observers subscribed
    there with ``SSUBSCRIBE``; any other command as it is."""
    if packed.startswith(PUBLISH):
        return _SPUBLISH + packed[len(PUBLISH) :]
    return packed


_HANDED = b"*5\r\n$7\r\nEVALSHA\r\n$40\r\n" + HANDED_RELEASE.sha + b"\r\n$1\r\n1\r\n"
DELIFEQ = b"*3\r\n$7\r\nDELIFEQ\r\n"
"""How a hand-over's release begins: the ``HANDED_RELEASE`` script on one key and one token, and the native
``DELIFEQ`` it is where the primary may run that (the same key and token after it: the same 1 or 0)."""


def for_shard(packed: bytes, digest: int, fallback: Fallback, sharded: bool, native: bool) -> tuple[bytes, Fallback]:
    """A script's EVALSHA (*packed*, its digest at *digest*: ``_slots.routing_key``'s; with its *fallback*), as one
    shard primary runs it: its sharded twin where the map says sharded pub/sub, its native release where that
    primary's connection may run ``DELIFEQ`` (a hand-over's release: ``DELIFEQ`` itself, as on a standalone
    node); as it is when it is neither."""
    sha = packed[digest : digest + 40]
    ways = ROUTES.get(sha)
    if ways is None:
        if native and packed.startswith(_HANDED):
            return DELIFEQ + packed[len(_HANDED) :], None
        return packed, fallback
    script = ways[2 * sharded + native]
    if script.sha == sha:
        return packed, fallback
    if fallback is not None:
        fallback = (script, fallback[1], fallback[2])
    return packed[:digest] + script.sha + packed[digest + 40 :], fallback


def scripted(packed: bytes, key: bytes) -> tuple[bytes, Fallback]:
    """A hand-over's ``DELIFEQ`` of *key* (*packed*) as the ``HANDED_RELEASE`` script again, with its fallback: for a
    primary that may not run it (a release redirected there by ``MOVED`` or ``ASK``)."""
    rest = packed[len(DELIFEQ) :]
    at = rest.find(b"\r\n", rest.find(b"\r\n") + 2 + len(key)) + 2  # past the key, at the token's length
    end = rest.find(b"\r\n", at)
    start = end + 2
    token = rest[start : start + int(rest[at + 1 : end])]
    return _HANDED + rest, (HANDED_RELEASE, (key,), (token,))
