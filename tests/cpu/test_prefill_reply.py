"""What the prefill side replies with: host data only, on upstream's real logits output."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.layers.logits_processor import LogitsProcessorOutput

from sglang_edgeacc.edge_acc_server.messages import PrefillResult
from sglang_edgeacc.edge_acc_server.prefill_side import PrefillSideScheduler, host_logits_output


def _borrowed_output():
    """A prefill output as upstream's graph-pool-borrow path leaves it: input-logprob
    spans still being copied, behind an event."""
    spans = [[torch.tensor([[-1.0, -2.0]]), torch.tensor([[-3.0, -4.0]])]]
    return LogitsProcessorOutput(
        next_token_logits=torch.zeros(1, 8),
        next_token_logprobs=torch.tensor([-0.5]),
        input_token_logprobs=torch.tensor([-1.5, -2.5]),
        input_top_logprobs_val=spans,
        input_top_logprobs_idx=[[torch.tensor([[1, 2]]), torch.tensor([[3, 4]])]],
        input_logprobs_copy_done=torch.Event("cpu"),
    )


def test_a_reply_from_the_graph_borrow_path_pickles_with_its_spans_flattened():
    output = _borrowed_output()
    result = SimpleNamespace(next_token_ids=torch.tensor([7]), logits_output=output)
    batch = SimpleNamespace(return_logprob=True, return_hidden_states=False)
    reply = PrefillSideScheduler._edge_prefill_reply(None, SimpleNamespace(seq=3), batch, result)
    assert isinstance(reply, PrefillResult) and reply.seq == 3 and reply.next_token_ids == [7]
    sent = pickle.loads(pickle.dumps(reply))  # an event in it would raise here
    assert sent.logits_output.input_logprobs_copy_done is None
    # What upstream's finalize makes of the spans: one row list per sequence.
    assert sent.logits_output.input_top_logprobs_val == [[[-1.0, -2.0], [-3.0, -4.0]]]
    assert sent.logits_output.next_token_logits is None


def test_an_event_left_on_the_output_is_dropped_not_pickled():
    output = _borrowed_output()
    moved = host_logits_output(output, return_logprob=True, return_hidden_states=False)
    assert moved.input_logprobs_copy_done is None
    assert moved.input_token_logprobs.device.type == "cpu"
    pickle.dumps(moved)
    plain = host_logits_output(_borrowed_output(), return_logprob=False, return_hidden_states=False)
    assert plain.input_logprobs_copy_done is None
    pickle.dumps(plain)


def test_the_decode_side_relays_a_replys_tokens_on_the_device_and_processes_them_on_the_host(monkeypatch):
    # A device whose tensors have no values ("meta") stands for the GPU: reading one on the host raises,
    # as reading a CUDA tensor waits for its stream. The relay feeds the next decode step and must get
    # the device tensor; result processing reads every token and must get a host one.
    from sglang_edgeacc.edge_acc_server import upstream_mirror
    from sglang_edgeacc.edge_acc_server.decode_pacing import DecodePacer
    from sglang_edgeacc.edge_acc_server.decode_side import DecodeSideScheduler
    from sglang_edgeacc.edge_acc_server.metrics import EdgeAccStats

    seen = {}

    def relay(scheduler, batch, result):
        seen["relayed"] = result.next_token_ids.device.type

    def process(batch, result):
        seen["processed"] = result.next_token_ids.tolist()

    monkeypatch.setattr(upstream_mirror, "after_forward", relay)
    clock = SimpleNamespace(now=1.0)
    pacer = DecodePacer(itl_slo_ms=50.0, clock=lambda: clock.now)
    side = SimpleNamespace(edge_acc_stats=EdgeAccStats(), process_batch_result=process, decode_pacer=pacer,
                           tp_worker=SimpleNamespace(model_runner=SimpleNamespace(device="meta")))
    batch = SimpleNamespace(batch_size=lambda: 2)
    inflight = SimpleNamespace(batch=batch, scheduled_at=0.0, sent_at=0.0)
    reply = PrefillResult(seq=1, next_token_ids=[5, 9], logits_output=None, forward_ms=1.0)
    assert DecodeSideScheduler._edge_process_prefill(side, inflight, reply) is batch
    assert seen == {"relayed": "meta", "processed": [5, 9]}
    # The pacer knows the first tokens went out: beside a prefill, their requests' next step is due within
    # the aimed 45 ms of them (no step timed yet to start it sooner).
    clock.now = 1.010
    assert pacer.next_step(prefill_busy=True, prompts_waiting=False).wait_s == pytest.approx(0.035)
