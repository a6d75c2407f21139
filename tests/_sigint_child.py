"""A blocking-API process for tests/test_sync_sigint.py: Ctrl-C lands while ``with lock: pass`` runs round after round.

usage: python -m tests._sigint_child HOW ROUNDS URL [URL ...]

HOW is ``kill`` (a thread sends SIGINT to the process, ``os.kill``, as a terminal's Ctrl-C does),
``interrupt`` (a thread calls ``_thread.interrupt_main()``) or ``lost`` (an ``interrupt_main=True``
lock of a 50 ms ttl, extended from the first moment, whose key the parent deletes on every node again
and again: the loss lands at any moment, as ``with lock:`` enters too). Each round runs ``with lock: pass`` until the
interruption comes, at a random moment, and then prints one JSON line: what was raised, the lock
keys left on the nodes right after (read with a plain client), and whether SIGURG's handler is back.
A hang (the bug this guards against) shows as a round that never prints.

After the rounds the process prints ``{"ready": true}`` and runs ``with lock: pass`` until Ctrl-C
(the parent's SIGINT) ends it: it must exit with KeyboardInterrupt.
"""

from __future__ import annotations

import _thread
import json
import os
import random
import signal
import sys
import threading
import time

import redis

from redlock_async.sync import Lock, Redlock

NAME = "sigint"
KEY = f"redlock:{NAME}"


def keys(clients: list[redis.Redis]) -> list[int]:
    """The nodes that still have a lock key of NAME once the release's last requests landed (a release
    decides on a majority; the others' deletes may still be in flight for a moment)."""
    deadline = time.monotonic() + 5.0
    while True:
        left = [i for i, client in enumerate(clients) if client.exists(KEY)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.01)


def interrupter(how: str) -> threading.Thread:
    delay = random.uniform(0.0, 0.02)

    def run() -> None:
        if how == "lost":
            return  # the parent makes the loss
        time.sleep(delay)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGINT)
        elif how == "interrupt":
            _thread.interrupt_main()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def one_round(lock: Lock, how: str, clients: list[redis.Redis]) -> dict[str, object]:
    raised = None
    passes = 0
    thread = None
    try:
        thread = interrupter(how)  # in here: the interruption may come as it starts
        while passes < 10_000:
            with lock:
                pass
            passes += 1
    except (KeyboardInterrupt, Exception) as exc:
        raised = type(exc).__name__
    if thread is not None:
        thread.join()
    return {"raised": raised, "keys": keys(clients), "passes": passes}


def main(how: str, rounds: int, urls: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    clients = [redis.Redis.from_url(url) for url in urls]
    before = signal.getsignal(signal.SIGURG)
    lost = how == "lost"
    settings = (
        {"ttl": 0.05, "node_timeout": 0.005, "extend_threshold": 0.9, "drift_factor": 0.2} if lost else {"ttl": 5.0}
    )
    with Redlock(urls, **settings) as redlock:  # type: ignore[arg-type]
        lock = redlock.lock(NAME, interrupt_main=lost)
        for _ in range(rounds):
            row = one_round(lock, how, clients)
            row["sigurg_restored"] = signal.getsignal(signal.SIGURG) == before
            print(json.dumps(row), flush=True)
        print(json.dumps({"ready": True}), flush=True)
        while True:
            with lock:
                pass


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
