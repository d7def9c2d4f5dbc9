"""How the launcher starts a server, and what it does when the start fails.

Three small mechanisms, each wired into sglang by a patch of its own:

* :mod:`port_hold`: the launcher listens on the HTTP port from the first thing it
  does until uvicorn serves on that very socket, so no process (the server's own
  collective-group listeners included) can take the port in between
  (patch ``http_port``);
* :mod:`start_guard` with :mod:`server_processes`: until the server is ready, a
  failure (a server process that ends, an HTTP server that stops) ends the
  launcher within seconds, non-zero, with every process it started taken down
  (patch ``start_failure``);
* :mod:`shm_reclaim`: at start, what killed servers left in ``/dev/shm`` is
  removed, never anything a live process holds or another user owns
  (patch ``shm_reclaim``).

They import only the standard library and psutil; the patches wire them in.
"""
