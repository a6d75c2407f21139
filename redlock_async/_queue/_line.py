"""A primitive's line in the grant queue, as one claim stands in it: the seam between ``_queue.Claim`` and
each primitive.

:class:`_queue.Claim` keeps what every waiter does (its requests and their replies, the bell, the rules
for stale grant words, the split grace and give-back, the fence round). What differs per primitive is a
:class:`Line`: the scripts a claim enters, stays and leaves with, how a reply's or a grant word's last
field is read, and what "held" means. A lock's line (``_queue.LockLine``) and a read/write lock's
(``_queue_rw.RwLine``) are key lines (:class:`KeyLine`): a node holds a key for the waiter. A
semaphore's (``_queue_permit.PermitLine``) holds a slot, and counts on the nodes of the slot most of
them hold.
"""

from __future__ import annotations

from typing import Protocol, TypeAlias

from redlock_async._scripts import Script

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
