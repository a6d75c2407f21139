"""A blocking-API process for tests/test_sync_sigint.py: Ctrl-C lands while ``with lock: pass`` runs round after round.

usage: python -m tests._sigint_child HOW ROUNDS URL [URL ...]

HOW is ``kill`` (a thread sends SIGINT to the process, ``os.kill``, as a terminal's Ctrl-C does),
``interrupt`` (a thread calls ``_thread.interrupt_main()``) or ``lost`` (an ``interrupt_main=True``
lock whose Redlock a thread closes: its holder is told LockLost, at any moment, as ``with lock:``
enters too; each round then has a Redlock of its own). Each round runs ``with lock: pass`` until the
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
    """The nodes that still have a lock key of NAME."""
    return [i for i, client in enumerate(clients) if client.exists(KEY)]


def interrupter(how: str, redlock: Redlock) -> threading.Thread:
    delay = random.uniform(0.0, 0.02)

    def run() -> None:
        time.sleep(delay)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGINT)
        elif how == "interrupt":
            _thread.interrupt_main()
        else:
            redlock.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def one_round(redlock: Redlock, lock: Lock, how: str, clients: list[redis.Redis]) -> dict[str, object]:
    thread = interrupter(how, redlock)
    raised = None
    passes = 0
    try:
        while passes < 10_000:
            with lock:
                pass
            passes += 1
    except (KeyboardInterrupt, Exception) as exc:
        raised = type(exc).__name__
    thread.join()
    return {"raised": raised, "keys": keys(clients), "passes": passes}


def main(how: str, rounds: int, urls: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    clients = [redis.Redis.from_url(url) for url in urls]
    before = signal.getsignal(signal.SIGURG)
    with Redlock(urls, ttl=5.0) as redlock:
        lock = redlock.lock(NAME)
        for _ in range(rounds):
            if how == "lost":
                with Redlock(urls, ttl=5.0) as closed:
                    row = one_round(closed, closed.lock(NAME, interrupt_main=True), how, clients)
            else:
                row = one_round(redlock, lock, how, clients)
            row["sigurg_restored"] = signal.getsignal(signal.SIGURG) == before
            print(json.dumps(row), flush=True)
        print(json.dumps({"ready": True}), flush=True)
        while True:
            with lock:
                pass


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
