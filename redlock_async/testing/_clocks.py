"""A clock nemesis: one node's wall clock stepped, sped up, slowed down or frozen, through libfaketime.

``LocalNode(clock=True)`` (or ``LocalNodes(5, clock=True)``) starts the server with libfaketime
preloaded (``LD_PRELOAD``), reading its fake time from a file in the node's directory that
:class:`NodeClock` rewrites: ``FAKETIME_NO_CACHE=1`` makes the server read it again at every
clock read, and ``FAKETIME_DONT_FAKE_MONOTONIC=1`` leaves ``CLOCK_MONOTONIC`` alone, as an NTP
step or a drifting oscillator on a real host would. Redis and Valkey expire keys by the wall
clock, so a node whose clock jumps ahead expires every lease at once, one that runs fast
shortens them, and one that steps back or freezes keeps them too long.

The library comes from Debian's ``faketime`` package (``apt-get install faketime``), or from
``$REDLOCK_FAKETIME_LIB``; without it, ``clock=True`` raises and says how to get it.
``DockerNode(clock=True)`` does the same in a container whose image carries the library at one
of :data:`LIBRARY_PATHS`, with the spec in a host directory bind-mounted into it.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable

SPEC_NAME = "faketime.spec"
"""The file in the node's directory that libfaketime reads the fake time from."""

LIBRARY_PATHS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)

SETTLE_TIMEOUT = 3.0
"""Seconds a change may take to show in the node's TIME before the change is reported as failed."""

REAL = "+0 x1"
"""The spec of the real time (the rate too: libfaketime keeps a rate the spec does not name)."""

TOLERANCE = 0.05
"""How far (seconds) the node's TIME may be from the clock asked for, once the change shows."""


def faketime_library() -> str | None:
    """The libfaketime shared object to preload: ``$REDLOCK_FAKETIME_LIB``, else Debian's; None when absent."""
    given = os.environ.get("REDLOCK_FAKETIME_LIB")
    if given:
        return given if os.path.exists(given) else None
    return next((path for path in LIBRARY_PATHS if os.path.exists(path)), None)


def require_faketime() -> str:
    """The library's path, or a RuntimeError saying how to install it."""
    library = faketime_library()
    if library is None:
        raise RuntimeError(
            "clock=True needs libfaketime: on Debian or Ubuntu `apt-get install faketime`, elsewhere build it "
            "(https://github.com/wolfcw/libfaketime) and set REDLOCK_FAKETIME_LIB=/path/to/libfaketime.so.1"
        )
    return library


def faketime_settings(library: str, spec: str) -> dict[str, str]:
    """libfaketime's settings for a server: *library* preloaded, reading its fake time from *spec*
    at every clock read, ``CLOCK_MONOTONIC`` left alone (also a container's environment)."""
    return {
        "LD_PRELOAD": library,
        "FAKETIME_TIMESTAMP_FILE": spec,
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "TZ": "UTC",  # the spec's dates are UTC
    }


def server_environment(library: str, spec: str) -> dict[str, str]:
    """The environment a local server under the nemesis starts with (ours, plus libfaketime's settings)."""
    env = dict(os.environ)
    settings = faketime_settings(library, spec)
    if preload := env.get("LD_PRELOAD"):
        settings["LD_PRELOAD"] = f"{library} {preload}"
    env.update(settings)
    return env


