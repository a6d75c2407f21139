"""The simulator's event loop: asyncio's own loop (``BaseEventLoop``: tasks, futures, timers as users know
them) on virtual time, with the network of simulated nodes behind ``create_connection``.

* Time is virtual: when nothing is ready, the loop jumps to its next timer (no sleeping). ``time()`` is
  the true time every client and the :class:`History` read (each node reads its own clock, ``_node``).
* One seeded ``random.Random`` makes every choice: each timer's lateness (a loaded machine fires timers
  late), each message's delay (``_net``), which client is descheduled for a moment, every fault.
* Clients: the code run under :meth:`SimLoop.client` (a ``contextvars`` value every task and callback it
  starts inherits) is one process. A client can be paused (nothing of it runs, as under SIGSTOP or a long
  GC: its callbacks wait, in order, for the resume) or killed (nothing of it ever runs again). Callbacks of
  one client always run in the order asyncio promises (FIFO); clients interleave at random, as processes do.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import random
from asyncio import base_events, events
from collections.abc import Callable
from typing import Any

CLIENT: contextvars.ContextVar[SimClient | None] = contextvars.ContextVar("redlock_sim_client", default=None)

NOBODY = contextvars.Context()
"""The context of what runs for no client (a node's work, the network's): never paused."""


class Deadlock(RuntimeError):
    """Nothing is ready and no timer is set, but the run is not done: a hang (a lost wakeup)."""


class SimClient:
    """One simulated client process: its name, and whether it is paused or dead."""

    def __init__(self, loop: SimLoop, name: str) -> None:
        self.loop = loop
        self.name = name
        self.paused = False
        self.dead = False
        self.held: list[tuple[Callable[..., Any], tuple[Any, ...], contextvars.Context]] = []
        self.on_kill: list[Callable[[], None]] = []  # what a death closes (its connections)
        self.tasks: list[asyncio.Task[Any]] = []

    def __repr__(self) -> str:
        return f"<SimClient {self.name}{' paused' if self.paused else ''}{' dead' if self.dead else ''}>"

    def pause(self) -> None:
        self.paused = True

    def revive(self) -> None:
        """The run is over: a dead client's tasks run again, to be cancelled and end (no leftover coroutine)."""
        self.dead = False
        self.paused = True
        self.resume()

    def resume(self) -> None:
        """Run what waited, in its order, from the next loop turn."""
        if self.dead or not self.paused:
            return
        self.paused = False
        held, self.held = self.held, []
        for callback, args, context in held:
            self.loop.call_soon(callback, *args, context=context)

    def kill(self) -> None:
        """The process dies: nothing of it runs again; its connections close (the nodes see a reset)."""
        if self.dead:
            return
        self.dead = True
        for close in self.on_kill:
            close()
        self.on_kill.clear()


