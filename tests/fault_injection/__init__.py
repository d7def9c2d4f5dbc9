"""Test-only faults. Tests import ``tests.fault_injection.edgeacc_faults``; a server gets the faults through its
``server_env``, which puts this folder first on the server's ``PYTHONPATH``."""
