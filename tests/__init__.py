"""The CPU and GPU suites, and the helpers they share with ``benchmarks`` (``tests.harness``, ``tests.serving_models``, ...).

A package so that every caller imports a helper by its module path from the repository root, which pytest
(``pythonpath`` in pyproject.toml) and ``python3 -m`` put on ``sys.path``.
"""
