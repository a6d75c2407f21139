"""A semaphore in the grant queue: one line per semaphore name, a release grants its slot.

A semaphore of limit L is L permit slots, each held as a lock is held (``semaphore.py``). In the
grant queue, its waiters wait in one line per name, on every node (the scripts in
``_scripts/_queue_permit.py``): a free slot goes to the first waiter in line, and a permit's release
hands its slot straight to the first live waiter, published as ``g<sha1>:<node us>:<slot>`` on the
semaphore's channel. A waiter holds a permit once a majority of the nodes hold **one and the same
slot** for its token (:meth:`PermitLine.holding`): two holders of one slot would be two holders
of one lock, exactly as for permits taken with ``ACQUIRE_PERMIT``. Nodes that granted it another slot
meanwhile (a split) keep that slot for it until its release, which frees every slot that holds its
token on every node (``PERMIT_LEAVE``): never more holders, at worst a permit idle for one lease.
"""

from __future__ import annotations

from dataclasses import dataclass

from redlock_async._queue._line import Packed
from redlock_async._scripts import PERMIT_ENTER, PERMIT_LEAVE, PERMIT_STAY

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


class PermitLine:
    """A semaphore waiter's line (``_queue_line.Line``): what a node grants is a slot, named by a reply's
    or a grant word's last field, and a permit is held once a majority holds one and the same slot."""

    __slots__ = ("refusals", "slots", "spec", "want")

    fenced = False  # a permit raises no fencing counter
    reads = False

    def __init__(self, spec: Permits, n_nodes: int) -> None:
        self.spec = spec
        self.slots: list[int | None] = [None] * n_nodes
        """Per node: the slot it holds for us (None: none, or we cannot tell)."""
        self.want = -1
        """Split between slots: the slot we wait for on every node (-1: any)."""
        self.refusals = [0] * n_nodes
        """Per node: the limit its latest reply said a slot is held under (0: none)."""

    @property
    def keys(self) -> tuple[bytes, ...]:
        return self.spec.keys

    def join(self, token: bytes, ttl_ms: int, score: bytes, life_ms: int) -> Packed:
        spec = self.spec
        return PERMIT_ENTER, (token, ttl_ms, score, life_ms, spec.limit, spec.prefix, self.want)

    def stay(self, token: bytes, ttl_ms: int, score: bytes, life_ms: int) -> Packed:
        spec = self.spec
        return PERMIT_STAY, (token, score, life_ms, ttl_ms, spec.limit, spec.prefix, self.want)

    def quit(self, token: bytes) -> Packed:
        return PERMIT_LEAVE, (token, self.spec.prefix)

    def replied(self, i: int, code: object) -> None:
        # PERMIT_ENTER's -L: a slot is held under another limit L.
        self.refusals[i] = -code if isinstance(code, int) and code < 0 else 0

    def took(self, i: int, extra: object) -> bool:
        if not isinstance(extra, (int, bytes)):
            return False  # no slot named: the next entry's reply says where things stand
        self.slots[i] = int(extra)  # a permit's grant word names the slot where a lock's names the counter
        return True

    def drop(self, i: int) -> None:
        self.slots[i] = None

    def holding(self, held: list[int]) -> list[int]:
        """The nodes of *held* that hold the slot most of them hold for us (two holders of one slot would
        be two of one lock)."""
        by_slot: dict[int, list[int]] = {}
        for i in held:
            if (slot := self.slots[i]) is not None:
                by_slot.setdefault(slot, []).append(i)
        if not by_slot:
            return []
        return by_slot[max(by_slot, key=lambda s: len(by_slot[s]))]

    def slot(self, holders: list[int]) -> int | None:
        return self.slots[holders[0]] if holders else None

    def why_not(self, i: int, holders: list[int]) -> str:
        return f"granted slot {self.slots[i]}, most nodes slot {self.slot(holders)}"

    def split(self, held: list[int], n_nodes: int) -> tuple[list[int], list[int]]:
        """Keep the slot most nodes gave us and wait for that one everywhere (``PERMIT_STAY`` with it
        wanted): other slots go on to other waiters, so every waiter's holdings converge on one slot, and
        each slot's waiters are served in line order as a lock's are."""
        keep = self.holding(held)
        slot = self.slot(keep)
        self.want = -1 if slot is None else slot
        return keep, [i for i in range(n_nodes) if i not in keep]
