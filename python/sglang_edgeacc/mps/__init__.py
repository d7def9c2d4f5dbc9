"""The CUDA MPS control daemon under which EdgeAcc's two sides share a GPU's SMs.

``daemon`` starts and stops it; ``control`` is the control pipe (directories,
the binary, one command); ``status`` reads what answers there and ``ownership``
whether we started it; ``multiuser`` decides ``--multiuser-server``;
``launch_check`` gives the launcher ``require_daemon`` to refuse a launch that
would run without the split; ``cli`` is the ``sglang-edgeacc mps
start|stop|status`` subcommand. Standard library only, so it
runs on a GPU host from the repository with ``PYTHONPATH=python``.
"""
