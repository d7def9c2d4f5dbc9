"""What both EdgeAcc schedulers add to upstream's ``Scheduler``.

An EdgeAcc process is one side for its whole life, so each side is a class of
its own: :class:`~sglang_edgeacc.edge_acc_server.decode_side.DecodeSideScheduler`
and :class:`~sglang_edgeacc.edge_acc_server.prefill_side.PrefillSideScheduler`.
``patches.edge_acc`` installs the one of the process's side in place of
``sglang.srt.managers.scheduler.Scheduler`` (a class REPLACE), and only in the
scheduler processes of an EdgeAcc launch; every other launch constructs
upstream's class untouched. This base holds only what the two share: the log
prefix, and the event loop hand-over.
"""

from __future__ import annotations

from sglang.srt.managers.scheduler import Scheduler

from sglang_edgeacc.edge_acc_server import roles


class EdgeAccSchedulerBase(Scheduler):
    def _edge_tp_rank(self) -> int:
        from sglang.srt.runtime_context import get_parallel

        try:
            return int(get_parallel().tp_rank)
        except Exception:  # before the rank bundle is published
            return 0

    def _edge_log_prefix(self) -> str:
        return roles.log_prefix(self._edge_tp_rank())

    # Upstream's run_event_loop sets up what every loop runs under (the schedule
    # stream, distinct from the forward stream; the WAR barrier; time accounting)
    # and then picks the overlap or the normal loop: both are the side's loop here.
    def event_loop_overlap(self) -> None:
        self._edge_event_loop()

    def event_loop_normal(self) -> None:
        self._edge_event_loop()

    def _edge_event_loop(self) -> None:
        raise NotImplementedError
