"""The sidecar process as its collector sees it: spawned, awaited, watched, restarted, waited for.

`redisync.collector.sidecar.SidecarWorker` exchanges reports and fleet states with the sidecar
through the mailbox; this module keeps the process alive. A sidecar that dies or hangs (its
heartbeat in the mailbox stops) is restarted by a monitor thread, after a growing pause when it
dies again at once; the collector only sees its view go stale meanwhile. The sidecar exits when its
collector is gone: it reads a pipe (the lifeline) whose write end only the collector holds.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .mailbox import HEARTBEAT_MS, SIDECAR_PID, Mailbox
from .worker import Problems

log = logging.getLogger(__name__)

CHECK_EVERY_S = 0.25  # how often the collector checks that its sidecar lives
HUNG_AFTER_S = 10.0  # a serving sidecar whose loop stopped this long is killed and restarted
MAX_BACKOFF_S = 5.0
STARTUP_S = 10.0  # how long start() waits for the sidecar to serve (then the collector goes on without it)
START_DEADLINE_S = 120.0  # a sidecar still starting (importing, on a loaded machine) after this is killed


class Supervisor:
    """One collector's sidecar process (see the module).

    ``config(lifeline)`` is what a new sidecar is told (its lifeline's read end included); before a
    restart, ``on_restart()`` (the worker counts it and keeps the dead sidecar's counters); at every
    check, ``on_check()`` (the worker's retries of what the start could not read). What crosses
    threads: ``process`` and the lifeline, replaced by the monitor (a restart), or by the collector's
    stop once the monitor has ended (`end_watch`); ``mailbox``, None once the collector closed it."""

    def __init__(
        self,
        mailbox: Mailbox,
        config: Callable[[int], dict[str, Any]],
        problems: Problems,
        name: str,
        *,
        on_restart: Callable[[], None],
        on_check: Callable[[], None],
    ):
        self.mailbox: Mailbox | None = mailbox
        self.config, self.problems, self.name = config, problems, name
        self.on_restart, self.on_check = on_restart, on_check
        self.process: subprocess.Popen[bytes] | None = None
        self._lifeline = -1  # the write end of the pipe the sidecar reads: closed (by us or by our death), it exits
        self._monitor: threading.Thread | None = None
        self._stopping = threading.Event()
        self._spawned = 0.0  # (monotonic) when the current sidecar was started: its start deadline counts from it

    @property
    def pid(self) -> int | None:
        """The sidecar process's pid (None before it starts)."""
        return self.process.pid if self.process is not None else None

    def spawn(self) -> None:
        """Start a sidecar process, told its configuration through its stdin."""
        box = self.mailbox
        assert box is not None
        read_end, write_end = os.pipe()
        config = self.config(read_end)
        box.header[SIDECAR_PID] = 0
        box.header[HEARTBEAT_MS] = int(time.monotonic() * 1e3)
        # the sidecar imports redisync from wherever this process does (a source tree on sys.path included)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(_import_path()))
        try:
            process = subprocess.Popen(
                # -c, not -m: the package imports this module, and -m would run a second copy as __main__
                [sys.executable, "-c", "from redisync.collector.sidecar_process import main; main()"],
                stdin=subprocess.PIPE,
                close_fds=True,
                pass_fds=(read_end,),
                env=env,
            )
        finally:
            os.close(read_end)
        assert process.stdin is not None
        try:
            process.stdin.write(pickle.dumps(config))
            process.stdin.close()
        except BrokenPipeError:
            pass  # it exited at once: await_serving and the monitor say so
        if self._lifeline >= 0:
            os.close(self._lifeline)  # the previous sidecar's: it is gone
        self.process, self._lifeline, self._spawned = process, write_end, time.monotonic()

    def await_serving(self, deadline: float | None = None) -> bool:
        """Wait (up to STARTUP_S, or ``deadline``; the monitor's wait ends when the stop begins) for the
        sidecar just spawned to serve; one that exits first could not start, which health() says at once."""
        process, box = self.process, self.mailbox
        assert process is not None
        assert box is not None
        deadline = min(time.monotonic() + STARTUP_S, deadline if deadline is not None else float("inf"))
        while box.header[SIDECAR_PID] != process.pid and process.poll() is None and time.monotonic() < deadline:
            if threading.current_thread() is self._monitor and self._stopping.is_set():
                return False
            time.sleep(0.01)
        if box.header[SIDECAR_PID] == process.pid:
            return True
        if process.poll() is not None:
            self.problems.report(
                f"sidecar: could not start (exit code {process.returncode}; its error is on stderr)", logging.ERROR
            )
        return False

    def respawn(self, deadline: float | None = None) -> None:
        """Replace the sidecar (dead, or not answering) and wait for its successor to serve."""
        self.on_restart()
        self.spawn()
        self.await_serving(deadline)

    def watch(self) -> None:
        """Start the monitor thread (`_watch`)."""
        self._monitor = threading.Thread(target=self._watch, name=f"redisync-sidecar-monitor-{self.name}", daemon=True)
        self._monitor.start()

    def _watch(self) -> None:
        """Restart a sidecar that died or hung; the collector only sees its view go stale meanwhile.
        One that dies again at once is restarted after a growing pause (up to MAX_BACKOFF_S). Its start
        and its liveness are judged apart: a sidecar still starting (no heartbeat of its own yet: an
        import on a loaded machine can take longer than a hang) has until START_DEADLINE_S; one that
        serves must beat its heartbeat every HUNG_AFTER_S."""
        backoff, started = 0.0, time.monotonic()
        while not self._stopping.wait(CHECK_EVERY_S):
            process, box = self.process, self.mailbox
            if process is None or box is None:
                continue
            self.on_check()
            served = box.header[SIDECAR_PID] == process.pid
            if served:
                hung = time.monotonic() * 1e3 - box.header[HEARTBEAT_MS] > HUNG_AFTER_S * 1e3
            else:
                hung = time.monotonic() - self._spawned > START_DEADLINE_S
            if process.poll() is None and not hung:
                if time.monotonic() - started > MAX_BACKOFF_S:
                    backoff = 0.0  # it has lived a while: the next death is a new incident
                    self.problems.clear("sidecar")
                continue
            if hung:
                process.kill()
                process.wait()
            if served:
                what = "hung" if hung else "died"
            elif hung:
                what = f"did not start within {START_DEADLINE_S:g} s (still starting: killed)"
            else:
                what = "could not start"
            self.problems.report(f"sidecar: {what} (exit code {process.poll()}): restarting it", logging.WARNING)
            backoff = min(MAX_BACKOFF_S, 2 * backoff or CHECK_EVERY_S)
            if self._stopping.wait(backoff):
                break
            self.on_restart()
            try:
                self.spawn()
            except Exception as e:  # said in health(); tried again after the next pause
                self.problems.report(f"sidecar: could not restart: {type(e).__name__}: {e}", logging.ERROR)
                continue
            self.await_serving()
            started = time.monotonic()

    def end_watch(self, deadline: float) -> None:
        """Stop the monitor (it stops waiting for a successor at once) and wait for it until ``deadline``."""
        self._stopping.set()
        if self._monitor is not None:
            self._monitor.join(max(0.0, deadline - time.monotonic()))

    def wait_exit(self, process: subprocess.Popen[bytes], deadline: float) -> int | None:
        """The sidecar's exit code once it exits by ``deadline``; killed then (None)."""
        try:
            return process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.info(  # a last resort, not a fault: the collector publishes the last report itself (said if it cannot)
                "redisync shard %s: the sidecar did not stop within the stop timeout: killed", self.name
            )
            process.kill()
            process.wait()
            return None

    def cut_lifeline(self) -> None:
        """Close the pipe's write end: the sidecar exits once it sees it closed."""
        if self._lifeline >= 0:
            os.close(self._lifeline)
            self._lifeline = -1

    def after_fork(self) -> None:
        """A forked child keeps no sidecar: the sidecar must see its collector's death, not wait for the child's."""
        self.process, self._monitor, self.mailbox = None, None, None
        self.cut_lifeline()


def _import_path() -> list[str]:
    """Where this process finds redisync and what it imports: the sidecar's PYTHONPATH."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds redisync/
    return [here] + [p for p in sys.path if p and p != here and os.path.exists(p)]
