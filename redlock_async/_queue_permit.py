"""A semaphore in the grant queue: one line per semaphore name, a release grants its slot.

A semaphore of limit L is L permit slots, each held as a lock is held (``semaphore.py``). In the
grant queue, its waiters wait in one line per name, on every node (the scripts in
``_scripts/_queue_permit.py``): a free slot goes to the first waiter in line, and a permit's release
hands its slot straight to the first live waiter, published as ``g<sha1>:<node us>:<slot>`` on the
semaphore's channel. A waiter holds a permit once a majority of the nodes hold **one and the same
slot** for its token (:meth:`_queue.Claim.best_slot`): two holders of one slot would be two holders
of one lock, exactly as for permits taken with ``ACQUIRE_PERMIT``. Nodes that granted it another slot
meanwhile (a split) keep that slot for it until its release, which frees every slot that holds its
token on every node (``PERMIT_LEAVE``): never more holders, at worst a permit idle for one lease.
"""

from __future__ import annotations

from dataclasses import dataclass

LINE, WAITS = b"\x00queue", b"\x00waits"
"""What a semaphore's base key adds for its line and its waits (as a lock key's: ``_queue.SUFFIXES``)."""


@dataclass(frozen=True, slots=True)
class Permits:
    """What a semaphore's claim needs: its base key (the channel), widest-limit key, slots' prefix, limit."""

    base: bytes
    widest: bytes
    prefix: bytes
    limit: int

    @property
    def keys(self) -> tuple[bytes, bytes, bytes, bytes]:
        """The KEYS of every permit script: the base key, its line, its waits, the widest-limit key."""
        return (self.base, self.base + LINE, self.base + WAITS, self.widest)

    def slot_key(self, slot: int) -> bytes:
        return self.prefix + b"%d" % slot
