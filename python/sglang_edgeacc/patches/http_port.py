"""Patch ``http_port``: the launcher holds the HTTP port from its first step until uvicorn serves on it.

Targets (launcher process only):

* ``http_server.launch_server`` (AROUND): listens on ``--host``/``--port``
  (:mod:`~sglang_edgeacc.server_start.port_hold`) before anything is spawned; a
  port in use ends the launch at once, naming the port and what to change.
  The hold ends with ``launch_server``.
* ``uvicorn.server.Server.startup`` (AROUND): when uvicorn would bind that host
  and port itself, it serves on the held sockets instead, and logs the usual
  "Uvicorn running on ..." line (``Server._log_started_message``).
* ``uvicorn.config.Config.bind_socket``, ``http_server._run_granian_server`` and
  ``http_server._reserve_reuseport_socket`` (BEFORE): the HTTP servers that bind
  by themselves (tokenizer workers, HTTP/2, SO_REUSEPORT workers) get the port
  released just before they bind it.

Not held: with ``SGLANG_RUST_SERVER`` (a scheduler binds the port) and on nodes
other than the first (``--node-rank`` > 0 serves only a health check).
"""

from __future__ import annotations

from sglang_edgeacc.patches._base import Patch, Target, hook_installer
from sglang_edgeacc.server_start import port_hold

HTTP_SERVER = "sglang.srt.entrypoints.http_server"
LAUNCH_SERVER = f"{HTTP_SERVER}.launch_server"
UVICORN_STARTUP = "uvicorn.server.Server.startup"
UVICORN_LOG_STARTED = "uvicorn.server.Server._log_started_message"
SELF_BINDING = (
    "uvicorn.config.Config.bind_socket",
    f"{HTTP_SERVER}._run_granian_server",
    f"{HTTP_SERVER}._reserve_reuseport_socket",
)
RUST_SERVER_ENV = "sglang.srt.environ.envs.SGLANG_RUST_SERVER"

# Shared with patch ``start_failure``, which guards the same launches.
LAUNCH_SERVER_TARGET = Target(LAUNCH_SERVER, params=(
    "server_args", "init_tokenizer_manager_func", "run_scheduler_process_func", "run_detokenizer_process_func",
    "execute_warmup_func", "launch_callback"))
RUST_SERVER_TARGET = Target(RUST_SERVER_ENV, is_attribute=True)


def http_port_held_by_launcher(server_args) -> bool:
    from sglang.srt.environ import envs

    if envs.SGLANG_RUST_SERVER.get():
        return False
    return (server_args.node_rank or 0) == 0


def _around_launch_server(original, server_args, *args, **kwargs):
    if not http_port_held_by_launcher(server_args):
        return original(server_args, *args, **kwargs)
    port_hold.hold(server_args.host, server_args.port)
    try:
        return original(server_args, *args, **kwargs)
    finally:
        port_hold.release()


def _around_uvicorn_startup(original, server, sockets=None):
    config = server.config
    held = None
    if sockets is None and config.fd is None and config.uds is None:
        held = port_hold.hand_over(config.host, config.port)
    if held is None:
        return original(server, sockets=sockets)
    return _startup_on_held_port(original, server, held)


async def _startup_on_held_port(original, server, held):
    await original(server, sockets=held)
    if server.started:
        # uvicorn logs this line only for the sockets it binds itself.
        server._log_started_message(held)


def _release_before_binding(*args, **kwargs):
    del args, kwargs
    port_hold.release()


PATCH = Patch(
    name="http_port",
    summary="the launcher holds the HTTP port from its first step until uvicorn serves on the same socket",
    targets=(
        LAUNCH_SERVER_TARGET,
        Target(UVICORN_STARTUP, params=("self", "sockets")),
        Target(UVICORN_LOG_STARTED, params=("self", "listeners")),
        Target("uvicorn.config.Config.bind_socket", params=("self",)),
        Target(f"{HTTP_SERVER}._run_granian_server",
               params=("host", "port", "log_level", "http2_max_concurrent_streams",
                       "http2_initial_connection_window_size", "tokenizer_manager", "tokenizer_worker_num",
                       "ssl_certfile", "ssl_keyfile", "ssl_ca_certs", "ssl_keyfile_password", "ssl_verify",
                       "backlog", "backpressure")),
        Target(f"{HTTP_SERVER}._reserve_reuseport_socket", params=("config",)),
        RUST_SERVER_TARGET,
    ),
    install=hook_installer(
        (LAUNCH_SERVER, _around_launch_server, "AROUND"),
        (UVICORN_STARTUP, _around_uvicorn_startup, "AROUND"),
        *((target, _release_before_binding, "BEFORE") for target in SELF_BINDING),
    ),
    only_in_launcher=True,
)
