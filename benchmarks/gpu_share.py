"""How much of the GPU each EdgeAcc side gets in the real server, from its own work counters.

The decode side counts, with ``--enable-metrics``, the work each side did and the time it took
(``sglang_edgeacc_prefill_*``, ``sglang_edgeacc_decode_*`` on upstream's ``/metrics``). Scraped
before and after a workload, they give:

* the prefill side's achieved TFLOP/s while a batch is in its hands (linear layers from the prompt
  tokens, attention from the causal query-key pairs), and the share of the workload it was busy;
* the decode side's achieved GB/s per step (every weight once, plus the KV cache of every
  sequence in the batch), separately for steps that ran beside a prefill batch and alone;

each against the H200's measured ceilings. FLOPs and bytes come from the model's ``config.json``
(a dense decoder of Qwen3/Llama shape, bf16 weights and KV cache); norms, rotary embeddings,
sampling and the prefill's one row of logits per request are left out, so both figures are
slight underestimates of the work done.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

import requests

# The H200's ceilings as stated for this project (a large bf16 matmul, a device-to-device copy);
# not re-measured by this script.
H200_BF16_TFLOPS = 790.0
H200_COPY_GBPS = 4300.0

PREFILL_COUNTERS = ("prefill_tokens", "prefill_attention_pairs", "prefill_forward_seconds")
DECODE_COUNTERS = ("decode_steps", "decode_step_seconds", "decode_step_requests", "decode_context_tokens")
BESIDE = ("yes", "no")
# Counters read per label value: the series (less prefix and _total) -> the key's first part, the labels after it.
LABELLED_COUNTERS = {
    "prefill_batches": ("prefill_batches", ()),
    "prefill_path_seconds": ("prefill_path", ("part",)),
    "decode_step_part_seconds": ("decode_part", ("beside_prefill", "part")),
}

PREFIX = "sglang_edgeacc_"
# Upstream's own latency histograms, on both arms: a request's time to its first token, and the
# scheduler's stages of it (request_process: received to queued; queue: queued to its first
# forward; prefill_forward: that forward to its result processed).
UPSTREAM_HISTOGRAMS = {"sglang:time_to_first_token_seconds": "ttft", "sglang:queue_time_seconds": "queue",
                       "sglang:per_stage_req_latency_seconds": "stage"}
STAGES = ("request_process", "prefill_forward")
# The decode loop's parts in the order a pass goes through them (decode_side.py's marks).
DECODE_PARTS = ("requests", "prefill hand-off", "pacing", "decode batch", "decode launch", "decode results",
                "garbage collection")


def _upstream_sample(sample) -> str | None:
    for family, key in UPSTREAM_HISTOGRAMS.items():
        for end in ("_sum", "_count"):
            if sample.name != family + end:
                continue
            if key == "stage":
                stage = sample.labels.get("stage")
                return f"stage.{stage}{end}" if stage in STAGES else None
            return key + end
    return None


def _edgeacc_key(sample) -> str | None:
    """Where one of EdgeAcc's counter samples goes in :func:`parse_counters`' result, or None."""
    if not sample.name.startswith(PREFIX) or not sample.name.endswith("_total"):
        return None
    name = sample.name[len(PREFIX):-len("_total")]
    if name in LABELLED_COUNTERS:
        first, labels = LABELLED_COUNTERS[name]
        return ".".join([first, *(str(sample.labels.get(label)) for label in labels)])
    if name in PREFILL_COUNTERS:
        return name
    beside = sample.labels.get("beside_prefill")
    return f"{name}.{beside}" if name in DECODE_COUNTERS and beside in BESIDE else None


def parse_counters(text: str) -> dict[str, float]:
    """EdgeAcc's work counters and upstream's first-token latencies from a ``/metrics`` page, summed over ranks.

    Decode counters are kept per ``beside_prefill`` value, as ``decode_steps.yes`` and so on;
    the prefill path's parts as ``prefill_path.<part>``, the decode loop's parts as
    ``decode_part.<beside_prefill>.<part>``; upstream's histograms as sums and counts.
    """
    # Imported here: the benchmark runs without it unless --gpu-share asks for the counters.
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = _upstream_sample(sample) or _edgeacc_key(sample)
            if key is not None:
                out[key] = out.get(key, 0.0) + sample.value
    return out


def scrape(url: str) -> dict[str, float]:
    return parse_counters(requests.get(f"{url}/metrics", timeout=30).text)


@dataclass(frozen=True)
class ModelCosts:
    linear_flops_per_token: float  # 2 x the weights of every matmul a token goes through
    attention_flops_per_pair: float  # QK^T and PV for one query-key pair, all layers and heads
    weight_bytes: float  # what a decode step reads of the weights (lm_head included)
    kv_bytes_per_token: float  # what a decode step reads of one cached token

    @classmethod
    def from_config(cls, config: dict, dtype_bytes: int = 2) -> "ModelCosts":
        hidden = config["hidden_size"]
        layers = config["num_hidden_layers"]
        heads = config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads", heads)
        head_dim = config.get("head_dim") or hidden // heads
        inter = config["intermediate_size"]
        vocab = config["vocab_size"]
        per_layer = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2 + 3 * hidden * inter
        linear = layers * per_layer
        return cls(
            linear_flops_per_token=2.0 * linear,
            attention_flops_per_pair=4.0 * layers * heads * head_dim,
            weight_bytes=float(dtype_bytes) * (linear + vocab * hidden),
            kv_bytes_per_token=float(dtype_bytes) * layers * 2 * kv_heads * head_dim,
        )

    @classmethod
    def from_model_dir(cls, model_dir: str | pathlib.Path) -> "ModelCosts":
        return cls.from_config(json.loads((pathlib.Path(model_dir) / "config.json").read_text()))


def shares(before: dict[str, float], after: dict[str, float], costs: ModelCosts, duration_s: float,
           tflops_ceiling: float = H200_BF16_TFLOPS, gbps_ceiling: float = H200_COPY_GBPS) -> dict:
    """Each side's achieved rate and busy share over one workload (``after`` minus ``before``)."""
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(before) | set(after)}
    out: dict = {"latency_ms": mean_latencies(delta)}
    busy_s = delta.get("prefill_forward_seconds", 0.0)
    if busy_s > 0:
        flops = (delta.get("prefill_tokens", 0.0) * costs.linear_flops_per_token
                 + delta.get("prefill_attention_pairs", 0.0) * costs.attention_flops_per_pair)
        tflops = flops / busy_s / 1e12
        out["prefill"] = {"busy_share": busy_s / duration_s if duration_s else None,
                          "tokens": delta.get("prefill_tokens", 0.0),
                          "tflops": tflops, "of_ceiling": tflops / tflops_ceiling}
    for beside in BESIDE:
        steps = delta.get(f"decode_steps.{beside}", 0.0)
        seconds = delta.get(f"decode_step_seconds.{beside}", 0.0)
        if steps <= 0 or seconds <= 0:
            continue
        context = delta.get(f"decode_context_tokens.{beside}", 0.0)
        moved = steps * costs.weight_bytes + context * costs.kv_bytes_per_token
        gbps = moved / seconds / 1e9
        out[f"decode_beside_prefill_{beside}"] = {
            "steps": steps, "step_ms": seconds / steps * 1e3,
            "batch": delta.get(f"decode_step_requests.{beside}", 0.0) / steps,
            "gbps": gbps, "of_ceiling": gbps / gbps_ceiling,
            "parts_ms": {key.split(".", 2)[2]: value / steps * 1e3 for key, value in delta.items()
                         if key.startswith(f"decode_part.{beside}.")},
        }
    return out


