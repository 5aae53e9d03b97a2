"""Child processes a fleet owns (replicas and the router), started so that none can outlive the fleet.

Three guards, because a notebook can leave a fleet in every way there is:

- a ``with Fleet(...)`` block, a failed start or an interrupted cell stops everything through ``stop()``;
- every child is registered, and an ``atexit`` hook stops what is still running when the Python process ends
  (a kernel shut down or restarted cleanly);
- on Linux a child started from the main thread gets ``PR_SET_PDEATHSIG`` (SIGTERM when its parent dies), so
  even a kernel killed with SIGKILL leaves nothing behind. (Only from the main thread: the signal follows the
  *thread* that forked, and a pool thread that ends would take the child with it.)

Each child runs in its own session (process group), so a stop reaches whatever it spawned too. Output goes to
a temporary file, not a pipe: a full pipe that nobody reads would block the child.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref

import httpx

_PR_SET_PDEATHSIG = 1
_live: weakref.WeakSet[ChildProcess] = weakref.WeakSet()


class PortTakenError(OSError):
    """A port asked for explicitly is already in use on the host."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (another process could still take it before it is bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def check_port_free(port: int, host: str = "127.0.0.1", *, what: str = "a fleet process") -> int:
    """``port`` if nothing listens on it; PortTakenError naming the port (and its owner when it can tell)."""
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"a port must be an integer in [1, 65535], got {port!r}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as error:
            raise PortTakenError(f"port {port} on {host} is taken{_owner(port)}; {what} cannot listen there: "
                                 "stop what holds it, or leave the port out and a free one is chosen") from error
    return port


def _owner(port: int) -> str:
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                return f" (by pid {conn.pid}, {psutil.Process(conn.pid).name()})"
    except Exception:  # noqa: BLE001 - naming the owner is a courtesy; permissions or a race may forbid it
        pass
    return ""


def cpu_shares(count: int) -> list[list[int]]:
    """The cores this process may use, split into ``count`` disjoint shares (round-robin when there are fewer
    cores than shares: then shares overlap and say so by repeating cores)."""
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"the number of shares must be an integer >= 1, got {count!r}")
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if count >= len(cores):
        return [[cores[i % len(cores)]] for i in range(count)]
    size, extra = divmod(len(cores), count)
    shares, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        shares.append(cores[start:end])
        start = end
    return shares


# Loaded in the parent: the forked child only calls it (no dlopen between fork and exec).
_LIBC = ctypes.CDLL(None) if sys.platform.startswith("linux") else None


def _child_setup() -> None:  # runs in the forked child, before exec
    with contextlib.suppress(AttributeError, OSError):
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ChildProcess:
    """One command in its own session, on ``cpus`` (None: any), with its output kept in a temporary file."""

    def __init__(self, name: str, command: list[str], *, env: dict[str, str] | None = None,
                 cpus: list[int] | None = None):
        self.name, self.command, self.cpus = name, list(command), cpus
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.process: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in stop()

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> ChildProcess:
        main = threading.current_thread() is threading.main_thread() and sys.platform.startswith("linux")
        self.process = subprocess.Popen(self.command, env=self.env, stdin=subprocess.DEVNULL,
                                        stdout=self._log, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True, preexec_fn=_child_setup if main else None)
        _live.add(self)
        if self.cpus and hasattr(os, "sched_setaffinity"):
            # Set at once: the child is still importing, its worker threads do not exist yet and will inherit it.
            with contextlib.suppress(OSError):  # it exited already; wait_http reports why
                os.sched_setaffinity(self.process.pid, self.cpus)
        return self

    def log_tail(self, chars: int = 3000) -> str:
        if self._log.closed:
            return ""
        self._log.flush()
        self._log.seek(0)
        return self._log.read()[-chars:]

    def wait_http(self, url: str, deadline: float) -> None:
        """Wait until ``url`` answers 200; RuntimeError with the end of the log if the child exits or time runs out."""
        while True:
            if not self.alive:
                code = None if self.process is None else self.process.returncode
                raise RuntimeError(f"{self.name} exited with status {code} while starting:\n{self.log_tail()}")
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not answer {url} in time:\n{self.log_tail()}")
            time.sleep(0.1)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group (nothing if it has exited)."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM to the group, SIGKILL after ``timeout_s``; returns the exit status (None if never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.process.wait(10)
        with contextlib.suppress(ProcessLookupError):  # anything left in its group (none expected)
            os.killpg(self.process.pid, signal.SIGKILL)
        _live.discard(self)
        return self.process.returncode

    def close(self) -> None:
        self.stop()
        self._log.close()


@atexit.register
def _stop_all() -> None:
    for child in list(_live):
        with contextlib.suppress(Exception):
            child.stop(timeout_s=5.0)


def still_running(pids: set[int] | list[int]) -> set[int]:
    """The processes among ``pids`` that still run: gone ones and zombies (dead, not yet reaped by their parent)
    are not counted."""
    import psutil

    alive = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.NoSuchProcess:
            pass
    return alive
