"""Imported by Python at the start of every process of a server launched with this folder on PYTHONPATH."""

import edgeacc_faults

edgeacc_faults.install()
