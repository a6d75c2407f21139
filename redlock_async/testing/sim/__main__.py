"""``python -m redlock_async.testing.sim``: run seeded schedules until the time is up; any violation is
printed with the command that replays it, shrunk to the fewest kinds of fault that still fail.

    python -m redlock_async.testing.sim --minutes 1                      # fresh seeds, every workload and fault
    python -m redlock_async.testing.sim --seed 42 --workload lock --trace  # replay one, with its trace
    python -m redlock_async.testing.sim --minutes 2 --set clock_guard=false --faults clock

Exit status 1 iff a violation was found (2: bad input). With ``--json`` the last line is one JSON object:
``{"schedules", "violations": [{"seed", "kind", "replay"}], "coverage", "trace_digest", "seeds", "per_core_minute",
"client_minutes_per_core_minute"}`` (the last: virtual minutes of each client's locking run per minute of CPU).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shlex
import sys
import time
from typing import Any, NoReturn

from redlock_async.testing.sim._config import FAULTS, PACES, Config
from redlock_async.testing.sim._run import Result, run
from redlock_async.testing.sim._workloads import WORKLOADS

_ORDER = ("lock", "fenced", "many", "semaphore", "rw", "election")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m redlock_async.testing.sim", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=1.0, help="how long to run fresh seeds (default 1)")
    parser.add_argument("--schedules", type=int, default=0, help="stop after this many schedules (0: no limit)")
    parser.add_argument("--seed", type=int, help="run this one seed (a replay), not fresh ones")
    parser.add_argument("--start", type=int, help="the first of the fresh seeds (default: random)")
    parser.add_argument("--workload", default="all", help=f"one of {', '.join(_ORDER)}, or all (default; by seed)")
    parser.add_argument("--faults", default="all", help=f"comma-separated among {','.join(FAULTS)}; all; none")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a Redlock setting")
    parser.add_argument("--duration", type=float, default=Config.duration, help="virtual seconds per schedule")
    parser.add_argument("--fault-rate", type=float, default=Config.fault_rate, help="faults per ttl, on average")
    parser.add_argument(
        "--jitter", type=float, default=Config.jitter, help="share of messages 10x the mean delay (default 0.02)"
    )
    parser.add_argument(
        "--lag", type=float, default=Config.lag, help="seconds more each way to two far nodes per client (default 0)"
    )
    parser.add_argument("--pace", default="", help=f"every run's pace: {', '.join(PACES)} (default: drawn per run)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--trace", action="store_true", help="print the run's trace (every command; with --seed)")
    return parser


def _refuse(text: str) -> NoReturn:
    """Bad input: say what to change, exit 2 (1 means a violation was found)."""
    _parser().error(text)


def _faults(text: str) -> frozenset[str]:
    if text == "all":
        return frozenset(FAULTS)
    if text in ("none", ""):
        return frozenset()
    kinds = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(kinds - set(FAULTS))
    if unknown:
        _refuse(f"--faults: {', '.join(unknown)} unknown; choose among {','.join(FAULTS)}, all or none")
    return kinds


def _settings(pairs: list[str]) -> tuple[tuple[str, Any], ...]:
    out = []
    for pair in pairs:
        name, eq, text = pair.partition("=")
        if not eq or not name:
            _refuse(f"--set {pair!r}: write NAME=VALUE, as --set clock_guard=false")
        value: Any
        if text.lower() in ("true", "false"):
            value = text.lower() == "true"
        else:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text
        out.append((name, value))
    return tuple(out)


def _check_settings(settings: tuple[tuple[str, Any], ...]) -> None:
    """Refuse a setting a Redlock refuses, before any run (made, never connected: nothing to close)."""
    from redlock_async import Redlock

    try:
        Redlock(["redis://check.sim:7000"], **dict(settings))
    except (TypeError, ValueError) as exc:
        _refuse(f"--set: {exc}")


def _config(args: argparse.Namespace, seed: int, faults: frozenset[str]) -> Config:
    workload = _ORDER[seed % len(_ORDER)] if args.workload == "all" else args.workload
    return Config(
        workload=workload,
        faults=faults,
        settings=_settings(args.set),
        duration=args.duration,
        fault_rate=args.fault_rate,
        jitter=args.jitter,
        lag=args.lag,
        pace=args.pace,
    )


def replay_command(config: Config, seed: int) -> str:
    words = ["python", "-m", "redlock_async.testing.sim", "--seed", str(seed), "--workload", config.workload]
    words += ["--faults", ",".join(kind for kind in FAULTS if kind in config.faults) or "none"]
    for name, value in config.settings:
        words += ["--set", f"{name}={value}"]
    if config.duration != Config.duration:
        words += ["--duration", f"{config.duration:g}"]
    if config.fault_rate != Config.fault_rate:
        words += ["--fault-rate", f"{config.fault_rate:g}"]
    if config.jitter != Config.jitter:
        words += ["--jitter", f"{config.jitter:g}"]
    if config.pace:
        words += ["--pace", config.pace]
    if config.lag != Config.lag:
        words += ["--lag", f"{config.lag:g}"]
    return shlex.join([*words, "--trace"])


def shrink(config: Config, seed: int, kind: str) -> Config:
    """The fewest kinds of fault under which *seed* still shows a violation of *kind*."""
    for fault in FAULTS:
        if fault not in config.faults:
            continue
        fewer = Config(**{**config.__dict__, "faults": config.faults - {fault}})
        if any(found == kind for found, _ in run(seed, fewer).violations):
            config = fewer
    return config


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.workload != "all" and args.workload not in WORKLOADS:
        _refuse(f"--workload {args.workload!r}: choose one of {', '.join(_ORDER)}, or all")
    if not 0.0 <= args.jitter <= 1.0:
        _refuse(f"--jitter {args.jitter:g}: a share of the messages, from 0 to 1 (as 0.3)")
    if args.pace not in ("", *PACES):
        _refuse(f"--pace {args.pace!r}: choose one of {', '.join(PACES)}")
    if args.lag < 0:
        _refuse(f"--lag {args.lag:g}: seconds, 0 or more (as 0.005)")
    faults = _faults(args.faults)
    _check_settings(_settings(args.set))
    violations: list[dict[str, Any]] = []
    coverage: dict[str, int] = {}
    schedules = 0
    digest = ""
    started = time.process_time()
    if args.seed is not None:
        seeds: Any = [args.seed]
        first = args.seed
    else:
        first = args.start if args.start is not None else random.SystemRandom().randrange(2**31)
        seeds = _count(first)
        print(f"seeds from {first} (replay any with --seed)", flush=True)
    deadline = time.monotonic() + args.minutes * 60
    last = first
    for seed in seeds:
        if args.seed is None and (time.monotonic() >= deadline or (args.schedules and schedules >= args.schedules)):
            break
        config = _config(args, seed, faults)
        result = run(seed, config, verbose=args.trace and args.seed is not None)
        schedules += 1
        last = seed
        digest = result.digest
        for name, count in result.coverage.items():
            coverage[name] = coverage.get(name, 0) + count
        if args.trace and args.seed is not None:
            print("\n".join(result.trace))
        if result.violations:
            _report(result, config, violations)
    cpu = max(time.process_time() - started, 1e-9)
    covered = coverage.get("client_seconds", 0) / cpu  # virtual client-minutes per core-minute
    print(
        f"{schedules} schedules (seeds {first}..{last}) in {cpu:.1f} s of CPU: "
        f"{schedules * 60 / cpu:.0f} per core-minute, {covered:.0f} virtual client-minutes of locking per "
        f"core-minute; {len(violations)} violation(s)",
        flush=True,
    )
    if args.json:
        summary = {
            "schedules": schedules,
            "violations": violations,
            "coverage": coverage,
            "trace_digest": digest if args.seed is not None else "",
            "seeds": [first, last],
            "per_core_minute": round(schedules * 60 / cpu),
            "client_minutes_per_core_minute": round(covered, 1),
        }
        print(json.dumps(summary, sort_keys=True))
    return 1 if violations else 0


def _count(first: int) -> Any:
    seed = first
    while True:
        yield seed
        seed += 1


def _report(result: Result, config: Config, violations: list[dict[str, Any]]) -> None:
    kind, text = result.violations[0]
    small = shrink(config, result.seed, kind) if config.faults else config
    replay = replay_command(small, result.seed)
    violations.append({"seed": result.seed, "kind": kind, "replay": replay})
    print(f"VIOLATION seed {result.seed} ({config.workload}): {kind}: {text}", flush=True)
    print(f"  replay: {replay}", flush=True)
    for line in result.trace[-12:]:
        print(f"    {line}")


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != "0":
        # One seed, one run, in any process: sets of bytes iterate by hash, which the seed must fix too.
        os.execve(sys.executable, [sys.executable, "-m", "redlock_async.testing.sim", *sys.argv[1:]],
                  {**os.environ, "PYTHONHASHSEED": "0"})  # fmt: skip
    sys.exit(main())
