"""The prefill side's process: started with its decode side's scheduler, given its start once the pools exist.

Most of a prefill side's start-up before it can map the shared state is a new
Python process importing sglang (about 10 s on a small CPU host, 25 s on a GPU
host), and none of it needs the decode side. So the decode side starts the
process as the first thing its scheduler does, and the import runs while the
decode side loads its weights and allocates its pools. The process then waits
for what only those give (:class:`PrefillStart`: the ports chosen once for the
whole TP group, this rank's GPU and ranks) and runs upstream's scheduler with it.

Its environment (role, channel, SM split, MPS priority) is fixed when it starts,
before it touches CUDA, as for any spawned scheduler. It dies with the decode
side from its first line (the parent-death signal); and if the decode side ends
its start without sending the start, its end of the pipe closes and the wait
here ends with nothing run.
"""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass
from typing import Any, Optional

from sglang_edgeacc.edge_acc_server.child_failure import die_with_decode_side


@dataclass(frozen=True)
class PrefillStart:
    """Upstream's scheduler arguments for the prefill side, but the ready pipe (the process holds that one)."""

    server_args: Any
    port_args: Any
    gpu_id: int
    tp_rank: int
    pp_rank: int
    dp_rank: Optional[int]


def run_prefill_side(start_reader, ready_writer) -> None:
    """The process's target: import, wait for the start, run upstream's scheduler process."""
    die_with_decode_side("[edgeacc prefill]")
    from sglang.srt.managers.scheduler import run_scheduler_process  # the long part

    try:
        start = start_reader.recv()
    except (EOFError, OSError):
        return  # the decode side ended its start before it had one to give
    finally:
        start_reader.close()
    assert isinstance(start, PrefillStart), type(start)
    mp.current_process().name = f"edgeacc-prefill-tp{start.tp_rank}"
    run_scheduler_process(start.server_args, start.port_args, start.gpu_id, start.tp_rank, start.pp_rank,
                          start.dp_rank, ready_writer)

