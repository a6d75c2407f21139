"""The lines of the grant queue, one per primitive, as one claim stands in it: the seam between
``_queue.Claim`` and each primitive.

:class:`_queue.Claim` keeps what every waiter does (its requests and their replies, the bell, the rules
for stale grant words, the split grace and give-back, the fence round). What differs per primitive is a
:class:`Line`: the scripts a claim enters, stays and leaves with, how a reply's or a grant word's last
field is read, and what "held" means. A lock's line (``_queue.LockLine``) and a read/write lock's
(:class:`RwLine`) are key lines (:class:`KeyLine`): a node holds a key for the waiter. A
semaphore's (:class:`PermitLine`) holds a slot, and counts on the nodes of the slot most of
them hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeAlias

from redlock_async._core import RwKeys, SemaphoreKeys
from redlock_async._scripts import (
    OLD_LAYOUT,
    PERMIT_ENTER,
    PERMIT_LEAVE,
    PERMIT_STAY,
    RW_ENTER,
    RW_QUEUE_LEAVE,
    RW_QUEUE_STAY,
    WIDER,
    Script,
)

Packed: TypeAlias = tuple[Script, tuple[bytes | int, ...]]
"""A script and its arguments (the KEYS are the line's :attr:`Line.keys`)."""


class Line(Protocol):
    """What a claim asks of its primitive's line (node *i*: the index of a node in the claim's nodes)."""

    @property
    def keys(self) -> tuple[bytes, ...]:
        """The KEYS of every script of the line; the first is the channel its grant words are published on."""

    @property
    def fenced(self) -> bool:
        """With ``settings.fencing``: a majority's fencing counters are raised before a hold counts."""

    @property
    def reads(self) -> bool:
        """With ``settings.fencing``: the counters are read (the last writer's token), none raised."""

    def join(self, token: bytes, ttl_ms: int, score: bytes, life_ms: int) -> Packed:
        """Join (or stay in) the line; a node whose key is free grants it to its first waiter."""

    def stay(self, token: bytes, ttl_ms: int, score: bytes, life_ms: int) -> Packed:
        """Give back what a node granted us and stay in its line (a split)."""

    def quit(self, token: bytes) -> Packed:
        """Leave the line, handing on what a node granted us (it cannot grant: sent without a clock reading)."""

    def replied(self, i: int, code: object) -> None:
        """Node *i* answered a script of ours; *code*: its reply's first field."""

    def took(self, i: int, extra: object) -> bool:
        """Node *i* holds for us, and a reply or grant word carried *extra* (its last field; None: none).
        False: without it the hold cannot count (the next reply says where things stand)."""

    def drop(self, i: int) -> None:
        """Node *i* no longer holds for us (or we cannot tell)."""

    def holding(self, held: list[int]) -> list[int]:
        """Of *held* (the nodes that hold for us and count), those a win is counted on."""

    def slot(self, holders: list[int]) -> int | None:
        """What *holders* (:meth:`holding`'s) hold beyond the key: a permit's slot; None: nothing."""

    def why_not(self, i: int, holders: list[int]) -> str:
        """Why node *i*, which holds for us, is not among *holders* (a vote's detail)."""

    def split(self, held: list[int], n_nodes: int) -> tuple[list[int], list[int]]:
        """No majority came: the nodes whose hold we keep (their grace starts again), and those we give back
        and stay in line on (*held*: the nodes that hold for us)."""


class KeyLine:
    """A line whose nodes hold a key for the waiter (a lock's, a read/write lock's): a hold is the key alone,
    counted on every node that holds it; a split gives back every one of them."""

    __slots__ = ()

    def replied(self, i: int, code: object) -> None:
        pass

    def took(self, i: int, extra: object) -> bool:
        return True  # (a fencing counter in *extra* is the claim's to keep: a fenced lock's and a writer's alike)

    def drop(self, i: int) -> None:
        pass

    def holding(self, held: list[int]) -> list[int]:
        return held

    def slot(self, holders: list[int]) -> int | None:
        return None

    def why_not(self, i: int, holders: list[int]) -> str:
        return ""  # (never asked: every node that holds the key is a holder)

    def split(self, held: list[int], n_nodes: int) -> tuple[list[int], list[int]]:
        return [], held


# -- a semaphore's line ------------------------------------------------------------
# A semaphore in the grant queue: one line per semaphore name, a release grants its slot.
#
# A semaphore of limit L is L permit slots, each held as a lock is held (``semaphore.py``). In the
# grant queue, its waiters wait in one line per name, on every node (the scripts in
# ``_scripts/_permit_line.py``): a free slot goes to the first waiter in line, and a permit's release
# hands its slot straight to the first live waiter, published as ``g<sha1>:<node us>:<slot>`` on the
# semaphore's channel. A waiter holds a permit once a majority of the nodes hold **one and the same
# slot** for its token (:meth:`PermitLine.holding`): two holders of one slot would be two holders
# of one lock, exactly as for permits taken with ``ACQUIRE_PERMIT``. Nodes that granted it another slot
# meanwhile (a split) keep that slot for it until its release, which frees every slot that holds its
# token on every node (``PERMIT_LEAVE``): never more holders, at worst a permit idle for one lease.


class Permits:
    """What a semaphore's claim needs: its keys (``_names.SemaphoreKeys``) and its limit; the slots' keys are
    made once, as many as are named (the limit, or the widest limit a node answered: :meth:`keys`)."""

    __slots__ = ("_slots", "limit", "names")

    def __init__(self, names: SemaphoreKeys, limit: int) -> None:
        self.names = names
        self.limit = limit
        self._slots = names.slot_keys(limit)

    @property
    def base(self) -> bytes:
        """The semaphore's channel: its releases and grants are told there."""
        return self.names.channel

    @property
    def widest(self) -> bytes:
        return self.names.widest

    def slots(self, width: int = 0) -> tuple[bytes, ...]:
        """The keys of slots 0..max(limit, *width*) - 1."""
        return self._slots if width <= self.limit else self.names.slot_keys(width)

    def keys(self, width: int = 0) -> tuple[bytes, ...]:
        """The KEYS of every permit script: the channel, the line, its entries, the widest-limit key, and
        the slots named (at least the limit of them, *width* when wider)."""
        names = self.names
        return (names.channel, names.line, names.waits, names.widest, *self.slots(width))

    def slot_key(self, slot: int) -> bytes:
        return self.slots(slot + 1)[slot]


class PermitLine:
    """A semaphore waiter's line (``_lines.Line``): what a node grants is a slot, named by a reply's
    or a grant word's last field, and a permit is held once a majority holds one and the same slot."""

    __slots__ = ("old_layout", "refusals", "slots", "spec", "want", "width")

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
        self.old_layout = [False] * n_nodes
        """Per node: its latest reply said the semaphore's keys are of the layout before 2."""
        self.width = 0
        """The most slots a node asked to be named (its widest limit, wider than ours)."""

    @property
    def keys(self) -> tuple[bytes, ...]:
        return self.spec.keys(self.width)

    def join(self, token: bytes, ttl_ms: int, score: bytes, life_ms: int) -> Packed:
        return PERMIT_ENTER, (token, ttl_ms, score, life_ms, self.spec.limit, self.want)

    def stay(self, token: bytes, ttl_ms: int, score: bytes, life_ms: int) -> Packed:
        return PERMIT_STAY, (token, score, life_ms, ttl_ms, self.spec.limit, self.want)

    def quit(self, token: bytes) -> Packed:
        return PERMIT_LEAVE, (token,)

    def replied(self, i: int, code: object) -> None:
        # PERMIT_ENTER's -L: a slot is held under another limit L; OLD_LAYOUT; WIDER - w: name w slots.
        self.refusals[i] = 0
        self.old_layout[i] = code == OLD_LAYOUT
        if isinstance(code, int) and code < OLD_LAYOUT:
            self.width = max(self.width, WIDER - code)
        elif isinstance(code, int) and OLD_LAYOUT < code < 0:
            self.refusals[i] = -code

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


# -- a read/write lock's line -------------------------------------------------------
# A read/write lock in the grant queue: one line per name, readers and writers in arrival order.
#
# Its waiters wait in one line per read/write lock name, on every node (the scripts in
# ``_scripts/_rw_line.py``): a writer's release, or the last reader's, grants the head of the line what
# the rule on one node allows (a writer when no reader's entry lives; every reader at the head up to the
# next writer), and publishes one grant word per waiter granted, as a lock's line does, on the lock's
# channel (its writer key W). A reader holds once a majority of the nodes hold its entry of the readers'
# hash for its token; a writer once a majority hold W for its token (fenced: and raised the counter, ``QUEUE_FENCE``,
# as for a lock). The safety argument is the read/write lock's (docs/algorithm.md, "Read/write locks in
# the grant queue"): every grant keeps the rule on one node, whoever sends it.

READER, WRITER = b"r", b"w"


@dataclass(frozen=True, slots=True)
class RwLine(KeyLine):
    """What a read/write lock's claim needs: its writer key (the channel) and companions
    (``_names.rw_keys``), the fencing counter, its side. As a claim's line (``_lines.Line``), a node
    holds the waiter's lease: a reader's entry in the readers' hash, or the writer key."""

    writer_key: bytes
    companions: RwKeys
    """The readers' hash, the waiting writers, the line and its entries (``_names.rw_keys``)."""
    fence_key: bytes | None
    kind: bytes
    """READER or WRITER."""

    @property
    def keys(self) -> tuple[bytes, ...]:
        """The KEYS of every line script (``_scripts/_rw_line.py``)."""
        w = self.writer_key
        rw = self.companions
        keys = (w, rw.readers, rw.writers, rw.line, rw.waits)
        return keys if self.fence_key is None else (*keys, self.fence_key)

    @property
    def fenced(self) -> bool:
        """A writer, fenced as a lock is (with a fencing counter: ``settings.fencing``)."""
        return self.kind == WRITER and self.fence_key is not None

    @property
    def reads(self) -> bool:
        """Not fenced (a reader): its token is the last writer's, the largest counter its majority read."""
        return not self.fenced

    def join(self, token: bytes, ttl_ms: int, score: bytes, life_ms: int) -> Packed:
        return RW_ENTER, (token, ttl_ms, score, life_ms, self.kind)

    def stay(self, token: bytes, ttl_ms: int, score: bytes, life_ms: int) -> Packed:
        return RW_QUEUE_STAY, (token, score, life_ms, ttl_ms, self.kind)

    def quit(self, token: bytes) -> Packed:
        return RW_QUEUE_LEAVE, (token, self.kind)
