"""``EdgeAccCpuPlatform``: an out-of-tree sglang platform whose device is the host CPU.

The in-tree CPU engine (``SGLANG_USE_CPU_ENGINE=1``) needs sgl-kernel's CPU ops;
this one runs on the pure-PyTorch paths every platform has (``torch_native``
attention, ``forward_native`` custom ops, ``pytorch`` sampling, gloo), so it
works on any x86 or Arm host with the stock PyPI wheels. The few places where
upstream assumes CUDA once several ranks talk are fixed by the patch
``patches.cpu_platform``.
"""

from __future__ import annotations

import logging
import os


from sglang.srt.platforms.cpu import CpuDeviceMixin
from sglang.srt.platforms.device_mixin import PlatformEnum
from sglang.srt.platforms.interface import PlatformCapabilities, SRTPlatform

logger = logging.getLogger(__name__)

# Host RAM is not GPU memory: upstream's mem_fraction_static (about 0.7 of the
# device) would reserve most of the machine for KV. A small pool is what a CPU
# development server needs; --max-total-tokens still overrides it.
DEFAULT_MAX_TOTAL_TOKENS = 4096


class EdgeAccCpuPlatform(CpuDeviceMixin, SRTPlatform):
    _enum = PlatformEnum.OOT
    device_name = "cpu"
    device_type = "cpu"
    capabilities = PlatformCapabilities()

    def get_device(self, device_id: int = 0) -> str:
        # sglang's device auto-detection calls .split(":") on this value.
        del device_id
        return "cpu"

    def get_default_attention_backend(self) -> str:
        return "torch_native"

    def get_dispatch_key_name(self) -> str:
        return "native"

    def get_torch_distributed_backend_str(self) -> str:
        return "gloo"

    def is_pin_memory_available(self, device=None) -> bool:
        del device
        return False

    def apply_server_args_defaults(self, server_args) -> None:
        # intel_amx (the in-tree CPU default on x86) needs sgl-kernel's CPU ops.
        server_args.attention_backend = "torch_native"
        server_args.sampling_backend = "pytorch"
        if server_args.max_total_tokens is None:
            server_args.max_total_tokens = DEFAULT_MAX_TOTAL_TOKENS
        ranks = server_args.tp_size * server_args.dp_size * server_args.pp_size
        if ranks > 1 and not os.environ.get("SGLANG_CPU_OMP_THREADS_BIND"):
            # Upstream asserts this is set when ranks outnumber NUMA nodes; give
            # each rank its own cores, round-robin over the host's. Set in the
            # launcher, so the scheduler processes inherit it.
            os.environ["SGLANG_CPU_OMP_THREADS_BIND"] = _thread_binding(ranks)
            logger.info("SGLANG_CPU_OMP_THREADS_BIND=%s", os.environ["SGLANG_CPU_OMP_THREADS_BIND"])


def _thread_binding(ranks: int) -> str:
    cores = sorted(os.sched_getaffinity(0))
    groups = [cores[i::ranks] or [cores[i % len(cores)]] for i in range(ranks)]
    return "|".join(",".join(map(str, group)) for group in groups)
