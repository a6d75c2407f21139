"""What the simulated clients do (lock, fenced lock, lock_many, semaphore, read/write lock, election), each
critical section recorded in a :class:`History` per resource, and the oracles asked at the end.

A section counts from its acquisition to the earlier of its end and the end of the lease the holder was
sure of (last seen ``validity``): a client paused past its lease (the known limit of every lease) does not
hold it then, and the oracles judge only what the library promises.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from redlock_async import LockLost, LockNotAcquired, Redlock, RedlockError
from redlock_async._core import quorum
from redlock_async.events import LockEvent
from redlock_async.testing._history import History, Section
from redlock_async.testing.sim._loop import NOBODY
from redlock_async.testing.sim._timeline import Timeline

if TYPE_CHECKING:
    from redlock_async.testing.sim._config import Config
    from redlock_async.testing.sim._loop import SimClient, SimLoop


class Open:
    """A section being run: who, what, since when, and until when its holder was sure of its lease."""

    __slots__ = ("client", "fencing", "resource", "shared", "start", "token", "valid_until")

    def __init__(
        self,
        client: str,
        resource: str,
        token: str,
        fencing: int | None,
        start: float,
        valid_until: float,
        shared: bool,
    ) -> None:
        self.client = client
        self.resource = resource
        self.token = token
        self.fencing = fencing
        self.start = start
        self.valid_until = valid_until
        self.shared = shared


class Attempt:
    """One try of a worker: when it began, when it was granted (None: never), when the step ended (after
    the release), whether it could wait (``blocking``), and how it ended."""

    __slots__ = ("blocking", "client", "finished", "granted", "outcome", "resources", "start", "task")

    def __init__(self, client: str, task: int, resources: tuple[str, ...], start: float, blocking: bool) -> None:
        self.client = client
        self.task = task
        self.resources = resources
        self.start = start
        self.blocking = blocking
        self.granted: float | None = None
        self.finished = start
        self.outcome = "running"

    @property
    def waited_until(self) -> float:
        """The end of its wait: its grant, or the step's end."""
        return self.granted if self.granted is not None else self.finished