class SimLoop(base_events.BaseEventLoop):
    """An asyncio event loop on virtual time, every choice drawn from *rng*."""

    def __init__(self, rng: random.Random, *, lateness: float = 0.002, yield_chance: float = 0.01) -> None:
        super().__init__()
        self.rng = rng
        self.now = 0.0
        self.lateness = lateness
        """Mean lateness of a timer, seconds (exponential; a rare one ten times more)."""
        self.yield_chance = yield_chance
        """The chance that a client's callback finds its process descheduled for a moment."""
        self._selector = _Jump()
        self._clock_resolution = 1e-9
        self._timers: list[tuple[float, int, events.TimerHandle]] = []
        """The timers, as (when, order made, handle): compared in C, not by TimerHandle.__lt__ (a third of
        the loop's own time went to that); equal times fire in the order they were set."""
        self._order = itertools.count()
        self.network: Any = None  # the _net.Network whose nodes create_connection reaches
        self.steps = 0
        self.verbose = False
        """Trace every command and its reply (a replay's readable trace; slower)."""
        self.trace: list[str] = []
        """What happened, in order (faults, sections, violations): the run's digest is made of it."""

    def time(self) -> float:
        return self.now

    def log(self, text: str, *, detail: bool = False) -> None:
        """Add to the trace; a *detail* line (a command, an event: ``verbose`` only) is left out of the digest."""
        self.trace.append(f"{self.now:.6f} {'  ' if detail else ''}{text}")

    # -- clients ----------------------------------------------------------------

    def client(self, name: str) -> SimClient:
        return SimClient(self, name)

    def start(self, client: SimClient, coro: Any, name: str | None = None) -> asyncio.Task[Any]:
        """Start *coro* as a task of *client* (it and everything it starts belong to the client)."""
        context = contextvars.copy_context()
        context.run(CLIENT.set, client)
        task = self.create_task(coro, name=name, context=context)
        client.tasks.append(task)
        return task

    # -- scheduling -------------------------------------------------------------

    def call_soon(self, callback: Any, *args: Any, context: contextvars.Context | None = None) -> events.Handle:  # type: ignore[override]
        client = CLIENT.get() if context is None else context.get(CLIENT)  # (no copy of the context to read it)
        if client is not None:
            return super().call_soon(self._gate, client, callback, args, context, context=context)
        return super().call_soon(callback, *args, context=context)

    def call_at(  # type: ignore[override]
        self, when: float, callback: Any, *args: Any, context: contextvars.Context | None = None
    ) -> events.TimerHandle:
        """A timer, fired late by a random amount (as on a loaded machine)."""
        rng = self.rng
        late = rng.expovariate(1.0 / self.lateness) if self.lateness > 0 else 0.0
        if rng.random() < 0.01:
            late *= 10
        return self.call_at_exactly(when + late, callback, *args, context=context)

    def call_at_exactly(
        self, when: float, callback: Any, *args: Any, context: contextvars.Context | None = None
    ) -> events.TimerHandle:
        """A timer at *when* itself (a message's arrival: its delay was drawn already)."""
        client = CLIENT.get() if context is None else context.get(CLIENT)
        if client is not None:
            return self._timer(when, self._gate, (client, callback, args, context), context)
        return self._timer(when, callback, args, context)

    def _timer(
        self, when: float, callback: Any, args: tuple[Any, ...], context: contextvars.Context | None
    ) -> events.TimerHandle:
        timer = events.TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._timers, (when, next(self._order), timer))
        return timer

    def _gate(
        self,
        client: SimClient,
        callback: Callable[..., Any],
        args: tuple[Any, ...],
        context: contextvars.Context | None,
    ) -> None:
        """Run a client's callback, unless its process is paused (then later, in order) or dead (never in
        this run: kept, so that the run's end can revive its tasks to cancel them)."""
        if client.dead:
            client.held.append((callback, args, context or contextvars.copy_context()))
            return
        if not client.paused and self.yield_chance and self.rng.random() < self.yield_chance:
            client.pause()  # descheduled for a moment: another process runs first
            self._timer(self.now + self.rng.expovariate(1000.0), client.resume, (), None)
        if client.paused:
            client.held.append((callback, args, context or contextvars.copy_context()))
            return
        self.steps += 1
        callback(*args)

    # -- the loop's turn ------------------------------------------------------------

    def _run_once(self) -> None:
        """Move the timers due into the ready callbacks, first jumping the clock to the next timer when
        nothing is ready, then let BaseEventLoop run them (its own timer heap stays empty)."""
        timers = self._timers
        while timers and timers[0][2].cancelled():
            heapq.heappop(timers)
        ready = self._ready  # type: ignore[attr-defined]
        if not ready and not self._stopping:  # type: ignore[attr-defined]
            if not timers:
                raise Deadlock("the simulated run hangs: nothing is ready and no timer is set")
            when = timers[0][0]
            if when > self.now:
                self.now = when
        end = self.now + 1e-9
        while timers and timers[0][0] < end:
            ready.append(heapq.heappop(timers)[2])
        super()._run_once()  # type: ignore[misc]

    # -- what BaseEventLoop leaves to a subclass --------------------------------

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass

    async def create_connection(self, protocol_factory: Any, host: Any = None, port: Any = None, **kwargs: Any) -> Any:
        if self.network is None:
            raise ConnectionRefusedError(111, "no simulated network on this loop")
        return await self.network.connect(protocol_factory, str(host), int(port))

    async def create_unix_connection(self, protocol_factory: Any, path: Any = None, **kwargs: Any) -> Any:
        raise ConnectionRefusedError(111, "the simulator has no unix sockets")

    async def getaddrinfo(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError("the simulator resolves no names")

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> Any:  # type: ignore[override]
        raise RuntimeError("the simulator runs no threads: nothing in a simulated run may block")


class _Jump:
    """The loop's selector: :meth:`SimLoop._run_once` moved the clock already, and there is no I/O."""

    def select(self, timeout: float | None) -> list[Any]:
        return []

    def close(self) -> None:
        pass
