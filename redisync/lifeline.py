"""Processes that die with the process that started them.

A collector, a study worker or a bench's redis-server left behind by a parent that was SIGKILLed (a
closed terminal, an OOM kill, a scheduler's cancel) goes on renewing leases and publishing into a run
nobody watches. ``daemon=True`` does not help: it ends children only when the parent exits normally.

Every place in redisync that starts a process goes through this module:

- `spawn` starts a Python function in a spawned process that holds on to its parent: on the
  parent's death (seen at once through ``PR_SET_PDEATHSIG`` where Linux offers it, and through the
  lifeline pipe multiprocessing keeps to every child, or the parent's pid, within half a second) the
  child's main thread gets `ParentExited`, so its ``finally`` blocks run (a ``Syncer`` stops as at
  the end of a run: its last report published if the store answers, its lease given up), and the
  process exits for good `GRACE_S` later whatever it was doing.
- `hold_to_parent` is the same for a process something else started (a process pool's
  ``initializer``).
- `popen` starts a program (a ``redis-server``) that gets SIGTERM when its starter dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import multiprocessing as mp
import multiprocessing.connection
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, cast

GRACE_S = 8.0
"""How long a child whose parent died may take to stop cleanly (a Syncer's stop timeout, 5 s, and
some) before it exits regardless."""

CAUSE_S = 0.5
"""How long a SIGTERM waits for the parent's process to be gone before it is called ``terminated``."""

_PR_SET_PDEATHSIG = 1
_held = threading.Event()  # hold_to_parent ran in this process
_cause = "clean"  # why this process is stopping: see stop_cause

STOP_CAUSES = ("clean", "parent_exited", "terminated")
"""Why a process stops: ``clean`` (the program chose to), ``parent_exited`` (the process that started
it died) or ``terminated`` (a SIGTERM from someone else: a scheduler's cancel, an operator's kill)."""


def held() -> bool:
    """Whether `hold_to_parent` ran in this process (its SIGTERM handler stops the process's syncers)."""
    return _held.is_set()


def stop_cause() -> str:
    """Why this process is stopping, for the lease it gives up (``lease.lua`` records it, so that an
    observer tells a crashed trainer's collectors from a finished run's): ``clean`` unless the lifeline
    raised `ParentExited` in this process."""
    return _cause


class ParentExited(SystemExit):
    """Raised in a child's main thread when the process that started it has died."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def _set_pdeathsig(sig: int) -> bool:
    """Ask Linux to send ``sig`` to this process when the thread that started it exits."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def hold_to_parent(parent_pid: int, pdeathsig: bool = True, grace_s: float = GRACE_S) -> None:
    """In a child process: end this process when ``parent_pid`` dies (see the module's docstring).

    ``pdeathsig`` only where the parent started this process from a thread that lives as long as
    the parent (its main thread): Linux signals a child when the *thread* that forked it exits.
    """
    if _held.is_set():
        return
    _held.set()
    raised = threading.Event()
    parent = mp.parent_process()
    sentinel = parent.sentinel if parent is not None and parent.pid == parent_pid else None

    def gone() -> bool:
        if os.getppid() != parent_pid:
            return True
        if sentinel is None:
            return False
        with contextlib.suppress(OSError, ValueError):
            return bool(multiprocessing.connection.wait([sentinel], timeout=0))
        return True

    def on_term(signum: int, frame: Any) -> None:
        global _cause
        if not raised.is_set():  # once: a second SIGTERM must not cut the clean stop short
            raised.set()
            # PDEATHSIG comes when the parent's starting *thread* exits, which can be a moment before
            # its process is gone: a SIGTERM is the parent's death if the parent goes within CAUSE_S
            deadline = time.monotonic() + CAUSE_S
            while not gone() and time.monotonic() < deadline:
                time.sleep(0.01)
            _cause = "parent_exited" if gone() else "terminated"
            raise ParentExited()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)
    if pdeathsig:
        _set_pdeathsig(signal.SIGTERM)

    def watch() -> None:
        while not gone():
            if sentinel is None:
                time.sleep(0.5)
            else:
                with contextlib.suppress(OSError, ValueError):
                    multiprocessing.connection.wait([sentinel], timeout=0.5)
        if not raised.is_set():
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(128 + signal.SIGTERM)

    if gone():  # it died before we could watch it
        os._exit(128 + signal.SIGTERM)
    threading.Thread(target=watch, name="redisync-lifeline", daemon=True).start()


class _Tied:
    """A spawned process' target that first holds on to its parent (picklable, for ``spawn``)."""

    def __init__(self, target: Callable[..., Any], parent_pid: int, pdeathsig: bool):
        self.target, self.parent_pid, self.pdeathsig = target, parent_pid, pdeathsig

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hold_to_parent(self.parent_pid, self.pdeathsig)
        return self.target(*args, **kwargs)


def initializer_args() -> tuple[int, bool]:
    """``hold_to_parent``'s arguments for a process pool whose processes this thread starts
    (``ProcessPoolExecutor(initializer=hold_to_parent, initargs=initializer_args())``): PDEATHSIG
    only from the main thread, which lives as long as the process."""
    return os.getpid(), threading.current_thread() is threading.main_thread()


class _Starter:
    """The one thread that starts every tied process. Linux sends PDEATHSIG when the *thread* that
    forked a child exits, not its process: a child started from a short-lived thread (a fault
    injector's, a monitor's) would be killed with it. This thread lives as long as the process."""

    def __init__(self) -> None:
        self.lock, self.pid = threading.Lock(), -1
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()

    def run(self, job: Callable[[], Any]) -> Any:
        with self.lock:
            if self.pid != os.getpid():  # first use, or in a forked child (threads do not survive a fork)
                self.pid, self.jobs = os.getpid(), queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(self.jobs,), name="redisync-starter", daemon=True).start()
        done: Future[Any] = Future()
        self.jobs.put((job, done))
        return done.result()

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]]) -> None:
        while True:
            job, done = jobs.get()
            try:
                done.set_result(job())
            except BaseException as e:
                done.set_exception(e)


_starter = _Starter()


def spawn(target: Callable[..., Any], *args: Any, name: str | None = None) -> Any:
    """``target(*args)`` in a new, started, spawned process that dies with this one."""
    process = mp.get_context("spawn").Process(target=_Tied(target, os.getpid(), True), args=args, name=name)
    _starter.run(process.start)
    return process


def _die_with_starter(starter: int) -> None:  # runs in the child between fork and exec
    _set_pdeathsig(signal.SIGTERM)
    if os.getppid() != starter:  # the starter died before the line above
        os._exit(1)


def popen(args: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(args)`` for a program (a ``redis-server``) that must not outlive this
    process: it gets SIGTERM when this process dies, from whichever thread it was started."""
    starter = functools.partial(_die_with_starter, os.getpid())
    return cast(
        "subprocess.Popen[Any]", _starter.run(lambda: subprocess.Popen(list(args), preexec_fn=starter, **kwargs))
    )