class Board:
    """The run's clients' work, its record, and its verdicts."""

    def __init__(self, loop: SimLoop, config: Config, urls: list[str]) -> None:
        self.loop = loop
        self.config = config
        self.urls = urls
        self.rng = loop.rng
        self.settings = dict(config.settings)
        self.settings.setdefault("ttl", config.ttl)
        if "queue" not in self.settings and self.rng.random() < 0.3:
            self.settings["queue"] = False  # (a third of the runs: the hand-off by release words)
        self.pace = self.rng.choice(("normal", "normal", "short", "long"))
        self.pace = config.pace or self.pace  # (drawn all the same: one seed, the same run after)
        """How long sections last: short ones with short pauses between tries (hand-over chains, fairness
        between clients), or long ones (extended several times: a holder that must keep its lock)."""
        short = self.pace == "short"
        self.client_count = min(2, config.clients) if short else config.clients
        self.tasks = 2 * config.tasks if short else config.tasks
        """(Short sections: two clients of twice the tasks, whose hand-over chains meet only each other.)"""
        self.attempts: list[Attempt] = []
        self.grants: dict[str, list[tuple[float, str, float]]] = {}
        """Per resource: (when granted, to which client, when its try began), in order."""
        self.lock_events: list[tuple[str, str, str, float]] = []
        """(kind: acquired, extended or lost; client; name; when) of each lock event."""
        self.timeline: Timeline = Timeline(config.nodes)
        self._barrier: asyncio.Event | None = None
        self.stopping = False
        self.clients: list[SimClient] = []
        self.histories: dict[str, History] = {}
        self.open: dict[str, list[Open]] = {}
        self.violations: list[tuple[str, str]] = []
        self.coverage: dict[str, int] = {}
        self.limit = 2
        self.gave_up: list[tuple[tuple[str, ...], float, float]] = []
        """(resources, since, until): a wait for them (all at once) that ran out."""
        self._leaders_trusted = True
        self.terms: dict[int, str] = {}
        """Each term an election granted, to whom (its candidate's owner label)."""
        self.observed: list[tuple[str | None, int | None, float]] = []
        """(owner, term, when) of each leader an observer was shown."""

    async def barrier(self, when: float) -> None:
        """Wait until *when* (virtual seconds): every client waiting here wakes in the same loop turn (a
        timer each would fire each late by its own random lateness)."""
        if self._barrier is None:
            self._barrier = asyncio.Event()
            self.loop.call_at_exactly(when, self._barrier.set, context=NOBODY)
        await self._barrier.wait()

    def count(self, what: str, n: int = 1) -> None:
        self.coverage[what] = self.coverage.get(what, 0) + n

    def violation(self, kind: str, text: str) -> None:
        self.violations.append((kind, text))
        self.loop.log(f"VIOLATION {kind}: {text}")

    # -- the clients --------------------------------------------------------------

    def on_event(self, client: str, event: LockEvent) -> None:
        kind = event.kind.value
        self.count(f"event.{kind}")
        if kind in ("acquired", "extended", "lost"):
            self.lock_events.append((kind, client, event.name or "", self.loop.now))
            if kind == "extended" and self.config.workload in ("lock", "fenced"):
                self._count_bare(client, event.name or "")
        if self.loop.verbose:
            self.loop.log(f"{client} {event!r}", detail=True)
        if event.handoff:
            self.count("handoffs")
        if event.quarantined:
            self.count("quarantined_votes")

    def _count_bare(self, client: str, name: str) -> None:
        """Count an extension after which the lease's key holds its token on a bare majority of the nodes
        (``bare_extensions``: a node failing then costs the lease; docs/algorithm.md, "Regaining the free
        nodes"), read from the nodes' stores as they are (nothing expired or changed by the reading)."""
        sections = [s for s in self.open.get(client, ()) if s.resource == name]
        if not sections:
            return
        key = str(self.settings.get("key_prefix", "redlock:")).encode() + name.encode()
        token = sections[-1].token.encode()
        holding = 0
        for host in self.loop.network.hosts.values():
            store = host.node.store
            if store.data.get(key) == token and store.expires.get(key, float("inf")) > store.clock_ms():
                holding += 1
        if holding == quorum(self.config.nodes):
            self.count("bare_extensions")

    async def client_main(self, client: SimClient) -> None:
        work = WORKLOADS[self.config.workload]
        on_event = functools.partial(self.on_event, client.name)
        # Each client names the nodes by its own host names (n0.c1.sim for n0.sim), as another process:
        # Redlocks of one process on the same nodes share their waiters' lines, and clients must not.
        urls = [url.replace(".sim:", f".{client.name}.sim:") for url in self.urls]
        await asyncio.sleep(self.rng.uniform(0.0, 0.005))  # processes started together start a little apart
        async with Redlock(urls, on_event=on_event, **self.settings) as redlock:
            workers = [work(self, client, redlock, k) for k in range(self.tasks)]
            await asyncio.gather(*workers)

    async def guarded(
        self,
        client: SimClient,
        task: int,
        step: Callable[[Attempt], Awaitable[None]],
        resources: tuple[str, ...] = (),
        *,
        blocking: bool = True,
    ) -> None:
        """One try of a worker: maybe cancelled at a random moment; the library's errors counted; a wait
        that ran out (LockNotAcquired) noted, for the starvation oracle; the try noted for the liveness
        oracles."""
        rng = self.rng
        started = self.loop.now
        attempt = Attempt(client.name, task, resources, started, blocking)
        self.attempts.append(attempt)
        try:
            if rng.random() < 0.15:
                async with asyncio.timeout(rng.uniform(0.0, self.config.ttl)):
                    await step(attempt)
            else:
                await step(attempt)
            attempt.outcome = "done" if attempt.granted is not None else "refused"
        except TimeoutError:
            self.count("cancelled")
            attempt.outcome = "cancelled"
        except LockLost:
            self.count("lost")
            attempt.outcome = "lost"
        except LockNotAcquired:
            self.count("error.LockNotAcquired")
            attempt.outcome = "refused"
            if resources:
                self.gave_up.append((resources, started, self.loop.now))
        except RedlockError as exc:
            self.count(f"error.{type(exc).__name__}")
            attempt.outcome = "error"
        attempt.finished = self.loop.now
        gap = self.config.ttl / 50 if self.pace == "short" else self.config.ttl / 4
        await asyncio.sleep(rng.uniform(0.0, gap))

    async def hold(
        self,
        client: SimClient,
        resource: str,
        holder: Any,
        attempt: Attempt | None = None,
        *,
        shared: bool = False,
        brief: bool = False,
        also: tuple[str, ...] = (),
    ) -> None:
        """The critical section: work in a few slices (*brief*: one, within a quarter ttl: a lease with no
        watchdog), the lease's end noted after each. *also*: the other names of one lease (``lock_many``),
        held as long."""
        now = self.loop.now
        sections = []
        token = str(holder.token or "?")
        for name in (resource, *also):
            if attempt is not None:
                if attempt.granted is None:
                    attempt.granted = now
                self.grants.setdefault(name, []).append((now, client.name, attempt.start))
            section = Open(client.name, name, token, holder.fencing_token, now, now + holder.validity, shared)
            self.open.setdefault(client.name, []).append(section)
            sections.append(section)
            if self.loop.verbose:
                self.loop.log(f"enter {client.name} {name} {token[:6]} f={section.fencing}", detail=True)
            self.count("sections")
        rate = {"short": 50.0, "normal": 4.0, "long": 1.0}[self.pace] / self.config.ttl
        try:
            for _ in range(1 if brief else self.rng.randint(1, 4) + (2 if self.pace == "long" else 0)):
                await asyncio.sleep(self.rng.uniform(0.0, self.config.ttl / 4) if brief else self.rng.expovariate(rate))
                if holder.validity > 0:
                    for section in sections:
                        section.valid_until = self.loop.now + holder.validity
        finally:
            for section in sections:
                self.close(section)

    def close(self, section: Open) -> None:
        sections = self.open.get(section.client, [])
        if section not in sections:
            return  # closed already (its client was killed)
        sections.remove(section)
        end = max(section.start, min(self.loop.now, section.valid_until))
        history = self.histories.setdefault(section.resource, History())
        history.sections.append(
            Section(section.client, section.token, section.fencing, section.start, end, section.shared)
        )
        self.loop.log(
            f"section {section.client} {section.resource} {section.token[:6]} f={section.fencing} "
            f"{section.start:.6f}-{end:.6f}"
        )

    def killed(self, client: SimClient) -> None:
        """A client died: its open sections end now (or at their lease's end, if earlier)."""
        for section in list(self.open.get(client.name, [])):
            self.close(section)

    # -- the verdicts -------------------------------------------------------------

    async def after_close(self, network: Any) -> None:
        """Every client closed: once every key's designed life is over (a minute; a semaphore's widest-limit
        key outlives its permits by a lease, a line its entries), no lock key is left (fence counters and the
        restart quarantine's markers aside)."""
        await asyncio.sleep(60.0)
        prefix = dict(self.config.settings).get("key_prefix", "redlock:").encode()
        for host in network.hosts.values():
            store = host.node.store
            left = [key for key in store.live_keys() if key.startswith(prefix) and key != prefix]
            if left:
                self.violation("keys_left", f"node {host.node.name} keeps {sorted(left)[:5]} after every client closed")

    def check(self) -> None:
        """The safety oracles, and the starvation oracle (the liveness oracles: ``_liveness``)."""
        self._check_starvation()
        self._check_terms()
        for resource, history in sorted(self.histories.items()):
            if self.config.workload == "semaphore" and resource == "sem":
                most = history.most_inside()
                if most > self.limit:
                    self.violation("over_limit", f"{most} holders of semaphore {resource!r} (limit {self.limit})")
            elif self._leaders_trusted or self.config.workload != "election":
                for first, second in history.overlaps():
                    self.violation("two_holders", f"{resource}: {_shown(first)} and {_shown(second)} overlap")
                    break
            for before, after in history.fencing_regressions()[:1]:
                self.violation("fencing", f"{resource}: {_shown(after)} after {_shown(before)}: the token did not grow")

    def _check_terms(self) -> None:
        """Each leader an observer was shown carries its own term, never another candidate's."""
        for owner, term, when in self.observed:
            granted = self.terms.get(term) if term is not None else None
            if granted is not None and granted != owner:
                shown = f"at {when:.6f} an observer was shown {owner} leading with term {term}, {granted}'s"
                self.violation("observed_term", shown)
                return

    def _check_starvation(self) -> None:
        """With no fault (``SCRIPT FLUSH`` aside: a lost script costs a round trip, never a lease), no wait
        runs out while its resources were free (no section open on any) for two ttls."""
        if self.config.faults - {"flush"} or self.config.workload in ("many", "election"):
            # (lock_many: a waiter for a+b first in b's line holds b's grants while it waits for a: FIFO
            # per name, by design; a single waiter for b behind it waits with no section open on b.)
            # (election: a term's section ends a ttl after its grant, as a campaign shows no lease, while the
            # watchdog keeps the leader's key: the lock is not free then.)
            return
        window = 2 * self.config.ttl
        for resources, since, until in self.gave_up:
            sections = [s for name in resources if (h := self.histories.get(name)) for s in h.sections]
            busy = sorted((s.start, s.end) for s in sections if s.end > since)
            resource = "+".join(resources)
            free_from = since
            for start, end in busy:
                if start >= until:
                    break
                if start - free_from > window:
                    break
                free_from = max(free_from, end)
            else:
                start = until
            if min(start, until) - free_from > window:
                self.violation(
                    "starved",
                    f"a wait for {resource!r} from {since:.4f} ran out at {until:.4f}, while it was free from "
                    f"{free_from:.4f} to {min(start, until):.4f}",
                )
                return


