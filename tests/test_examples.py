"""Every example in examples/ runs, and does what it says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # seconds each: the developer loop (-m 'not slow') leaves them out

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_basic_example_runs_one_worker_per_order() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "basic.py")], capture_output=True, text=True, timeout=60, check=True
    )
    lines = result.stdout.splitlines()
    assert sum("processes order 1" in line for line in lines) == 1
    assert sum("skips order 1" in line for line in lines) == 1
    assert "b processes order 2" in lines


def test_demo_command_reports_no_overlap() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "redlock_async", "demo", "--workers", "3", "--rounds", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "6 critical sections, 0 overlapping" in result.stdout
    assert "acquire with 2 nodes down: True" in result.stdout
    # 3 of 5 paused: not contention, so the demo shows NodesUnavailable (a LockNotAcquired).
    assert "client    NodesUnavailable: could not acquire lock 'demo:printer'" in result.stdout
    assert re.search(r"nodes unavailable: [0-2] of 5 nodes answered", result.stdout)  # 2 unless under load
