"""The side channel's background send: the sender goes on while its peer is still starting.

The decode side hands its shared state to a prefill side that connects only
after importing sglang; sending in the background lets the decode side capture
its CUDA graphs meanwhile. Real sockets, real processes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from sglang_edgeacc.edge_acc_server.channel import PeerLost, SideChannel, new_endpoint

PEER_DELAY_S = 2.0

_PEER = textwrap.dedent(
    """
    import sys, time
    from sglang_edgeacc.edge_acc_server.channel import SideChannel
    time.sleep(float(sys.argv[2]))
    channel = SideChannel(sys.argv[1], bind=False)
    message = channel.recv(timeout_s=30, peer_alive=lambda: True, what="the test message")
    channel.send({"echo": message})
    channel.close()
    """
)


def _start_peer(endpoint: str, delay_s: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _PEER, endpoint, str(delay_s)])


def test_background_send_returns_before_the_peer_connects_and_delivers_later():
    channel = SideChannel(new_endpoint(), bind=True)
    peer = _start_peer(channel.endpoint, PEER_DELAY_S)
    try:
        message = {"state": list(range(1000)), "name": "shared"}
        started = time.monotonic()
        pending = channel.send_in_background(message, peer_alive=lambda: peer.poll() is None, timeout_s=60)
        returned_after = time.monotonic() - started
        # A blocking send would wait the peer's whole delay here.
        assert returned_after < PEER_DELAY_S / 2, returned_after

        pending.wait()
        assert time.monotonic() - started >= PEER_DELAY_S * 0.9, "sent before the peer could have connected"
        reply = channel.recv(timeout_s=30, peer_alive=lambda: True, what="the echo")
        assert reply == {"echo": message}
        assert peer.wait(timeout=30) == 0
    finally:
        peer.kill()
        channel.close()


def test_background_send_to_a_peer_that_dies_first_raises_peer_lost_in_the_waiting_thread():
    channel = SideChannel(new_endpoint(), bind=True)
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    try:
        pending = channel.send_in_background({"x": 1}, peer_alive=lambda: dead.poll() is None, timeout_s=60)
        started = time.monotonic()
        with pytest.raises(PeerLost, match="exited before it could receive"):
            pending.wait()
        assert time.monotonic() - started < 10
    finally:
        channel.close()


def test_background_send_times_out_with_the_limit_in_the_message():
    channel = SideChannel(new_endpoint(), bind=True)
    try:
        pending = channel.send_in_background({"x": 1}, peer_alive=lambda: True, timeout_s=0.5)
        with pytest.raises(TimeoutError, match="did not connect within"):
            pending.wait()
    finally:
        channel.close()


def test_unpicklable_message_fails_in_the_caller_before_any_thread_starts():
    channel = SideChannel(new_endpoint(), bind=True)
    try:
        with pytest.raises(TypeError, match="pickle"):
            channel.send_in_background({"lock": threading.Lock()}, peer_alive=lambda: True, timeout_s=1)
    finally:
        channel.close()