def _shown(section: Section) -> str:
    return (
        f"{section.client} ({section.token[:6]}, fencing {section.fencing_token}) "
        f"{section.start:.4f}-{section.end:.4f}{' shared' if section.shared else ''}"
    )


# -- workloads ------------------------------------------------------------------------

Worker = Callable[[Board, "SimClient", Redlock, int], Awaitable[None]]


async def lock_worker(board: Board, client: SimClient, redlock: Redlock, k: int, *, fencing: bool = False) -> None:
    ttl = board.config.ttl
    racer = k == 0 and client.name in ("c0", "c1")
    if not racer:  # the run opens with two clients' tries on a fresh cluster, alone (the free-try oracle)
        await asyncio.sleep(board.rng.uniform(ttl / 2, ttl))
    if racer:  # both meet at a barrier once connected (as processes at a file barrier), then try at once
        await board.barrier(0.03)
    first = True
    while not board.stopping:
        if (racer and first) or board.rng.random() < 0.2:

            async def once(attempt: Attempt) -> None:
                lock = redlock.lock("res", fencing=fencing)
                if await lock.acquire(blocking=False):
                    try:
                        await board.hold(client, "res", lock, attempt, brief=True)
                    finally:
                        await lock.release()

            await board.guarded(client, k, once, ("res",), blocking=False)
        else:

            async def step(attempt: Attempt) -> None:
                lock = redlock.lock("res", fencing=fencing, acquire_timeout=board.rng.uniform(0.0, 3 * ttl))
                async with lock:
                    await board.hold(client, "res", lock, attempt)

            await board.guarded(client, k, step, ("res",))
        first = False


