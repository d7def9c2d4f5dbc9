"""The test servers' ports: servers kept or started together never bind each other's ports."""

from __future__ import annotations

import socket

from sglang.srt.server_args import DP_ATTENTION_HANDSHAKE_PORT_DELTA, ZMQ_TCP_PORT_DELTA

from tests import harness


def _bound_by(port: int) -> set[int]:
    # What a single-node DP-attention server on ``port`` binds at fixed offsets (sglang's PortArgs and
    # DataParallelController): its HTTP port, the workers' handshake, the distributed init port and
    # the six after it.
    return {port, port + DP_ATTENTION_HANDSHAKE_PORT_DELTA,
            *range(port + ZMQ_TCP_PORT_DELTA, port + ZMQ_TCP_PORT_DELTA + 7)}


def test_ports_handed_out_in_one_process_never_share_a_port_a_server_binds():
    # Three hundred picks: by chance alone about eighty pairs would lie 13 or 233-239 apart.
    ports = [harness.free_port() for _ in range(300)]
    seen: dict[int, int] = {}
    for port in ports:
        for bound in _bound_by(port):
            assert bound not in seen, f"server ports {seen[bound]} and {port} both bind {bound}"
            seen[bound] = port


def test_a_port_whose_handshake_port_is_taken_is_not_handed_out(monkeypatch):
    # Every candidate but one has its DP-attention handshake port in use; only that one may come out.
    low = harness._SERVER_PORT_RANGE[0]
    monkeypatch.setattr(harness, "_SERVER_PORT_RANGE", (low, low + 2))
    handed_out: set[int] = set()
    monkeypatch.setattr(harness, "_HANDED_OUT", handed_out)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", low + DP_ATTENTION_HANDSHAKE_PORT_DELTA))
        for _ in range(20):
            handed_out.clear()
            assert harness.free_port() == low + 1
