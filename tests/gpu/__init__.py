"""The GPU suite and its scripts, run from the repository root as modules (``python3 -m tests.gpu.server_suite``)."""