async def fenced_worker(board: Board, client: SimClient, redlock: Redlock, k: int) -> None:
    await lock_worker(board, client, redlock, k, fencing=True)


async def many_worker(board: Board, client: SimClient, redlock: Redlock, k: int) -> None:
    while not board.stopping:
        names = board.rng.choice([["a"], ["b"], ["a", "b"], ["b", "a"]])

        async def step(attempt: Attempt, names: list[str] = names) -> None:
            timeout = board.rng.uniform(0.0, 3 * board.config.ttl)
            lock = redlock.lock(names[0], acquire_timeout=timeout) if len(names) == 1 else None
            if lock is None:
                lock = redlock.lock_many(names, acquire_timeout=timeout)
            async with lock:
                await board.hold(client, names[0], lock, attempt, also=tuple(names[1:]))

        await board.guarded(client, k, step, tuple(names))


async def semaphore_worker(board: Board, client: SimClient, redlock: Redlock, k: int) -> None:
    while not board.stopping:

        async def step(attempt: Attempt) -> None:
            semaphore = redlock.semaphore(
                "sem", limit=board.limit, acquire_timeout=board.rng.uniform(0.0, 3 * board.config.ttl)
            )
            async with semaphore:
                await board.hold(client, "sem", semaphore, attempt)

        await board.guarded(client, k, step, ("sem",))


