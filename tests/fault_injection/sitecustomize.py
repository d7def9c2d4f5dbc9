"""Imported by Python at the start of every process of a server launched with this folder on PYTHONPATH.

Python imports only the first ``sitecustomize`` on the path, and this folder comes
first: the one it shadows (a host's own, such as the GPU host bundle's shims) is
run here too, before the faults, so that a server with faults runs on the same
stack as one without.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _run_shadowed_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_run_shadowed_sitecustomize()

import edgeacc_faults  # noqa: E402 - after the shadowed site setup, as Python would have run it

edgeacc_faults.install()
