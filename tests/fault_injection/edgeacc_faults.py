"""Test-only faults for the EdgeAcc server, injected from outside the package.

A test that wants a fault starts the server with this folder on ``PYTHONPATH``
(``server_env`` below) and the fault's variable set; Python imports this
folder's ``sitecustomize`` at the start of every process of the server, which
calls :func:`install`: in a prefill side it hooks
the one method the fault is about through sglang's ``HookRegistry`` (applied
when sglang loads its plugins, before the scheduler is built), or switches a
patch off in every process. Without the variables this module does nothing,
and the package itself knows no faults.
"""

from __future__ import annotations

import os
from pathlib import Path

# An idle prefill side skips the group's collective, as an unfixed scheduler did:
# a server with it deadlocks under DP attention, which shows the regression test can fail.
# "1": from the start; a file's path: while that file exists (a server first checked healthy).
SKIP_IDLE_SYNC_ENV = "SGLANG_EDGEACC_TEST_SKIP_IDLE_SYNC"
# The prefill side of this DP rank fails at start, after mapping the shared state (as a
# prefill side whose port another process took does); the server must then exit, not hang.
FAIL_START_DP_RANK_ENV = "SGLANG_EDGEACC_TEST_FAIL_PREFILL_START_DP_RANK"

# The prefill side exits with this code before it connects to its decode side (as one whose
# imports fail does); the decode side must fail its start with that code, not wait.
EXIT_BEFORE_CONNECT_ENV = "SGLANG_EDGEACC_TEST_PREFILL_EXIT_BEFORE_CONNECT"
# Serve without the named patches (comma-separated names from sglang_edgeacc.patches), in every
# process of the server: shows what a patch prevents, against the same sglang it patches.
WITHOUT_PATCHES_ENV = "SGLANG_EDGEACC_TEST_WITHOUT_PATCHES"

# Every process sglang spawns tries, as it starts, to listen on this port (the server's HTTP port), as
# a gloo listener that the kernel happened to give that port does; it keeps what it gets.
TAKE_PORT_ENV = "SGLANG_EDGEACC_TEST_TAKE_PORT"

# Requests whose rid starts with this value carry an object built to be unpicklable on the decode
# side, as a request holding something that cannot cross to the prefill side would.
UNPICKLABLE_RID_ENV = "SGLANG_EDGEACC_TEST_UNPICKLABLE_RID"

# A prefill batch holding a request whose rid starts with this value takes SLOW_PREFILL_S longer on
# the prefill side: long enough for a test to act while that batch is in flight.
SLOW_PREFILL_RID_ENV = "SGLANG_EDGEACC_TEST_SLOW_PREFILL_RID"
SLOW_PREFILL_S = 1.0

# The decode side's loop stalls STALL_DISPATCH_S once, when it is about to hand over a prefill batch
# while a request whose rid starts with this value waits: a stall of the loop where no decode step runs.
STALL_DISPATCH_RID_ENV = "SGLANG_EDGEACC_TEST_STALL_DISPATCH_RID"
STALL_DISPATCH_S = 1.0

_PREFILL_SCHEDULER = "sglang_edgeacc.edge_acc_server.prefill_side.PrefillSideScheduler"
_DECODE_SCHEDULER = "sglang_edgeacc.edge_acc_server.decode_side.DecodeSideScheduler"
# What the launcher exports to a prefill side only (edge_acc_server.roles).
_ROLE_ENV, _PREFILL = "SGLANG_EDGEACC_ROLE", "prefill"


def server_env(**faults: str) -> dict[str, str]:
    """The environment of a server with ``faults`` (variable name to value) switched on."""
    paths = [str(Path(__file__).resolve().parent)]
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"PYTHONPATH": os.pathsep.join(paths), **faults}


def _dp_rank():
    from sglang.srt.runtime_context import get_parallel

    try:
        return get_parallel().dp_rank
    except (AttributeError, RuntimeError, ValueError):
        return None