async def rw_worker(board: Board, client: SimClient, redlock: Redlock, k: int) -> None:
    while not board.stopping:

        async def step(attempt: Attempt) -> None:
            rw = redlock.rw_lock("rw", acquire_timeout=board.rng.uniform(0.0, 3 * board.config.ttl))
            reader = board.rng.random() < 0.6
            lock: Any = rw.read() if reader else rw.write()
            async with lock:
                await board.hold(client, "rw", lock, attempt, shared=reader)

        await board.guarded(client, k, step, ("rw",))


class _Term:
    """An election's term as a holder (its token and fencing token), sure of its lease for a ttl."""

    def __init__(self, client: str, term: int, until: float, loop: SimLoop) -> None:
        self.token = f"{client}/{term}"
        self.fencing_token = term
        self._until = until
        self._loop = loop

    @property
    def validity(self) -> float:
        return max(0.0, self._until - self._loop.now)


async def election_worker(board: Board, client: SimClient, redlock: Redlock, k: int) -> None:
    if "pause" in board.config.faults:
        board._leaders_trusted = False  # a campaign shows no lease: a paused leader's block runs on (the limit)
    owner = f"{client.name}-{k}"
    election = redlock.election("leader", owner=owner)
    watcher = asyncio.ensure_future(_observe(board, election)) if k == 0 else None
    try:
        while not board.stopping:

            async def step(attempt: Attempt) -> None:
                async with election.campaign(timeout=board.rng.uniform(0.0, 3 * board.config.ttl)) as term:
                    board.count("terms")
                    board.terms[term] = owner
                    holder = _Term(client.name, term, board.loop.now + board.config.ttl, board.loop)
                    await board.hold(client, "leader", holder, attempt)

            with contextlib.suppress(RedlockError):
                await board.guarded(client, k, step, ("leader",))
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, RedlockError):
                await watcher


async def _observe(board: Board, election: Any) -> None:
    """One observer per client: each leader it is shown, with its term (the terms oracle): by ``leader()``,
    then by ``observe()``, started again at random (a fresh observer yields the leader it meets first)."""
    while not board.stopping:
        with contextlib.suppress(RedlockError):
            info = await election.leader()
            if info.state == "held" and info.fencing_counter is not None:
                board.observed.append((info.owner, info.fencing_counter, board.loop.now))
            async with contextlib.aclosing(election.observe()) as leaders:
                async for info in leaders:
                    board.count("observed")
                    board.observed.append((info.owner, info.fencing_counter, board.loop.now))
                    if board.rng.random() < 0.5:
                        break
        await asyncio.sleep(board.rng.uniform(0.0, board.config.ttl / 4))


WORKLOADS: dict[str, Worker] = {
    "lock": lock_worker,
    "fenced": fenced_worker,
    "many": many_worker,
    "semaphore": semaphore_worker,
    "rw": rw_worker,
    "election": election_worker,
}
