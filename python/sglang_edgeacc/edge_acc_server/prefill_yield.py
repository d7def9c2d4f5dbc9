"""The prefill side steps aside, layer by layer, while a decode step runs (``--edge-acc-prefill-yield on``).

Beside a prefill a decode step runs three to four times longer than alone: its
kernels wait for SMs the prefill's blocks hold, and the two sides together keep
little more than either alone. So the decode pacer's interval is mostly one long
decode step beside a slowed prefill. With this on, the decode side raises a flag
in the GPU memory the two sides share from the start of its first layer to the
end of its last, and before each of its layers the prefill side's stream runs a
one-block kernel that returns once the flag is down. A decode step then runs
about as short as alone (the prefill's layer in flight finishes beside it), and
the prefill side has the GPU alone for the rest of the pacer's interval.

The flag is set and read on the devices' streams, never by the host: both ends are
kernels, captured into each side's CUDA graphs like the layers around them. The
wait is bounded (:data:`MAX_POLLS` reads, a fraction of a second), so a decode
side that dies with the flag up slows the prefill side's forward; it cannot stop it.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

import torch

logger = logging.getLogger(__name__)

# The name the flag travels under in the decode side's shared tensors.
FLAG_NAME = "yield.decode_running"
# Bound of one wait: each read of the flag is a trip to L2 (a fraction of a microsecond to one),
# so about 0.1-0.5 s; a decode step lasts milliseconds.
MAX_POLLS = 1 << 19
# The same bound on the CPU platform, where the wait is the host's.
MAX_WAIT_S = 0.25

Wait = Callable[[torch.Tensor], None]


def decoder_layers(model: torch.nn.Module) -> Optional[torch.nn.ModuleList]:
    """The model's stack of decoder layers (``model.model.layers``), or None where it has none."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
        return layers
    return None


def new_flag(device) -> torch.Tensor:
    """The decode side's flag: one int32 on its device, 0 while no decode layer runs."""
    return torch.zeros(1, dtype=torch.int32, device=device)


def raise_during_layers(model: torch.nn.Module, flag: torch.Tensor) -> bool:
    """Decode side: the flag is 1 from the first layer's start to the last layer's end.

    Both writes are stream-ordered fills, so a CUDA graph captured over the layers
    replays them with the step. False: the model has no layer stack to mark.
    """
    layers = decoder_layers(model)
    if layers is None:
        return False

    def raise_flag(module, args) -> None:
        flag.fill_(1)

    def lower_flag(module, args, output) -> None:
        flag.fill_(0)

    layers[0].register_forward_pre_hook(raise_flag)
    layers[-1].register_forward_hook(lower_flag)
    return True


def wait_before_layers(model: torch.nn.Module, flag: torch.Tensor, wait: Wait) -> bool:
    """Prefill side: before each layer, ``wait(flag)`` holds the layer back while the flag is up.

    The wait runs once here, so that a kernel is built and loaded before any graph
    captures it. False: the model has no layer stack.
    """
    layers = decoder_layers(model)
    if layers is None:
        return False

    def wait_for_decode(module, args) -> None:
        wait(flag)

    wait(flag)
    for layer in layers:
        layer.register_forward_pre_hook(wait_for_decode)
    return True


def host_wait(flag: torch.Tensor) -> None:
    """The CPU platform's wait: the host polls the shared flag, for :data:`MAX_WAIT_S` at most."""
    deadline = time.monotonic() + MAX_WAIT_S
    while int(flag[0]) != 0 and time.monotonic() < deadline:
        time.sleep(0.0002)


_device_wait_kernel = None


def _kernel():
    global _device_wait_kernel
    if _device_wait_kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def wait_while_set(flag_ptr, polls_left):
            value = tl.load(flag_ptr, volatile=True)
            while (value != 0) & (polls_left > 0):
                value = tl.load(flag_ptr, volatile=True)
                polls_left -= 1

        _device_wait_kernel = wait_while_set
    return _device_wait_kernel


def device_wait(flag: torch.Tensor) -> None:
    """On the current stream: a one-block kernel that ends once the flag reads 0 (or the bound ran out).

    The host does not wait; what the stream runs after it does.
    """
    _kernel()[(1,)](flag, MAX_POLLS, num_warps=1)


def wait_for(device: torch.device) -> Wait:
    return device_wait if torch.device(device).type == "cuda" else host_wait