def mean_latencies(delta: dict[str, float]) -> dict[str, float]:
    """Mean milliseconds of upstream's first-token stages per request and of the prefill path's parts per batch."""
    out = {}
    for key in ("ttft", "queue", *(f"stage.{s}" for s in STAGES)):
        count = delta.get(f"{key}_count", 0.0)
        if count > 0:
            out[key] = delta.get(f"{key}_sum", 0.0) / count * 1e3
    batches = delta.get("prefill_batches", 0.0)
    if batches > 0:
        for key, value in delta.items():
            if key.startswith("prefill_path."):
                out[key] = value / batches * 1e3
    return out


def share_table(arms: dict) -> str:
    """Markdown rows of each arm's and workload's shares, where the run recorded them."""
    lines = ["| arm | workload | prefill busy | prefill TFLOP/s (of ceiling) | decode beside prefill: step ms, "
             "batch, GB/s (of ceiling) | decode alone: step ms, batch, GB/s (of ceiling) |",
             "|---|---|---:|---:|---|---|"]
    found = False
    for arm, entry in arms.items():
        for workload, result in entry.get("workloads", {}).items():
            share = result.get("gpu_share") if isinstance(result, dict) else None
            if not share:
                continue
            found = True
            pre = share.get("prefill")
            cells = [f"{pre['busy_share']:.0%}" if pre and pre.get("busy_share") is not None else "-",
                     f"{pre['tflops']:.0f} ({pre['of_ceiling']:.0%})" if pre else "-"]
            for beside in BESIDE:
                d = share.get(f"decode_beside_prefill_{beside}")
                cells.append(f"{d['step_ms']:.1f}, {d['batch']:.0f}, {d['gbps']:.0f} ({d['of_ceiling']:.0%})"
                             if d else "-")
            lines.append(f"| {arm} | {workload} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if found else ""


LATENCY_COLUMNS = ("ttft", "stage.request_process", "queue", "stage.prefill_forward",
                   *(f"prefill_path.{part}" for part in
                     ("schedule", "to_prefill_side", "unpack", "forward", "to_decode_side", "result")))


def latency_table(arms: dict) -> str:
    """Markdown rows of mean milliseconds: per request, upstream's first-token stages (both arms); per
    prefill batch, the parts of EdgeAcc's prefill path."""
    lines = ["| arm | workload | " + " | ".join(c.split(".")[-1] for c in LATENCY_COLUMNS) + " |",
             "|---|---|" + "---:|" * len(LATENCY_COLUMNS)]
    found = False
    for arm, entry in arms.items():
        for workload, result in entry.get("workloads", {}).items():
            latency = ((result.get("gpu_share") or {}).get("latency_ms") if isinstance(result, dict) else None)
            if not latency:
                continue
            found = True
            cells = [f"{latency[c]:.1f}" if c in latency else "-" for c in LATENCY_COLUMNS]
            lines.append(f"| {arm} | {workload} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if found else ""


def step_part_table(arms: dict) -> str:
    """Markdown rows of mean milliseconds per decode step in each part of the decode loop, beside a
    prefill batch and alone, where the run recorded them: which part a change made longer."""
    rows, parts = [], []
    for arm, entry in arms.items():
        for workload, result in entry.get("workloads", {}).items():
            share = result.get("gpu_share") if isinstance(result, dict) else None
            for beside in BESIDE:
                step = (share or {}).get(f"decode_beside_prefill_{beside}") or {}
                if step.get("parts_ms"):
                    rows.append((arm, workload, beside, step))
                    parts += [p for p in step["parts_ms"] if p not in parts]
    if not rows:
        return ""
    parts.sort(key=lambda p: (DECODE_PARTS.index(p) if p in DECODE_PARTS else len(DECODE_PARTS), p))
    lines = ["| arm | workload | beside prefill | step ms | " + " | ".join(parts) + " |",
             "|---|---|---|---:|" + "---:|" * len(parts)]
    for arm, workload, beside, step in rows:
        cells = [f"{step['parts_ms'][p]:.2f}" if p in step["parts_ms"] else "-" for p in parts]
        lines.append(f"| {arm} | {workload} | {beside} | {step['step_ms']:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