def _stamp(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


class NodeClock:
    """One node's wall clock (``LocalNode.clock``, ``DockerNode.clock``): step it, run it at a rate, freeze it,
    reset it.

    Each change starts from where the node's clock is now (a rate or a freeze causes no jump) and
    returns once the node's ``TIME`` shows it, so a test can act right after. :meth:`offset` says
    how far the node's clock is from ours.
    """

    def __init__(self, spec: str, node_time: Callable[[], float] | None = None) -> None:
        self.spec = spec
        self._node_time = node_time  # the node's TIME in seconds, to check a change took
        self._anchor = 0.0  # our wall time when the current setting took effect
        self._fake = 0.0  # the node's wall time then
        self.rate = 1.0
        """How fast the node's clock runs against ours (0: frozen)."""
        self.faked = False
        """A change is in force (False: the node reads the real time)."""
        self._write(REAL)

    def __repr__(self) -> str:
        return f"<NodeClock offset={self.offset():+.3f}s rate={self.rate:g}>"

    def now(self) -> float:
        """What the node's wall clock reads now (seconds since the epoch), by the settings given."""
        real = time.time()
        if not self.faked:
            return real
        return self._fake + (real - self._anchor) * self.rate

    def offset(self) -> float:
        """The node's clock minus ours, in seconds (positive: the node is ahead)."""
        return self.now() - time.time()

    def step(self, seconds: float) -> None:
        """Jump the node's clock by *seconds* (forward when positive, back when negative), keeping its rate."""
        self._set(self.now() + seconds, self.rate)

    def run_at(self, rate: float) -> None:
        """From now on, the node's clock runs *rate* times as fast as ours (2.0: twice as fast; 0.5: half)."""
        if not rate > 0:
            raise ValueError(f"rate must be above 0 (use freeze() to stop the clock), got {rate!r}")
        self._set(self.now(), rate)

    def freeze(self) -> None:
        """Stop the node's clock where it is: keys stop expiring there."""
        self._set(self.now(), 0.0)

    def reset(self) -> None:
        """Back to the real time (a jump, if the clock was off)."""
        self.faked, self.rate = False, 1.0
        self._write(REAL)
        self.settle()

    def _set(self, fake: float, rate: float) -> None:
        self.rate, self.faked = rate, True
        self._write_setting(fake)
        self.settle()

    def _write_setting(self, fake: float) -> None:
        """The spec of the clock asked for: at *fake* now, ticking at :attr:`rate`."""
        self._anchor, self._fake = time.time(), fake
        # "@<date> x<rate>" starts the clock at <date> when read, ticking at <rate>; a date alone stands still.
        self._write(_stamp(fake) if self.rate == 0 else f"@{_stamp(fake)} x{self.rate:g}")

    def rewrite(self) -> None:
        """Write the spec again for the clock as it reads now (a server about to start reads it at its start:
        without this, a restarted node's clock would begin again where the last change put it)."""
        if self.faked:
            self._write_setting(self.now())

    def _write(self, text: str) -> None:
        temporary = self.spec + ".new"
        with open(temporary, "w") as out:
            out.write(text + "\n")
        os.replace(temporary, self.spec)  # never a half-written spec

    def settle(self) -> None:
        """Wait until the node's TIME shows the setting (libfaketime reads the file at the server's next
        clock read, and a server may serve a time it read a moment ago)."""
        if self._node_time is None:
            return
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            seen = self._node_time()
            wanted = self.now()
            # The server read its clock between our two reads: allow for the time one read takes.
            if abs(seen - wanted) <= TOLERANCE * max(1.0, self.rate):
                return
            if self.faked and self.rate > 0 and 0 < (wanted - seen) / self.rate <= time.time() - self._anchor:
                # An "@<date>" spec starts at the server's first clock read after it was written: read late
                # (a busy or paused server), the node runs behind by the delay times the rate, for good.
                # Written again for the clock as it should read now: the server, awake, reads it at once.
                self._write_setting(wanted)
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the node's clock did not take the change within {SETTLE_TIMEOUT:g} s: it reads "
                    f"{seen - time.time():+.3f} s from ours, {wanted - time.time():+.3f} s was asked for "
                    "(is libfaketime preloaded? the server must start with clock=True)"
                )
            time.sleep(0.01)


def time_of(reply: object) -> float:
    """A ``TIME`` reply (redis-py parses it into (seconds, microseconds)) as seconds since the epoch."""
    assert isinstance(reply, (list, tuple)), reply
    return int(reply[0]) + int(reply[1]) / 1e6
