"""The safety report's command (benchmarks/safety.py) keeps working: one short scenario of each kind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # seconds each: the developer loop (-m 'not slow') leaves them out

ROOT = Path(__file__).resolve().parent.parent


def report(only: str) -> list[str]:
    """The table rows of the scenarios named like *only* (--only prints instead of writing docs/safety.md)."""
    done = subprocess.run(
        [sys.executable, "benchmarks/safety.py", "--seconds", "1.5", "--only", only],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if line.startswith(f"| {only}")]


def test_safety_report_runs_and_its_checker_sees_the_hazard() -> None:
    rows = report("analysis")
    assert len(rows) == 2
    off, on = (row.split("|") for row in rows)
    assert off[2].strip() == "hazard"
    assert int(off[5]) > 0  # overlaps found with the quarantine off
    assert on[2].strip() == "safe"
    assert int(on[5]) == 0
    assert all(row.rstrip(" |").endswith("pass") for row in rows)


def test_safety_report_runs_a_primitive_and_checks_it_against_its_bound() -> None:
    # A semaphore of limit 2 under minority pauses: permits granted, never more than 2 inside, no key left.
    (line,) = report("semaphore (limit 2): minority paused")
    row = line.split("|")
    assert row[2].strip() == "safe"
    assert int(row[4]) > 0  # permits were granted
    assert int(row[5]) == 0  # never more than the limit inside
    assert int(row[7]) == 0  # no permit left on any node
    assert row[8].strip() == "pass"
