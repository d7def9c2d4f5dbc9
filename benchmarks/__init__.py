"""The benchmarks, run from the repository root as modules (``python3 -m benchmarks.serving_vs_upstream``)."""
