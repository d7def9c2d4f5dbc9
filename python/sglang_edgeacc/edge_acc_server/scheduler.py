"""``EdgeAccScheduler``: upstream's ``Scheduler`` with the two EdgeAcc roles.

Installed in place of ``sglang.srt.managers.scheduler.Scheduler`` (a class
REPLACE, see ``patches.edge_acc``) only in the scheduler processes of an
EdgeAcc launch; every other launch constructs upstream's class untouched.
"""

from __future__ import annotations

import contextlib
import logging
import os

from sglang.srt.managers.scheduler import Scheduler

from sglang_edgeacc.edge_acc_server import roles
from sglang_edgeacc.edge_acc_server.decode_side import DecodeSideMixin
from sglang_edgeacc.edge_acc_server.metrics import EdgeAccStats
from sglang_edgeacc.edge_acc_server.prefill_side import PrefillSideMixin
from sglang_edgeacc.flags import get_flags

logger = logging.getLogger(__name__)


def _set_process_title(title: str) -> None:
    # Operators (and the tests) tell the two sides apart in ps/top by this.
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(title)


def drop_load_snapshot_writer(scheduler) -> None:
    """Close a scheduler's load-snapshot writer and remove the file it writes.

    A prefill side has an instance id of its own (``port_plan``), so upstream's
    writer creates a ``/dev/shm/sglang_loads_*`` file for it that nobody reads: the
    DP controller and the tokenizer read the decode sides' instance. Upstream never
    unlinks these files, so each start would leave one more behind.
    """
    from sglang.srt.managers.load_snapshot import ShmLoadSnapshotWriter

    writer, scheduler.load_snapshot_writer = scheduler.load_snapshot_writer, None
    if writer is None:
        return
    writer.close()
    if isinstance(writer, ShmLoadSnapshotWriter):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(writer.path)


def _metrics_enabled() -> bool:
    from sglang.srt.runtime_context import get_observability

    return bool(get_observability().enable_metrics)


class EdgeAccScheduler(PrefillSideMixin, DecodeSideMixin, Scheduler):
    def __init__(self, server_args, port_args, *args, **kwargs):
        self.edge_acc_role = roles.role()
        self.edge_acc_stats = EdgeAccStats()
        self._edge_decode_port_args = port_args
        if self.edge_acc_role == roles.PREFILL:
            _set_process_title("sglang::scheduler_edgeacc_prefill")
            self._edge_prefill_connect()
        super().__init__(server_args, port_args, *args, **kwargs)
        flags = get_flags(server_args)
        if self.edge_acc_role == roles.DECODE and _metrics_enabled():
            self.edge_acc_stats.enable_prometheus(
                {"tp_rank": str(self._edge_ranks.tp_rank)},
                flags.edge_acc_prefill_sm_percent, flags.edge_acc_decode_sm_percent,
            )

    def _edge_tp_rank(self) -> int:
        from sglang.srt.runtime_context import get_parallel

        try:
            return int(get_parallel().tp_rank)
        except Exception:  # before the rank bundle is published
            return 0

    def _edge_log_prefix(self) -> str:
        return roles.log_prefix(self._edge_tp_rank())

    def init_ipc_channels(self, port_args):
        super().init_ipc_channels(port_args)
        if self.edge_acc_role == roles.PREFILL:
            drop_load_snapshot_writer(self)

    def init_memory_pools(self):
        super().init_memory_pools()
        if self.edge_acc_role == roles.PREFILL:
            # Before attention backends and graphs are built over the pools.
            self._edge_prefill_adopt()

    def init_model_worker(self):
        super().init_model_worker()
        if self.edge_acc_role == roles.PREFILL:
            self._edge_prefill_verify()
        if self.edge_acc_role == roles.DECODE:
            # After the worker is complete: its TP group picks the prefill sides' ports.
            self._edge_decode_start_prefill_side()

    # Upstream's run_event_loop sets up what every loop runs under (the schedule
    # stream, distinct from the forward stream; the WAR barrier; time accounting)
    # and then picks the overlap or the normal loop: both are EdgeAcc's here.
    def event_loop_overlap(self) -> None:
        self._edge_event_loop()

    def event_loop_normal(self) -> None:
        self._edge_event_loop()

    def _edge_event_loop(self) -> None:
        if self.edge_acc_role == roles.PREFILL:
            self.event_loop_edge_acc_prefill()
        else:
            self.event_loop_edge_acc_decode()
