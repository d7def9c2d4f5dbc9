"""Weight updates with EdgeAcc: upstream's, in place, checked afterwards.

Upstream updates the weights in place on the decode side (``/update_weights_from_disk``,
``_from_tensor``, ``_from_distributed``, ``_from_ipc``), and the prefill side maps that
same memory, so it computes with the new weights without being told. An update that
*replaced* a tensor's memory instead (a loader that re-allocates, a quantization that
repacks) would leave the prefill side on the old weights, and the two sides would
disagree without a word. So after every update the decode side checks that each
parameter and buffer still lives where the prefill side mapped it, and otherwise stops
the server with the reason.

Before a method that writes the weights, the batch at the prefill side (if any) is
waited for: its forward reads the memory the update writes, and one that ran across
an update would compute part of its layers with each set of weights. Upstream lets an
update in only while no request runs, except while generation is paused, when it
applies the update at once.
"""

from __future__ import annotations

import functools
import itertools
import logging
from typing import Callable

import torch

logger = logging.getLogger(__name__)

UPDATE_METHODS = (
    "update_weights_from_disk",
    "update_weights_from_tensor",
    "update_weights_from_distributed",
    "update_weights_from_ipc",
)
# Writes weights too (restores packed ones) but leaves them where they were.
WRITING_METHODS = UPDATE_METHODS + ("begin_weight_update",)


class SharedWeightsMoved(RuntimeError):
    """A weight update replaced memory the prefill side maps."""


def storage_addresses(model: torch.nn.Module) -> dict[str, int]:
    tensors = itertools.chain(model.named_parameters(), model.named_buffers())
    return {name: t.untyped_storage().data_ptr() for name, t in tensors}


class GuardedWeightUpdater:
    """Upstream's weight-updater component, its writing methods run with the prefill side idle and its
    update methods checked; everything else passes through.

    ``settle`` returns once no forward of the prefill side reads the weights.
    """

    def __init__(self, updater, get_model: Callable[[], torch.nn.Module], log_prefix: str,
                 settle: Callable[[str], None]):
        self._updater = updater
        self._get_model = get_model
        self._log_prefix = log_prefix
        self._settle = settle
        self._shared = storage_addresses(get_model())

    def __getattr__(self, name: str):
        attribute = getattr(self._updater, name)
        return self._guarded(attribute, name) if name in WRITING_METHODS else attribute

    def _guarded(self, method, name: str):
        @functools.wraps(method)
        def run(*args, **kwargs):
            self._settle(name)
            output = method(*args, **kwargs)
            if name not in UPDATE_METHODS:
                return output
            now = storage_addresses(self._get_model())
            moved = sorted(n for n in self._shared if now.get(n) != self._shared[n])
            if moved:
                raise SharedWeightsMoved(
                    f"{self._log_prefix} {name} replaced the memory of {len(moved)} weight tensors "
                    f"(e.g. {', '.join(moved[:3])}) that the prefill side maps, so it would keep computing "
                    "with the old weights. EdgeAcc supports in-place weight updates only: restart the "
                    "server on the new weights, or serve this model without --enable-edge-acc."
                )
            logger.info("%s %s: weights updated in place; the prefill side sees them", self._log_prefix, name)
            return output

        return run
