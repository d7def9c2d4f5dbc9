"""Patch ``start_failure``: a server that cannot start exits at once, and takes its processes down.

Targets (launcher process only):

* ``http_server.launch_server`` (BEFORE): starts the start guard
  (:mod:`~sglang_edgeacc.server_start.start_guard`), which follows every process
  the launcher starts and, when a server process ends before the server is
  ready, logs which one and how, SIGKILLs the others and exits with status 1.
* ``uvicorn.lifespan.on.LifespanOn.shutdown`` (BEFORE): an HTTP server that
  stops before the server was ready (uvicorn could not bind, a signal) ends the
  start the same way instead of waiting for sglang's warmup thread, which waits
  for that HTTP server to answer; a taken port is named with what to change.
* ``http_server._wait_and_warmup`` (AROUND): the server is ready when it returns.
* ``http_server._setup_and_run_http_server`` (BEFORE): with
  ``--tokenizer-worker-num`` > 1 the warmup runs in the workers, and upstream's
  subprocess watchdog, running by then, takes over here.

Not guarded, as with ``http_port``: ``SGLANG_RUST_SERVER`` and nodes other than the first.
"""

from __future__ import annotations

from sglang_edgeacc.patches._base import Patch, Target, hook_installer
from sglang_edgeacc.patches.http_port import (
    HTTP_SERVER,
    LAUNCH_SERVER,
    LAUNCH_SERVER_TARGET,
    RUST_SERVER_TARGET,
    http_port_held_by_launcher,
)
from sglang_edgeacc.server_start import start_guard

LIFESPAN_SHUTDOWN = "uvicorn.lifespan.on.LifespanOn.shutdown"
WAIT_AND_WARMUP = f"{HTTP_SERVER}._wait_and_warmup"
SETUP_AND_RUN_HTTP_SERVER = f"{HTTP_SERVER}._setup_and_run_http_server"


def _guard_the_start(server_args, *args, **kwargs):
    del args, kwargs
    # The same launches whose port the launcher holds: one HTTP server here, and a warmup that ends the start.
    if http_port_held_by_launcher(server_args):
        start_guard.start(server_args.host or "", server_args.port)


def _fail_if_stopping_before_ready(lifespan):
    del lifespan
    guard = start_guard.current()
    if guard is not None and guard.active:
        guard.fail(start_guard.http_server_stopped(guard.host, guard.port))


def _ready_after_warmup(original, *args, **kwargs):
    result = original(*args, **kwargs)
    guard = start_guard.current()
    if guard is not None:
        guard.ready("warmup done")
    return result


def _hand_over_to_tokenizer_workers(server_args, *args, **kwargs):
    del args, kwargs
    guard = start_guard.current()
    if guard is not None and server_args.tokenizer_worker_num > 1:
        guard.ready("the tokenizer workers run the warmup; upstream's subprocess watchdog runs")


PATCH = Patch(
    name="start_failure",
    summary="a failure before the server is ready ends the launcher within seconds, its processes taken down",
    targets=(
        LAUNCH_SERVER_TARGET,
        Target(LIFESPAN_SHUTDOWN, params=("self",)),
        Target(WAIT_AND_WARMUP, params=("server_args", "launch_callback", "execute_warmup_func",
                                        "post_warmup_callback")),
        Target(SETUP_AND_RUN_HTTP_SERVER, params=("server_args", "tokenizer_manager", "template_manager", "port_args",
                                                  "scheduler_infos", "subprocess_watchdog", "execute_warmup_func",
                                                  "launch_callback")),
        RUST_SERVER_TARGET,
    ),
    install=hook_installer(
        (LAUNCH_SERVER, _guard_the_start, "BEFORE"),
        (LIFESPAN_SHUTDOWN, _fail_if_stopping_before_ready, "BEFORE"),
        (WAIT_AND_WARMUP, _ready_after_warmup, "AROUND"),
        (SETUP_AND_RUN_HTTP_SERVER, _hand_over_to_tokenizer_workers, "BEFORE"),
    ),
    only_in_launcher=True,
)
