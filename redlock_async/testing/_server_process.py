"""One local node's server process, across its restarts: spawned, awaited, paused, stopped; its temp dir.

:class:`_servers.LocalNode` decides what to run (the command line, the port, the clock) and
when; this keeps the process itself: registered so an interrupted run leaks nothing
(``_process.py``, the reaper), probed until it answers, frozen and thawed with signals, and the
tail of its output for error messages.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time

from redlock_async._core import reaper as _reaper
from redlock_async.testing._process import (
    ADDR_IN_USE,
    DBFILENAME,
    LOG_NAME,
    LOG_TAIL_LINES,
    OUT_NAME,
    PID_RE,
    PROBE_INTERVAL,
    START_TIMEOUT,
    STOP_TIMEOUT,
    PortInUse,
    control_socket,
    kill_proc,
    live_dirs,
    live_procs,
    probe,
    registry_lock,
    resp,
    wait_stopped,
)

Address = tuple[str, int] | str
"""Where the harness talks to a server in plain text: (host, port) or a unix socket's path."""


class ServerProcess:
    """The process of one node (none before the first start, or once stopped) and its temp dir."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir: str | None = None
        """The node's temp dir (RDB file, server log, unix socket), or None before it is needed."""
        self._paused = False
        self._log_offset = 0
        self._out_offset = 0

    @property
    def running(self) -> bool:
        """Whether the process is alive; a paused process counts as running."""
        alive = self.proc is not None and self.proc.poll() is None
        if not alive:
            self._paused = False
        return alive

    @property
    def paused(self) -> bool:
        return self.running and self._paused

    def require_running(self, who: str) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"{who} is not running")
        return self.proc

    def ensure_dir(self) -> str:
        if self.dir is None or not os.path.isdir(self.dir):
            self.dir = tempfile.mkdtemp(prefix="redlock-node-")
            with registry_lock:
                live_dirs.add(self.dir)
            _reaper.watch_dir(self.dir)  # removed even if this process is killed
        return self.dir

    def remove_dir(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            with registry_lock:
                live_dirs.discard(self.dir)
            _reaper.forget_dir(self.dir)
            self.dir = None

    def spawn(self, argv: list[str], env: dict[str, str] | None) -> None:
        """Launch *argv*, its output appended to the dir's files (read from here on by :meth:`log_tail`)."""
        directory = self.ensure_dir()
        log = os.path.join(directory, LOG_NAME)
        out = os.path.join(directory, OUT_NAME)
        self._log_offset = _size(log)
        self._out_offset = _size(out)
        # Same process group as us on purpose: a signal sent to the whole test run's group
        # (Ctrl-C, CI cancellation) reaches the servers even if our atexit hook never runs.
        with open(out, "ab") as sink:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, env=env)
        self.proc = proc
        self._paused = False
        with registry_lock:
            live_procs.add(proc)
        # Dies with this process, however it ends (SIGTERM, SIGKILL): atexit alone does not run then.
        _reaper.watch_pid(proc.pid)

    def await_ready(self, port: int, address: Address, password: str | None) -> None:
        """Return once the spawned server answers PING as itself; raise PortInUse when it could not bind."""
        proc = self.proc
        assert proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        last_error = "no answer"
        while True:
            code = proc.poll()
            if code is not None:
                tail = self.log_tail()
                if any(marker in tail for marker in ADDR_IN_USE):
                    raise PortInUse
                raise RuntimeError(f"{self.binary} exited with code {code} before answering PING on port {port}{tail}")
            try:
                pong, info = probe(address, timeout=0.25, password=password)
            except OSError as exc:
                last_error = repr(exc)
            else:
                match = PID_RE.search(info)
                # Another server on this port answers too, until ours fails to bind.
                if pong.startswith(b"+PONG") and match and int(match[1]) == proc.pid:
                    return
                last_error = f"reply {pong.strip()!r}"
            if time.monotonic() >= deadline:
                self.kill()
                raise RuntimeError(
                    f"{self.binary} did not answer PING on port {port} within "
                    f"{START_TIMEOUT:g} s (last: {last_error}){self.log_tail()}"
                )
            time.sleep(PROBE_INTERVAL)

    def pause(self, who: str) -> None:
        """SIGSTOP, and wait until the process is stopped."""
        proc = self.require_running(who)
        proc.send_signal(signal.SIGSTOP)
        self._paused = True
        wait_stopped(proc.pid, stopped=True)

    def resume(self) -> None:
        """SIGCONT a paused process; no-op if not paused."""
        if self.proc is not None and self._paused and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            wait_stopped(self.proc.pid, stopped=False)
        self._paused = False

    def kill(self) -> None:
        """SIGKILL and reap; no-op without a process."""
        if self.proc is not None:
            kill_proc(self.proc)
            self.forget()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time. Idempotent."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            self.resume()
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                kill_proc(proc)
        self.forget()

    def shutdown_save(self, who: str, address: Address, password: str | None) -> None:
        """SHUTDOWN SAVE: the server writes its RDB file and exits."""
        proc = self.require_running(who)
        self.resume()
        reply = b""
        try:
            with control_socket(address, STOP_TIMEOUT, password) as sock:
                sock.sendall(resp("SHUTDOWN", "SAVE"))
                # On success the server closes the connection without replying.
                with contextlib.suppress(ConnectionResetError):
                    reply = sock.recv(4096)
        except OSError as exc:
            raise RuntimeError(f"SHUTDOWN SAVE failed on {who}: {exc!r}") from exc
        if reply.startswith(b"-"):
            raise RuntimeError(f"SHUTDOWN SAVE refused by {who}: {reply.strip()!r}")
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"{who} did not exit after SHUTDOWN SAVE") from None
        self.forget()
        if self.dir is None or not os.path.isfile(os.path.join(self.dir, DBFILENAME)):
            raise RuntimeError(f"{who} wrote no RDB file on SHUTDOWN SAVE")

    def remove_rdb(self) -> None:
        if self.dir is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.dir, DBFILENAME))

    def forget(self) -> None:
        """The process is gone: unregister it."""
        if self.proc is not None:
            with registry_lock:
                live_procs.discard(self.proc)
            _reaper.forget_pid(self.proc.pid)
        self.proc = None
        self._paused = False

    def log_tail(self) -> str:
        """The last lines the server wrote since its last launch, for an error message ("" when none)."""
        if self.dir is None:
            return ""
        lines: list[str] = []
        for name, offset in ((OUT_NAME, self._out_offset), (LOG_NAME, self._log_offset)):
            try:
                with open(os.path.join(self.dir, name), "rb") as fh:
                    fh.seek(offset)
                    text = fh.read().decode(errors="replace")
            except OSError:
                continue
            lines.extend(line for line in text.splitlines() if line.strip())
        if not lines:
            return ""
        return "\nserver output:\n" + "\n".join(lines[-LOG_TAIL_LINES:])


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
