"""EdgeAcc's own numbers, kept by the decode side.

The Prometheus series are registered only where ``--enable-metrics`` asks for
them, with upstream's multiprocess collector (the scheduler processes already
write there), so they appear on upstream's ``/metrics`` endpoint.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial

logger = logging.getLogger(__name__)


@dataclass
class EdgeAccStats:
    handoffs: int = 0
    last_handoff_s: float = 0.0
    last_prefill_forward_ms: float = 0.0
    last_message_bytes: int = 0
    _prometheus: object = field(default=None, repr=False)
    _decode_series: dict = field(default_factory=dict, repr=False)
    _part_series: dict = field(default_factory=dict, repr=False)
    _labels: dict = field(default_factory=dict, repr=False)

    def enable_prometheus(self, labels: dict[str, str], prefill_sm_percent: int, decode_sm_percent: int,
                          registry=None) -> None:
        """``registry``: where the series go; prometheus_client's default registry unless given."""
        import prometheus_client

        target = prometheus_client.REGISTRY if registry is None else registry
        Counter, Gauge, Histogram = (partial(kind, registry=target) for kind in (
            prometheus_client.Counter, prometheus_client.Gauge, prometheus_client.Histogram))

        names = list(labels)
        self._labels = dict(labels)
        self._prometheus = {
            "handoff": Histogram(
                "sglang_edgeacc_prefill_handoff_seconds",
                "Time from sending a prefill batch to the prefill side until its first tokens are back.",
                names, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            ).labels(**labels),
            "message_bytes": Histogram(
                "sglang_edgeacc_prefill_message_bytes",
                "Size of one prefill batch as sent to the prefill side.",
                names, buckets=(1e3, 4e3, 16e3, 64e3, 256e3, 1e6, 4e6, 16e6, 64e6),
            ).labels(**labels),
            "batches": Counter(
                "sglang_edgeacc_prefill_batches", "Prefill batches run by the prefill side.", names
            ).labels(**labels),
            "prefill_batch_size": Gauge(
                "sglang_edgeacc_prefill_batch_size", "Requests in the last prefill batch.", names,
                multiprocess_mode="mostrecent",
            ).labels(**labels),
            "prefill_queue": Gauge(
                "sglang_edgeacc_prefill_queue_length", "Requests waiting for the prefill side.", names,
                multiprocess_mode="mostrecent",
            ).labels(**labels),
            "decode_running": Gauge(
                "sglang_edgeacc_decode_running_requests", "Requests the decode side is decoding.", names,
                multiprocess_mode="mostrecent",
            ).labels(**labels),
            # The work each side did and the time it took, for what share of the GPU each side
            # gets: a reader turns tokens and token pairs into FLOPs, context tokens into bytes.
            "prefill_seconds": Counter(
                "sglang_edgeacc_prefill_forward_seconds",
                "Wall time of the prefill side's batches, from taking one to its reply.", names,
            ).labels(**labels),
            "prefill_path": Counter(
                "sglang_edgeacc_prefill_path_seconds",
                "Time prefill batches spent in each part of their way: schedule (admission and packing on the "
                "decode side), to_prefill_side, unpack, forward (with the fence and the host sync), "
                "to_decode_side (the reply until the decode loop takes it), result (result processing, which "
                "streams the first tokens).", names + ["part"],
            ),
            "prefill_tokens": Counter(
                "sglang_edgeacc_prefill_tokens", "Prompt tokens the prefill side computed.", names,
            ).labels(**labels),
            "prefill_pairs": Counter(
                "sglang_edgeacc_prefill_attention_pairs",
                "Query-key pairs of the prefill side's causal attention (each new token against its "
                "prefix and the new tokens up to it).", names,
            ).labels(**labels),
            "decode_steps": Counter(
                "sglang_edgeacc_decode_steps", "Timed decode steps (each right after another).",
                names + ["beside_prefill"],
            ),
            "decode_seconds": Counter(
                "sglang_edgeacc_decode_step_seconds", "Time between two consecutive decode results.",
                names + ["beside_prefill"],
            ),
            "decode_requests": Counter(
                "sglang_edgeacc_decode_step_requests", "Requests in the timed decode steps.",
                names + ["beside_prefill"],
            ),
            "decode_context": Counter(
                "sglang_edgeacc_decode_context_tokens",
                "Tokens of KV cache the timed decode steps attended to.", names + ["beside_prefill"],
            ),
            "decode_parts": Counter(
                "sglang_edgeacc_decode_step_part_seconds",
                "Where the time between two consecutive decode results went: each part of the decode loop "
                "(requests, prefill hand-off, pacing, decode batch, decode launch, decode results, garbage "
                "collection); the parts of a step add up to its time.", names + ["beside_prefill", "part"],
            ),
            "sm_percent": Gauge(
                "sglang_edgeacc_sm_percent", "Configured SM share of each side.", names + ["side"],
                multiprocess_mode="mostrecent",
            ),
        }
        # Resolved once: the decode loop records every step.
        self._decode_series = {
            beside: tuple(self._prometheus[name].labels(**labels, beside_prefill="yes" if beside else "no")
                          for name in ("decode_steps", "decode_seconds", "decode_requests", "decode_context"))
            for beside in (True, False)
        }
        self._prometheus["sm_percent"].labels(**labels, side="prefill").set(prefill_sm_percent)
        self._prometheus["sm_percent"].labels(**labels, side="decode").set(decode_sm_percent)

    @property
    def enabled(self) -> bool:
        return self._prometheus is not None

    def record_handoff(self, seconds: float, forward_ms: float, batch_size: int,
                       tokens: int = 0, attention_pairs: int = 0, path: dict[str, float] | None = None) -> None:
        self.handoffs += 1
        self.last_handoff_s = seconds
        self.last_prefill_forward_ms = forward_ms
        if self._prometheus:
            self._prometheus["handoff"].observe(seconds)
            self._prometheus["batches"].inc()
            self._prometheus["prefill_batch_size"].set(batch_size)
            self._prometheus["prefill_seconds"].inc(forward_ms / 1e3)
            self._prometheus["prefill_tokens"].inc(tokens)
            self._prometheus["prefill_pairs"].inc(attention_pairs)
            for part, part_s in (path or {}).items():
                self._prometheus["prefill_path"].labels(**self._labels, part=part).inc(max(0.0, part_s))

    def record_decode_step(self, step, requests: int, context_tokens: int) -> None:
        """One timed decode step (a :class:`~sglang_edgeacc.edge_acc_server.decode_step_times.DecodeStep`,
        from the decode side's step clock), its requests and the KV tokens they attended to."""
        if not self._prometheus:
            return
        steps, seconds, in_step, context = self._decode_series[step.beside_prefill]
        steps.inc()
        seconds.inc(step.seconds)
        in_step.inc(requests)
        context.inc(context_tokens)
        beside = "yes" if step.beside_prefill else "no"
        for part, part_s in step.parts.items():
            series = self._part_series.get((beside, part))
            if series is None:
                series = self._prometheus["decode_parts"].labels(**self._labels, beside_prefill=beside, part=part)
                self._part_series[(beside, part)] = series
            series.inc(part_s)

    def record_message(self, nbytes: int) -> None:
        self.last_message_bytes = nbytes
        if self._prometheus:
            self._prometheus["message_bytes"].observe(nbytes)

    def record_queues(self, waiting: int, running: int) -> None:
        if self._prometheus:
            self._prometheus["prefill_queue"].set(waiting)
            self._prometheus["decode_running"].set(running)

