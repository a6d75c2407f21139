"""The routing of grant words: which claim of this Redlock's waiters a node's grant names.

A node's grant queue publishes ``g<digest>:<node time>[:<counter>]`` on the key's channel when it hands
the key on (``_scripts/_queue.py``); the listener (``_handoff.Listener``) hears every word on the
channels it subscribed to and gives each to :meth:`Grants.route`, which finds the claim the word names
(the claims of a lock_many share one token: one per key, so the channel is part of the address). A
release word from a client without the queue pokes every claim on its channel: the nodes hand the key
on when each enters again.
"""

from __future__ import annotations

from redlock_async._queue._claim import Claim

WORD = 40
"""Characters of the digest a grant word names its claim by."""


def is_grant(token: bytes) -> bool:
    """Whether a word on a channel is a grant (``g<digest>:...``), not a release."""
    return token[:1] == b"g" and len(token) > WORD + 2


class Grants:
    """The claims of one Redlock's waiters, by channel and by the word grants name them by."""

    __slots__ = ("_by_channel", "_by_word")

    def __init__(self) -> None:
        self._by_word: dict[tuple[bytes, bytes], Claim] = {}
        self._by_channel: dict[bytes, list[Claim]] = {}

    def expect(self, channel: bytes, claim: Claim) -> None:
        """Route the grant words for *claim* to it (from before its first entry on)."""
        self._by_word[channel, claim.word] = claim
        self._by_channel.setdefault(channel, []).append(claim)

    def unexpect(self, channel: bytes, claim: Claim) -> None:
        """Stop routing grant words to *claim* (synchronous, safe in cleanup)."""
        self._by_word.pop((channel, claim.word), None)
        claims = self._by_channel.get(channel)
        if claims is not None and claim in claims:
            claims.remove(claim)
            if not claims:
                del self._by_channel[channel]

    def route(self, channel: bytes, token: bytes, node: int) -> None:
        """Give grant word *token*, heard from node *node* on *channel*, to the claim it names, if ours.
        A grant is routed by its word alone: a claim listens from its first entry on, before its waiter
        counts as a user of the channel (a subscription kept from earlier users carries it)."""
        claim = self._by_word.get((channel, token[1 : WORD + 1]))
        if claim is None or token[WORD + 1 : WORD + 2] != b":":
            return
        grant_us, _, counter = token[WORD + 2 :].partition(b":")  # g<digest>:<node us>[:<fencing counter>]
        if grant_us.isdigit():
            claim.heard(node, int(grant_us), int(counter) if counter.isdigit() else None)

    def poke(self, channel: bytes) -> None:
        """Every claim on *channel* enters again at once (a release word from a client without the queue
        reached a majority, or a subscription was confirmed: a grant published before it went unheard)."""
        for claim in self._by_channel.get(channel, ()):
            claim.poke()

    def poke_all(self) -> None:
        """Every claim's wait ends now (its Redlock stopped on a fault): their waiters look at once."""
        for claim in list(self._by_word.values()):
            claim.poke()

    def quit_all(self) -> None:
        """The Redlock closes: every claim leaves the nodes' lines (queued before the connections close; a
        key granted meanwhile goes on) and is poked, so its waiter looks at its Redlock now."""
        for claim in list(self._by_word.values()):
            claim.quit()
            claim.poke()
