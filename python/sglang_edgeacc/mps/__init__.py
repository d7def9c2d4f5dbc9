"""The CUDA MPS control daemon under which EdgeAcc's two sides share a GPU's SMs.

``daemon`` starts, inspects and stops it, and gives the launcher ``require_daemon``
to refuse a launch that would run without the split; ``cli`` is the
``sglang-edgeacc mps start|stop|status`` subcommand. Standard library only, so it
runs on a GPU host from the repository with ``PYTHONPATH=python``.
"""
