"""The yes votes held for a suspect node's recheck (``Node.vouching``), each confirmed at once if it can be.

A node met without marker, while others show theirs, may be a node of a new cluster that another client is
marking this very moment: a ballot holds its yes until the node's first recheck (``_quarantine``). That
recheck comes 0.1 s after the probe; a fault in between (the node paused, a connection reset) left the yes
to be refused when the hold ran out, though another client's marker had been on the node all along (the
simulator's seed 8136: three clients meeting a new cluster, one racer's yes on a node paused after it
answered). So the first yes held asks at once too: a ``GET`` of the marker right behind the vote, on the
connection that carried it. A current marker counts the node at once, exactly as the recheck would: read
after the vote ran, by the same server process, it says that a client judged the node in service and that
nothing since (a ``FLUSHALL``, a restart: a new connection) took the marker, nor with it our key. Anything
else changes nothing: the recheck and the hold decide as before.
"""

from __future__ import annotations

from collections.abc import Callable

from redlock_async._nodes import Node, Reaction, Reply, pack


class Held(list[Callable[[], None]]):
    """``Node.vouching`` of a suspect: the counts waiting for its recheck. The first added (and the first after
    each answer) sends a ``GET`` of the *marker* key behind the vote; *answered* gets its reply."""

    def __init__(self, node: Node, marker: bytes, answered: Callable[[Reply], None]) -> None:
        super().__init__()
        self._node = node
        self._get = pack((b"GET", marker))
        self._answered = answered
        self.asking = False
        """A confirming ``GET`` is on its way (one at a time)."""

    def append(self, count: Callable[[], None], /) -> None:
        super().append(count)
        if not self.asking:
            self.asking = True
            self._node.send_packed(Reaction(self._read), 0, self._get)

    def _read(self, reply: Reply) -> None:
        self.asking = False
        self._answered(reply)
