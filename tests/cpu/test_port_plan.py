"""The prefill sides' NCCL port: free, below the ephemeral range, and not decided by a seeded RNG."""

from __future__ import annotations

import random
import socket

from sglang_edgeacc.edge_acc_server import port_plan


def _ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
        return int(fh.read().split()[0])


def test_ports_differ_although_every_process_seeds_random_alike():
    # Each scheduler process calls random.seed(--random-seed): with a seeded draw every
    # prefill side of a --dp 2 server picked the same port (CI: EADDRINUSE at start).
    ports = []
    for _ in range(10):
        random.seed(42)
        ports.append(port_plan.free_nccl_port())
    assert len(set(ports)) > 1


def test_the_schedulers_random_state_is_left_as_it_was():
    random.seed(7)
    expected = random.Random(7).random()
    port_plan.free_nccl_port()
    assert random.random() == expected


def test_port_is_free_and_below_the_ephemeral_range():
    port = port_plan.free_nccl_port()
    low, high = port_plan._NCCL_PORT_BAND
    if _ephemeral_low() > low + 64:
        assert low <= port < min(high + 1, _ephemeral_low())
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", port))  # raises if it were taken
