"""A Cluster voter's scripts speak on sharded pub/sub: each script that publishes a hand-off word
(``PUBLISH``) has a twin that says it with ``SPUBLISH`` instead (servers 7.0+), on the same channel, which is
one of the script's keys: in the name's slot, so only the shard primary that serves the name carries it, not
every node of the Cluster. The ``ClusterVoter`` sends the twin where the plain script was asked for
(:func:`sharded_packed`: the EVALSHA's digest swapped, the bytes otherwise the same); a standalone voter's
scripts are never touched. Pure: no I/O.
"""

from __future__ import annotations

from redlock_async import _scripts
from redlock_async._nodes._wire import Fallback
from redlock_async._scripts import Script

_PLAIN, _SHARDED = b"'PUBLISH'", b"'SPUBLISH'"
_HEAD = b"$7\r\nEVALSHA\r\n$40\r\n"  # what pack_script's bytes say after their argument count


def sharded(script: Script) -> Script:
    """*script*'s twin that publishes with ``SPUBLISH`` (*script* itself when it publishes nothing)."""
    if _PLAIN not in script.source:
        return script
    return Script(script.source.replace(_PLAIN, _SHARDED), creates=script.creates)


def _every_script() -> dict[bytes, Script]:
    every = (getattr(_scripts, name) for name in _scripts.__all__)
    return {script.sha: sharded(script) for script in every if isinstance(script, Script)}


TWINS: dict[bytes, Script] = {sha: twin for sha, twin in _every_script().items() if twin.sha != sha}
"""Each script that publishes, by its digest: its sharded twin."""


_PUBLISH, _SPUBLISH = b"*3\r\n$7\r\nPUBLISH\r\n", b"*3\r\n$8\r\nSPUBLISH\r\n"


def sharded_packed(packed: bytes, fallback: Fallback) -> tuple[bytes, Fallback]:
    """A command packed for any node, and its fallback, as a Cluster voter sends them: an EVALSHA of a script
    that publishes, the sharded twin's; a ``PUBLISH`` (a release word said alone, a leader's announcement),
    ``SPUBLISH`` on the same channel, so that it goes to the primary serving the channel's slot and reaches the
    waiters and observers subscribed there with ``SSUBSCRIBE``."""
    if packed.startswith(_PUBLISH):
        return _SPUBLISH + packed[len(_PUBLISH) :], fallback
    start = packed.find(b"\r\n") + 2
    if not packed.startswith(_HEAD, start):
        return packed, fallback
    at = start + len(_HEAD)
    twin = TWINS.get(packed[at : at + 40])
    if twin is None:
        return packed, fallback
    if fallback is not None:
        fallback = (twin, fallback[1], fallback[2])
    return packed[:at] + twin.sha + packed[at + 40 :], fallback
