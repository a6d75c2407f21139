"""Processes and directories that must not outlive this process, however it ends.

``atexit`` does not run on SIGTERM's default action nor on SIGKILL, and
``PR_SET_PDEATHSIG`` follows the thread that forked, not the process. So a
small reaper process watches a pipe from us: when our end closes (we exited
or were killed, SIGKILL included), it kills the process groups and processes
we named and removes the directories, then exits. It runs in a session of
its own, so a signal sent to our process group (Ctrl-C) does not take it
down before it has done its work.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading

_SCRIPT = r"""
import os, shutil, signal, sys
groups, pids, dirs = set(), set(), set()
for line in sys.stdin:
    verb, _, arg = line.rstrip("\n").partition(" ")
    target = {"group": groups, "pid": pids, "dir": dirs}.get(verb.lstrip("-"))
    if target is None:
        continue
    value = arg if verb.lstrip("-") == "dir" else int(arg)
    (target.discard if verb.startswith("-") else target.add)(value)
for kill, ids in ((os.killpg, groups), (os.kill, pids)):
    for i in ids:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                kill(i, sig)
            except OSError:
                pass
for path in dirs:
    shutil.rmtree(path, ignore_errors=True)
"""

_lock = threading.Lock()
_reaper: subprocess.Popen[bytes] | None = None
_owner = 0  # the pid that started it: a forked child must start its own


def _started() -> subprocess.Popen[bytes]:
    """The reaper of this process, started if need be (call with _lock held)."""
    global _reaper, _owner
    if _reaper is None or _owner != os.getpid() or _reaper.poll() is not None:
        _reaper = subprocess.Popen(
            [sys.executable, "-c", _SCRIPT],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _owner = os.getpid()
    return _reaper


def _tell(line: str) -> None:
    with _lock:
        reaper = _started()
        assert reaper.stdin is not None
        reaper.stdin.write(line.encode() + b"\n")
        reaper.stdin.flush()


def pipe() -> int:
    """The reaper's pipe (started if need be), for a child to name its own group on before it runs
    (:func:`watch_own_group`): a command killed with this process in the moment it starts is ended too."""
    with _lock:
        reaper = _started()
        assert reaper.stdin is not None
        reaper.stdin.flush()
        return reaper.stdin.fileno()


def watch_own_group(fd: int) -> None:
    """In a child, before exec (its process group its own): have the reaper kill its group if this process
    ends before :func:`forget_group`. One short write, atomic on a pipe; then the child's copy is closed."""
    os.write(fd, b"group %d\n" % os.getpgid(0))
    os.close(fd)


def watch_group(pgid: int) -> None:
    """Kill process group *pgid* (SIGKILL) if this process ends before :func:`forget_group`."""
    _tell(f"group {pgid}")


def forget_group(pgid: int) -> None:
    _tell(f"-group {pgid}")


def watch_pid(pid: int) -> None:
    """Kill process *pid* (SIGKILL) if this process ends before :func:`forget_pid`."""
    _tell(f"pid {pid}")


def forget_pid(pid: int) -> None:
    _tell(f"-pid {pid}")


def watch_dir(path: str) -> None:
    """Remove directory *path* if this process ends before :func:`forget_dir`."""
    if "\n" not in path:
        _tell(f"dir {path}")


def forget_dir(path: str) -> None:
    if "\n" not in path:
        _tell(f"-dir {path}")


def _close() -> None:
    """At a normal exit: let the reaper finish now (what is still named goes), and wait for it."""
    with _lock:
        reaper = _reaper
        if reaper is None or _owner != os.getpid():
            return
        if reaper.stdin is not None:
            reaper.stdin.close()
    try:
        reaper.wait(timeout=10)
    except subprocess.TimeoutExpired:
        reaper.kill()


atexit.register(_close)
