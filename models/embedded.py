"""The embedded MongoDB-compatible server (nx-27017) as a child process.

Why a child process and not a library: the relay talks to it with the same
driver and wire protocol it uses for a real MongoDB, so there is one code path.

Lifecycle guarantees:
- the child dies with the relay: PR_SET_PDEATHSIG delivers SIGTERM to it when
  the relay exits for any reason, kill -9 included;
- the data lives under <data_dir>/db and is reused by the next start;
- a pid file left behind by a crash never blocks a start: a live orphan of
  ours is stopped, anything else is treated as stale and removed.  This
  runs only while the relay holds the data directory's lock
  (models/datadir.py), so a database found running there has lost its relay:
  a second relay on the same directory is refused before it gets here.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time

log = logging.getLogger("relay.embedded")

_PR_SET_PDEATHSIG = 1
_NX_SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nx_server.py")


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: fall back to the pid-file sweep at start
        pass
    # Own process group, so a Ctrl-C in the terminal reaches the relay, which
    # then stops the database in order instead of both racing.
    os.setpgrp()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def secantus_command(storage: str, port: int) -> list[str]:
    """SecantusDB as a separate process (GPL-2.0: run, never imported)."""
    # Its console script may not be on PATH (a .venv not activated).
    return [sys.executable, "-c", "from secantus.cli import main; main()", "--host", "127.0.0.1",
            "--port", str(port), "--storage-path", storage, "--log-level", "WARNING"]


class EmbeddedMongo:
    """One server process on <data_dir>/db.  `read_only`: the second
    process, on the same files, that answers the console's reports
    (models/nx_server.py explains why; models/store.py starts both)."""

    def __init__(self, data_dir: str, read_only: bool = False):
        self.dir = os.path.abspath(os.path.join(data_dir, "db"))
        self.read_only = read_only
        name = "nx-27017-reports" if read_only else "nx-27017"
        self.pid_file = os.path.join(self.dir, f"{name}.pid")
        self.log_file = os.path.join(self.dir, f"{name}.log")
        self.proc: subprocess.Popen | None = None
        self._terminated = False
        self.port = 0

    @property
    def url(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def _clear_stale(self) -> None:
        if not os.path.exists(self.pid_file):
            return
        try:
            pid = int(open(self.pid_file).read().strip() or 0)
        except (OSError, ValueError):
            pid = 0
        cmd = _cmdline(pid) if pid else ""
        if pid and "nx" in cmd and self.dir in cmd:
            log.warning("stopping orphaned embedded database (pid %s)", pid)
            try:
                os.kill(pid, signal.SIGTERM)
                for _ in range(50):
                    time.sleep(0.1)
                    if not _cmdline(pid):
                        break
                else:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.remove(self.pid_file)
        except FileNotFoundError:
            pass

    def start(self, timeout: float = 20.0) -> str:
        os.makedirs(self.dir, exist_ok=True)
        self._clear_stale()
        self.port = _free_port()
        # models/nx_server.py, run by path: its folder must not shadow the
        # standard library (models/secrets.py) in the child.
        cmd = [sys.executable, "-c", f"import runpy; runpy.run_path({_NX_SERVER!r}, "
               "run_name='__main__')",
               "--data-dir", self.dir, "--host", "127.0.0.1", "--port", str(self.port),
               "--pid-file", self.pid_file, "--log-file", self.log_file]
        if self.read_only:
            cmd.append("--read-only")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"embedded database exited with {self.proc.returncode}; "
                                   f"see {self.log_file}")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return self.url
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("embedded database did not start in time")

    def terminate(self) -> None:
        """Ask it to stop, without waiting (stop() waits): two servers
        stop side by side, not one after the other."""
        if self.proc is not None and self.proc.poll() is None and not self._terminated:
            self._terminated = True
            self.proc.terminate()

    def stop(self, timeout: float = 10.0) -> None:
        self.terminate()
        proc, self.proc = self.proc, None
        self._terminated = False
        if proc is None:
            return
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
