"""The two sides of EdgeAcc go down together, whichever fails first.

A prefill side that fails makes its decode side fail the way an upstream scheduler does.

The prefill side runs upstream's ``run_scheduler_process``, whose error path logs the
traceback and sends SIGQUIT to its parent, which here is the decode side. Left at its
default, that signal kills the decode side outright and skips the decode side's own
error path, so nobody tells *its* parent. Upstream's launcher polls its children and
would notice, but with ``--dp`` the parent is the data-parallel controller, which waits
for a scheduler's ready message on a blocking pipe: the server hung at start, with DP1's
decode side a zombie. Here SIGQUIT becomes an exception in the decode side's main thread,
and upstream's error path handles it like any scheduler failure (traceback, SIGQUIT to
its own parent, server down).

A decode side that dies takes its prefill side with it. Upstream arms the parent-death
signal (SIGKILL when the parent exits) in a scheduler process only once that process has
imported sglang, seconds after it was spawned. A decode side killed in that window (the
server going down at start, the OOM killer) left an orphan that waited ten minutes for
shared state that would never come. The prefill side's process arms the signal itself,
first thing, before it imports sglang, and then checks that its parent is still the decode side.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading

from sglang_edgeacc.edge_acc_server import roles
from sglang_edgeacc.edge_acc_server.channel import PeerLost

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


class PrefillSideFailed(PeerLost):
    """The prefill side hit an error and signalled its decode side (its traceback is logged above)."""


def _raise_prefill_side_failed(signum, frame) -> None:
    del signum, frame
    raise PrefillSideFailed(
        "the prefill side failed and sent SIGQUIT to its decode side; its traceback is logged above")


def fail_on_prefill_side_sigquit(log_prefix: str) -> bool:
    """Turn SIGQUIT into :class:`PrefillSideFailed` in this process; False where that cannot be done."""
    if threading.current_thread() is not threading.main_thread():
        # Python delivers signals to the main thread only; upstream's schedulers run there.
        logger.warning("%s not in the main thread: a failing prefill side will kill this process "
                       "without its error path", log_prefix)
        return False
    signal.signal(signal.SIGQUIT, _raise_prefill_side_failed)
    return True


def die_with_decode_side(log_prefix: str) -> int:
    """In a prefill side: exit when the decode side does, also if it already has. Returns its pid.

    Needs nothing of sglang (whose own helper for the signal takes seconds to import), so
    that the prefill side's process can call it before it imports sglang.
    """
    decode_pid = roles.decode_side_pid()
    if sys.platform == "linux":
        ctypes.CDLL("libc.so.6").prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # from here on the kernel does it
    if os.getppid() != decode_pid:
        # The decode side died before the signal was armed; this process was adopted by
        # another (init, in a container). Upstream's error path would send SIGQUIT to that
        # adopter, so leave without it: there is nobody left to tell.
        logger.error("%s the decode side (pid %d) exited while this prefill side was starting; exiting",
                     log_prefix, decode_pid)
        logging.shutdown()
        os._exit(1)
    return decode_pid