def _fail_after_connect(original, self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    if os.environ.get(FAIL_START_DP_RANK_ENV) == str(_dp_rank()):
        raise RuntimeError(f"[edgeacc prefill] test fault: {FAIL_START_DP_RANK_ENV} names this DP rank")
    return result


def _exit_before_connect(original, self, *args, **kwargs):
    del original, self, args, kwargs
    import logging

    logging.getLogger(__name__).error("[edgeacc prefill] test fault: %s, exiting", EXIT_BEFORE_CONNECT_ENV)
    logging.shutdown()
    os._exit(int(os.environ[EXIT_BEFORE_CONNECT_ENV]))


class BuiltToBeUnpicklable:
    def __reduce__(self):
        raise TypeError("this object is built to be unpicklable")


def _attach_unpicklable(original, self, *args, **kwargs):
    marker = os.environ[UNPICKLABLE_RID_ENV]
    for req in self.waiting_queue:
        if str(req.rid).startswith(marker):
            req.edgeacc_test_payload = BuiltToBeUnpicklable()
    return original(self, *args, **kwargs)


_stalled_for: set[str] = set()


def _stall_dispatch(original, self, *args, **kwargs):
    import time

    marker = os.environ[STALL_DISPATCH_RID_ENV]
    due = [str(req.rid) for req in self.waiting_queue
           if str(req.rid).startswith(marker) and str(req.rid) not in _stalled_for]
    if due:
        _stalled_for.update(due)
        time.sleep(STALL_DISPATCH_S)
    return original(self, *args, **kwargs)


def _slow_prefill(original, self, *args, **kwargs):
    import time

    batch = original(self, *args, **kwargs)
    marker = os.environ[SLOW_PREFILL_RID_ENV]
    if any(str(req.rid).startswith(marker) for req in batch.reqs):
        time.sleep(SLOW_PREFILL_S)
    return batch


SKIPPING_LINE = "[edgeacc test fault] this prefill side skips the idle sync from now on, pid"
_skipping = False


def _skip_sync_when_idle(original, self, batch):
    global _skipping
    switch = os.environ[SKIP_IDLE_SYNC_ENV]
    if batch is None and (switch == "1" or os.path.exists(switch)):
        if not _skipping:
            # Said once per switch-on: a test waits for every side to be past the collective it
            # may have entered before the switch, or a request could still complete that round.
            import sys

            print(f"{SKIPPING_LINE} {os.getpid()}", file=sys.stderr, flush=True)
            _skipping = True
        return None  # the loop then sleeps and polls again, outside the collective
    _skipping = False
    return original(self, batch)


def _without_patches(names: list[str]) -> None:
    """Make the named patches not apply; runs before sglang loads its plugins."""
    import dataclasses
    import importlib

    from sglang_edgeacc import patches

    for name in names:
        module_name = f"sglang_edgeacc.patches.{name}"
        if module_name not in patches.PATCH_MODULES:
            raise SystemExit(f"{WITHOUT_PATCHES_ENV}: no patch {name!r}; known: "
                             f"{[m.rsplit('.', 1)[1] for m in patches.PATCH_MODULES]}")
        module = importlib.import_module(module_name)
        module.PATCH = dataclasses.replace(module.PATCH, applies=lambda: False)


_taken_ports = []


def _take_port(port: int) -> None:
    """Listen on ``port`` for the life of this process if it is free; say on stderr what happened."""
    import socket
    import sys

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(1)
    except OSError as exc:
        sock.close()
        print(f"[test fault] pid {os.getpid()} could not take port {port}: {exc}", file=sys.stderr, flush=True)
        return
    _taken_ports.append(sock)
    print(f"[test fault] pid {os.getpid()} took port {port}", file=sys.stderr, flush=True)


def install() -> None:
    import sys

    if os.environ.get(TAKE_PORT_ENV) and "--multiprocessing-fork" in sys.argv:  # a process sglang spawned
        _take_port(int(os.environ[TAKE_PORT_ENV]))
    dropped = [n for n in os.environ.get(WITHOUT_PATCHES_ENV, "").split(",") if n]
    if dropped:
        _without_patches(dropped)
    hooks = []
    if os.environ.get(EXIT_BEFORE_CONNECT_ENV):
        hooks.append(("_edge_prefill_connect", _exit_before_connect))
    if os.environ.get(FAIL_START_DP_RANK_ENV):
        hooks.append(("_edge_prefill_connect", _fail_after_connect))
    if os.environ.get(SLOW_PREFILL_RID_ENV):
        hooks.append(("_edge_unpack_work", _slow_prefill))
    if os.environ.get(SKIP_IDLE_SYNC_ENV):
        hooks.append(("_edge_join_group_step", _skip_sync_when_idle))
    decode_hooks = []
    if os.environ.get(UNPICKLABLE_RID_ENV):
        decode_hooks.append(("_edge_dispatch_prefill", _attach_unpicklable))
    if os.environ.get(STALL_DISPATCH_RID_ENV):
        decode_hooks.append(("_edge_dispatch_prefill", _stall_dispatch))
    role = os.environ.get(_ROLE_ENV)
    scheduler, hooks = (_PREFILL_SCHEDULER, hooks) if role == _PREFILL else (_DECODE_SCHEDULER, decode_hooks)
    if not hooks or os.environ.get("SGLANG_EDGEACC") != "1":
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for method, hook in hooks:
        HookRegistry.register(f"{scheduler}.{method}", hook, HookType.AROUND)
