"""The simulator: its virtual loop, the library running on it against simulated nodes, the oracles, and
replay (one seed, one run)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shlex
import subprocess
import sys

import pytest

from redlock_async import LockLost, Redlock
from redlock_async.testing._history import History, Section
from redlock_async.testing.sim import Config, MemoryNodes, run
from redlock_async.testing.sim import __main__ as sim_command
from redlock_async.testing.sim._config import FAULTS, WORKLOAD_NAMES
from redlock_async.testing.sim._loop import SimLoop
from redlock_async.testing.sim._net import Network
from redlock_async.testing.sim._node import SimNode
from redlock_async.testing.sim._workloads import WORKLOADS, Board

ALL = frozenset(FAULTS)


def test_virtual_time_jumps_and_a_paused_client_runs_nothing_until_resumed() -> None:
    loop = SimLoop(random.Random(0), lateness=0.0, yield_chance=0.0)
    client = loop.client("c")
    ran: list[float] = []

    async def ticker() -> None:
        for _ in range(3):
            await asyncio.sleep(10.0)
            ran.append(loop.time())

    async def main() -> None:
        task = loop.start(client, ticker())
        await asyncio.sleep(15.0)
        client.pause()
        await asyncio.sleep(20.0)  # its timer at 20 s comes due, held
        assert ran == [10.0]
        client.resume()
        await task

    loop.run_until_complete(main())
    loop.close()
    assert ran == [10.0, 35.0, 45.0]  # (a day of timers would take no longer: nothing sleeps)


def test_a_killed_client_never_runs_again() -> None:
    loop = SimLoop(random.Random(0))
    client = loop.client("c")
    ran: list[int] = []

    async def worker() -> None:
        await asyncio.sleep(1.0)
        ran.append(1)

    async def main() -> None:
        loop.start(client, worker())
        await asyncio.sleep(0.5)
        client.kill()
        await asyncio.sleep(5.0)

    loop.run_until_complete(main())
    assert ran == []
    loop.close()


def test_the_unmodified_library_holds_a_lock_on_simulated_nodes() -> None:
    loop = SimLoop(random.Random(1))
    network = Network(loop)
    nodes = [SimNode(f"n{i}", loop.time, random.Random(i)) for i in range(3)]
    for i, node in enumerate(nodes):
        network.add(f"n{i}.sim", 7000 + i, node)
    client = loop.client("c")

    async def work() -> tuple[bool, int | None]:
        async with Redlock([f"redis://n{i}.sim:{7000 + i}" for i in range(3)], ttl=1.0) as redlock:
            lock = redlock.lock("x", fencing=True)
            async with lock:
                held = [node.store.get(b"redlock:x") for node in nodes]
                await asyncio.sleep(5.0)  # five ttls: the watchdog extends it all along
                return all(value is not None for value in held) and lock.held, lock.fencing_token

    async def main() -> tuple[bool, int | None]:
        result: tuple[bool, int | None] = await loop.start(client, work())
        return result

    held, fencing_token = loop.run_until_complete(main())
    loop.close()
    assert held
    assert fencing_token == 1
    assert all(node.store.get(b"redlock:x") is None for node in nodes)  # released


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_one_seed_one_run(workload: str) -> None:
    """Two runs of a seed, every fault on, give the same trace; another seed another one."""
    config = Config(workload=workload, faults=ALL, duration=3.0)
    first, again, other = run(7, config), run(7, config), run(8, config)
    assert first.digest == again.digest
    assert first.trace == again.trace
    assert first.digest != other.digest
    assert first.coverage["sections"] > 0
    assert not first.violations, first.violations


def test_a_planted_hole_is_found_and_replays() -> None:
    """Without the clock guard, a node whose clock jumps a ttl ahead lets a second holder in: the
    simulator finds it, and the seed replays to the same violation."""
    config = Config(faults=frozenset({"clock"}), settings=(("clock_guard", False),), duration=4.0, fault_rate=8.0)
    found = next((result for seed in range(60) if (result := run(seed, config)).violations), None)
    assert found is not None, "no two holders in 60 schedules without the clock guard"
    assert found.violations[0][0] == "two_holders"
    again = run(found.seed, config)
    assert again.violations == found.violations
    assert again.digest == found.digest
    guarded = run(found.seed, Config(faults=frozenset({"clock"}), duration=4.0, fault_rate=8.0))
    assert not guarded.violations, guarded.violations  # the clock guard keeps the same schedule safe


def _cli(*args: str) -> tuple[int, dict[str, object], str]:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "redlock_async.testing.sim", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1]), done.stdout


def test_the_command_finds_replays_and_says_how() -> None:
    """The CLI on a seed the planted hole fails: exit 1, a replay command that fails the same way, with
    the same digest run after run; a clean campaign exits 0."""
    config = Config(faults=frozenset({"clock"}), settings=(("clock_guard", False),), duration=4.0, fault_rate=8.0)
    seed = next(seed for seed in range(60) if run(seed, config).violations)
    status, summary, out = _cli(
        "--seed", str(seed), "--workload", "lock", "--faults", "clock", "--set", "clock_guard=false",
        "--duration", "4", "--fault-rate", "8",
    )  # fmt: skip
    assert status == 1, out
    violations = summary["violations"]
    assert isinstance(violations, list)
    assert violations[0]["kind"] == "two_holders"
    replay = shlex.split(violations[0]["replay"])
    assert replay[:3] == ["python", "-m", "redlock_async.testing.sim"]
    again, summary_again, _ = _cli(*replay[3:])
    assert again == 1
    assert summary_again["trace_digest"] == summary["trace_digest"] != ""
    clean, campaign, out = _cli("--minutes", "5", "--schedules", "6", "--start", "100")
    assert clean == 0, out
    assert campaign["schedules"] == 6
    assert campaign["seeds"] == [100, 105]
    assert campaign["violations"] == []


def test_memory_nodes_run_a_users_lock_code_in_virtual_time() -> None:
    """A user's test: a holder whose majority stops answering loses its lock (LockLost), with no server,
    and a minute of ttl costs nothing."""
    with MemoryNodes(5) as nodes:

        async def main() -> tuple[str, float]:
            async with Redlock(nodes.urls, ttl=60.0) as redlock:
                lock = redlock.lock("orders:42", fencing=True)
                started = asyncio.get_running_loop().time()
                try:
                    async with lock:
                        assert lock.fencing_token == 1
                        for i in range(3):
                            nodes[i].pause()
                        await asyncio.sleep(600.0)
                except LockLost:
                    for i in range(3):
                        nodes[i].resume()
                    return "lost", asyncio.get_running_loop().time() - started
                return "kept", 0.0

        outcome, after = nodes.run(main())
        assert outcome == "lost"
        assert 0 < after < 60.0  # lost before its ttl ran out, not at the end of the 600 s
        assert nodes[3].command("GET", "redlock:orders:42") is None  # released where it could be


def test_every_workload_named() -> None:
    assert tuple(WORKLOADS) == WORKLOAD_NAMES


def test_the_oracles_judge_a_history() -> None:
    """Two holders at once, a token that did not grow, and a wait that ran out while the lock was free
    (with no fault) are each a violation; a clean history is none."""
    loop = SimLoop(random.Random(0))
    board = Board(loop, Config(), [])
    board.histories["res"] = History()
    sections = board.histories["res"].sections
    sections += [Section("c0", "t0", 1, 0.0, 1.0), Section("c1", "t1", 2, 1.0, 1.5)]
    board.gave_up.append((("res",), 1.2, 2.0))  # free from 1.5 to 2.0: less than two ttls
    board.check()
    assert board.violations == []
    sections.append(Section("c2", "t2", 2, 1.4, 1.6))
    board.gave_up.append((("res",), 1.0, 9.0))  # free from 1.6 to 9.0
    board.check()
    assert [kind for kind, _ in board.violations] == ["starved", "two_holders", "fencing"]
    loop.close()


def test_the_terms_oracle_and_the_starvation_oracle_under_flushes() -> None:
    """An observer shown a leader with another candidate's term is a violation (its own term is none);
    a wait that ran out while the lock was free is judged under SCRIPT FLUSH faults too, not others."""
    loop = SimLoop(random.Random(0))
    board = Board(loop, Config(workload="election"), [])
    board.terms.update({4: "c0-0", 5: "c1-0"})
    board.observed += [("c0-0", 4, 1.0), ("c1-0", 5, 2.0), ("c1-1", None, 2.5), ("c2-0", 9, 3.0)]
    board.check()
    assert board.violations == []
    board.observed.append(("c1-0", 4, 2.1))
    board.check()
    assert [kind for kind, _ in board.violations] == ["observed_term"]
    for faults, expected in ((frozenset({"flush"}), ["starved"]), (frozenset({"flush", "pause"}), [])):
        board = Board(loop, Config(faults=faults), [])
        board.histories["res"] = History()
        board.gave_up.append((("res",), 1.0, 9.0))
        board.check()
        assert [kind for kind, _ in board.violations] == expected
    loop.close()


BAD_INPUT = (
    (["--set", "clockguard=false"], "clockguard"),
    (["--set", "ttl=-1"], "ttl must be > 0"),
    (["--faults", "bogus"], "choose among pause,partition"),
    (["--workload", "nope"], "choose one of lock"),
    (["--pace", "fast"], "choose one of normal, short, long"),
    (["--lag", "-1"], "seconds, 0 or more"),
    (["--jitter", "2"], "a share of the messages, from 0 to 1"),
)


def test_the_command_refuses_bad_input_with_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    # Each refusal in process (the command's main(), as `python -m` runs it: argparse's exit 2 and its
    # stderr), and one as a process of its own, whose exit status is the one a shell sees.
    for args, words in BAD_INPUT:
        with pytest.raises(SystemExit) as exited:
            sim_command.main(["--seed", "1", *args])
        assert exited.value.code == 2, args
        assert words in capsys.readouterr().err, args
    args, words = BAD_INPUT[-1]
    done = subprocess.run(
        [sys.executable, "-m", "redlock_async.testing.sim", "--seed", "1", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": "0"},  # else the command starts itself again to set it
    )
    assert done.returncode == 2, (args, done.stderr)
    assert words in done.stderr
