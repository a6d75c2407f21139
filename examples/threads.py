"""Plain threads sharing one resource through the blocking API: no two ever inside at once.

Eight threads, each with its own lock on the same name, take turns on a shared counter that a
race would corrupt (read, pause, write). One background loop thread runs every lock's I/O and
watchdog; each ``with lock:`` blocks only its own thread.

Runs against the nodes in $REDLOCK_NODES (comma-separated URLs), or against 5 embedded
valkey-server nodes when it is unset::

    python examples/threads.py
"""

from __future__ import annotations

import threading
import time

from redlock_async.sync import Redlock
from redlock_async.testing import nodes_from_env

THREADS = 8
ROUNDS = 5


def main() -> None:
    counter = {"value": 0}
    with nodes_from_env() as urls, Redlock(urls) as redlock:

        def worker(index: int) -> None:
            lock = redlock.lock("shared-counter")  # one lock per thread, on the same name
            for _ in range(ROUNDS):
                with lock:
                    value = counter["value"]
                    time.sleep(0.001)  # a race here would lose increments
                    counter["value"] = value + 1

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    print(f"{THREADS} threads x {ROUNDS} rounds: counter = {counter['value']} (expected {THREADS * ROUNDS})")


if __name__ == "__main__":
    main()
