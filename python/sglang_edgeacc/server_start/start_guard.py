"""Until the server is ready, any failure ends the launcher within seconds, and takes its processes down.

Upstream's launcher waits for its children at a few points, and not at others:
with ``--dp`` it waits on the data-parallel controller, which waits on a scheduler
that may already be dead (the server then hung for good); a detokenizer that dies
is only noticed once every scheduler is ready; an HTTP port that uvicorn cannot
bind ends in uvicorn's lifespan shutdown, which joins the warmup thread, which
polls ``/model_info`` on a port that never answers (12 minutes, or for ever when
another program answers there). A supervisor waiting for the process to exit
waited as long, with the schedulers holding their memory.

The guard is a thread of the launcher from the start of ``launch_server`` until
the warmup is done (or the HTTP server is handed to tokenizer worker processes).
It follows the launcher's descendants (:mod:`server_processes`) and ends the
start when a server process ends, or when the HTTP server stops before it was
ready. Ending the start is: log the cause, SIGKILL every process the launcher
started (also those whose parent died, which upstream's tree kill no longer
finds), and exit with status 1. Python's resource tracker is left to end by
itself a moment later: it then removes the semaphores and shared memory the
killed processes left registered.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Optional

from sglang_edgeacc.server_start import port_hold
from sglang_edgeacc.server_start.server_processes import Ended, ServerProcesses, kill_all

logger = logging.getLogger(__name__)

POLL_S = 0.5
# Between the cause and the kill: the other processes' error paths (a decode side telling why its
# prefill side failed, a scheduler's traceback) take milliseconds to log, and the log is what says why.
GRACE_S = 1.0
EXIT_STATUS = 1


@dataclass(frozen=True)
class StartFailure:
    cause: str


def process_ended(ended: Ended) -> StartFailure:
    if ended.killed_by == signal.SIGKILL:
        why = "a SIGKILL nobody logged often comes from the kernel's OOM killer: `dmesg -T | grep -i oom`"
    else:
        why = "its own log lines above say why"
    return StartFailure(f"{ended.describe()} before the server was ready ({why})")


def http_server_stopped(host: str, port: int) -> StartFailure:
    """Why uvicorn stopped before serving: its port when that is taken, else what it logged."""
    if not port_hold.holding(host, port):
        try:
            for sock in port_hold.listen_on(host, port):
                sock.close()
        except OSError as exc:
            return StartFailure(port_hold.port_in_use_message(host, port, exc))
    return StartFailure("the HTTP server stopped before the server was ready (uvicorn's reason is logged above)")


class StartGuard:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._processes = ServerProcesses(os.getpid())
        self._done = threading.Event()
        self._failing = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    @property
    def active(self) -> bool:
        return self._thread is not None and not self._done.is_set()

    def start(self) -> "StartGuard":
        self._thread = threading.Thread(target=self._watch, name="edgeacc-start-guard", daemon=True)
        self._thread.start()
        # A start that fails in the launcher's main thread ends through upstream's
        # tree kill, which misses a process whose parent died before it.
        atexit.register(self._take_down_leftovers)
        return self

    def ready(self, why: str) -> None:
        if not self._done.is_set():
            logger.debug("start guard done: %s", why)
        self._done.set()

    def fail(self, failure: StartFailure) -> None:
        """Log the cause, take every process of the launch down, exit the launcher. Does not return."""
        if self._done.is_set() or not self._failing.acquire(blocking=False):
            return
        logger.error("[edgeacc] the server failed to start: %s. Stopping its processes; the launcher exits "
                     "with status %d.", failure.cause.rstrip("."), EXIT_STATUS)
        time.sleep(GRACE_S)
        procs = self._processes.alive()
        left = kill_all(procs)
        if left:
            logger.error("[edgeacc] still running after SIGKILL: %s", ", ".join(str(p.pid) for p in left))
        logging.shutdown()
        os._exit(EXIT_STATUS)

    def _watch(self) -> None:
        while not self._done.wait(POLL_S):
            for ended in self._processes.observe():
                if ended.counts_as_failure():
                    self.fail(process_ended(ended))

    def _take_down_leftovers(self) -> None:
        if self._done.is_set():
            return
        if not self._failing.acquire(blocking=False):
            # The guard is ending the start: the interpreter must not end (and stop its thread)
            # before it has taken every process down and exited.
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join(timeout=GRACE_S + 10)
            return
        procs = self._processes.alive()
        if procs:
            logger.error("[edgeacc] the launcher exits before the server was ready; stopping %d processes it "
                         "started: %s", len(procs), ", ".join(str(p.pid) for p in procs))
            kill_all(procs)


_guard: Optional[StartGuard] = None


def start(host: str, port: int) -> StartGuard:
    global _guard
    _guard = StartGuard(host, port).start()
    return _guard


def current() -> Optional[StartGuard]:
    return _guard
