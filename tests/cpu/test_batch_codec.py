"""A prefill batch's message grows with the batch, not with the tokenizer or the pool it points into."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_edgeacc.edge_acc_server.batch_codec import LocalObjects, pack_prefill_batch, unpack_prefill_batch
from tests import serving_models


def _production_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    directory = tmp_path / "tok"
    serving_models.write_production_tokenizer(directory)
    return AutoTokenizer.from_pretrained(directory)


def _batch(tokenizer, pool: torch.Tensor, n: int = 4):
    reqs = [SimpleNamespace(rid=f"r{i}", origin_input_ids=list(range(50)), tokenizer=tokenizer, grammar=None)
            for i in range(n)]
    # Slots handed out as a view of the allocator's pool-sized free list.
    return SimpleNamespace(reqs=reqs, out_cache_loc=pool[100:100 + 50 * n], sampling_info=None,
                           seq_lens=torch.full((n,), 50))


def test_the_tokenizer_travels_by_reference_and_tensors_without_their_storage(tmp_path):
    tokenizer = _production_tokenizer(tmp_path)
    assert len(tokenizer) > 150_000
    pool = torch.arange(700_000, dtype=torch.int64)  # a 700k-token pool's free list: 5.6 MB
    packed = pack_prefill_batch(_batch(tokenizer, pool), tokenizer=tokenizer)
    # Four requests of 50 tokens: kilobytes, not the 7.8 MB tokenizer nor the 5.6 MB pool.
    assert len(packed) < 64_000, len(packed)
    local_tokenizer = object()
    local = LocalObjects(req_to_token_pool=None, token_to_kv_pool=None, token_to_kv_pool_allocator=None,
                         model_config=None, tokenizer=local_tokenizer)
    batch = unpack_prefill_batch(packed, local)
    assert all(req.tokenizer is local_tokenizer for req in batch.reqs)
    assert torch.equal(batch.out_cache_loc, torch.arange(100, 300))
    assert batch.out_cache_loc.untyped_storage().nbytes() == 200 * 8


def test_without_the_reference_the_tokenizer_would_be_in_every_message(tmp_path):
    tokenizer = _production_tokenizer(tmp_path)
    small_pool = torch.arange(1000, dtype=torch.int64)
    # The control: the same batch packed without naming the tokenizer carries all of it.
    assert len(pack_prefill_batch(_batch(tokenizer, small_pool))) > 5_000_000


def _processor_batch(n: int = 3):
    """Real requests of a batch with custom logit processors: sglang gives each request with a processor
    a weak proxy of itself in its custom params; the batch's sampling info holds the deserialized
    processor, an instance of a class defined inside a function."""
    from array import array

    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor
    from sglang.srt.sampling.sampling_batch_info import ProcessorEntry
    from sglang.srt.sampling.sampling_params import SamplingParams

    class ForceToken(CustomLogitProcessor):  # local, as users write them in scripts and notebooks
        def __call__(self, logits, custom_param_list=None):
            forced = torch.full_like(logits, float("-inf"))
            for row, params in enumerate(custom_param_list):
                forced[row, params["token_id"]] = 0.0
            return forced

    serialized = ForceToken.to_str()
    reqs = []
    for i in range(n):
        with_processor = i != 1
        params = SamplingParams(max_new_tokens=4, custom_params={"token_id": 10 + i} if with_processor else None)
        reqs.append(Req(f"r{i}", "", array("q", [1, 2, 3]), params,
                        custom_logit_processor=serialized if with_processor else None))
    rows = [0, 2]
    info = SimpleNamespace(
        has_custom_logit_processor=True,
        custom_params=[r.sampling_params.custom_params for r in reqs],
        custom_logit_processor={hash(serialized): ProcessorEntry(
            processor=CustomLogitProcessor.from_str(serialized), rows=rows, indices=torch.tensor(rows))},
        penalizer_orchestrator=None,
    )
    return SimpleNamespace(reqs=reqs, sampling_info=info, out_cache_loc=torch.arange(9))


def _local() -> LocalObjects:
    return LocalObjects(req_to_token_pool=None, token_to_kv_pool=None, token_to_kv_pool_allocator=None,
                        model_config=None)


def test_a_custom_logit_processor_of_a_local_class_crosses_as_its_serialized_form():
    batch = _processor_batch()
    sent = pack_prefill_batch(batch)
    received = unpack_prefill_batch(sent, _local())

    (entry,) = received.sampling_info.custom_logit_processor.values()
    assert entry.rows == [0, 2]
    logits = torch.zeros(2, 32)
    out = entry.processor(logits, [received.sampling_info.custom_params[i] for i in entry.rows])
    assert out.argmax(dim=1).tolist() == [10, 12]
    # The params in the sampling info are the requests' own, and "__req__" is a live proxy of the
    # request it belongs to on this side (processors read the request's state through it).
    for index in (0, 2):
        params = received.reqs[index].sampling_params.custom_params
        assert received.sampling_info.custom_params[index] is params
        assert params["__req__"].rid == f"r{index}"
        params["__req__"].output_ids.append(99)  # the request itself, not a copy sent behind the proxy
        assert list(received.reqs[index].output_ids) == [99]
    assert received.reqs[1].sampling_params.custom_params is None


def test_a_part_that_cannot_be_pickled_is_named_with_the_request_that_holds_it():
    from sglang_edgeacc.edge_acc_server.batch_codec import PrefillBatchNotSendable

    class Unpicklable:
        def __reduce__(self):
            raise TypeError("built to be unpicklable")

    batch = _processor_batch()
    batch.reqs[2].payload = {"inner": Unpicklable()}
    with pytest.raises(PrefillBatchNotSendable) as caught:
        pack_prefill_batch(batch)
    (part,) = caught.value.parts
    assert (part.path, part.type_name, part.req_index) == ("batch.reqs[2].payload['inner']", "Unpicklable", 2)
    assert "batch.reqs[2].payload['inner'] (Unpicklable)" in str(caught.value)

    # Left out, the rest of the batch crosses: the part arrives as None, everything else as it was.
    received = unpack_prefill_batch(pack_prefill_batch(batch, leave_out=caught.value.object_ids), _local())
    assert received.reqs[2].payload == {"inner": None}
    assert [r.rid for r in received.reqs] == ["r0", "r1", "r2"]


def test_a_part_of_the_batch_itself_is_named_without_a_request():
    import threading

    from sglang_edgeacc.edge_acc_server.batch_codec import PrefillBatchNotSendable

    batch = _processor_batch()
    batch.lock = threading.Lock()
    with pytest.raises(PrefillBatchNotSendable) as caught:
        pack_prefill_batch(batch)
    assert [(p.path, p.req_index) for p in caught.value.parts] == [("batch.lock", None)]


def test_the_decode_side_fails_only_the_requests_that_hold_an_unsendable_part():
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    from sglang_edgeacc.edge_acc_server.batch_codec import UnsendablePart
    from sglang_edgeacc.edge_acc_server.decode_side import fail_unsendable_requests

    reqs = [SimpleNamespace(rid=f"r{i}", to_finish=None) for i in range(3)]
    failed = fail_unsendable_requests(reqs, (UnsendablePart("batch.reqs[1].payload", "Lock", 1),), "[test]")
    assert failed == [reqs[1]]
    assert reqs[0].to_finish is None and reqs[2].to_finish is None
    reason = reqs[1].to_finish
    assert isinstance(reason, FINISH_ABORT) and reason.status_code == 400
    assert "batch.reqs[1].payload (Lock) cannot be pickled" in reason.message

    reqs = [SimpleNamespace(rid=f"r{i}", to_finish=None) for i in range(2)]
    assert fail_unsendable_requests(reqs, (UnsendablePart("batch.lock", "lock", None),), "[test]") == reqs


def _python_calls(action) -> int:
    import sys

    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        action()
    finally:
        sys.setprofile(None)
    return calls


def test_packing_makes_no_python_call_per_token():
    # A retracted request comes back to prefill with the tokens it had generated, in a plain list.
    short, long = _processor_batch(), _processor_batch()
    for req in short.reqs:
        req.output_ids = list(range(10))
    for req in long.reqs:
        req.output_ids = list(range(5_000))
    extra = _python_calls(lambda: pack_prefill_batch(long)) - _python_calls(lambda: pack_prefill_batch(short))
    # 14,970 more tokens; a hook called per object would make that many more calls.
    assert extra < 100, extra
    received = unpack_prefill_batch(pack_prefill_batch(long), _local())
    assert [list(r.output_ids) for r in received.reqs] == [list(range(5_000))] * 3


def test_a_part_left_out_may_be_a_plain_container():
    from sglang_edgeacc.edge_acc_server.batch_codec import PrefillBatchNotSendable

    class Unpicklable:
        def __reduce__(self):
            raise TypeError("built to be unpicklable")

    batch = _processor_batch()
    nested = [Unpicklable()]
    for _ in range(7):
        nested = [nested]
    # The search for the smallest unpicklable part stops this deep, at a plain list.
    batch.reqs[0].payload = nested
    with pytest.raises(PrefillBatchNotSendable) as caught:
        pack_prefill_batch(batch)
    (part,) = caught.value.parts
    assert part.type_name == "list" and part.req_index == 0
    received = unpack_prefill_batch(pack_prefill_batch(batch, leave_out=caught.value.object_ids), _local())
    assert [r.rid for r in received.reqs] == ["r0", "r1", "r2"]
    inner = received.reqs[0].payload
    while inner is not None:
        inner = inner[0]  # down to the part sent as None


class _RecordingPlacement:
    def __init__(self):
        self.placed = []

    def place(self, host, device):
        block = host.to(device).clone()
        self.placed.append((block, device))
        return block


def test_a_messages_device_tensors_travel_as_one_block_and_arrive_as_views_of_one_buffer(monkeypatch):
    # On the CPU the packer never meets a device tensor: the tensors marked here stand for the batch's
    # device tensors, everything else about the trip is the real codec's.
    from sglang_edgeacc.edge_acc_server import batch_codec

    base = torch.arange(40, dtype=torch.int64)
    on_device = {
        "input_ids": torch.arange(6),
        "out_cache_loc": base[3:9],  # a view of a larger storage (a free list)
        "strided": base.view(5, 8)[:, ::3],  # not contiguous
        "bf16": torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(0.75, dtype=torch.float64),
        "empty": torch.empty((0, 3), dtype=torch.float16),
        "int32": torch.tensor([3, 3], dtype=torch.int32),
    }
    marked = {id(t) for t in on_device.values()}
    monkeypatch.setattr(batch_codec, "_travels_on_the_device", lambda t: id(t) in marked)
    batch = SimpleNamespace(reqs=[], sampling_info=None, again=on_device["input_ids"], on_host=torch.ones(2),
                            **on_device)
    message = pack_prefill_batch(batch)
    local = LocalObjects(req_to_token_pool=None, token_to_kv_pool=None, token_to_kv_pool_allocator=None,
                         model_config=None)
    placement = _RecordingPlacement()
    got = unpack_prefill_batch(message, local, placement)
    # One transfer for the whole message, however many device tensors it holds.
    assert len(placement.placed) == 1 and placement.placed[0][1] == "cpu"
    block = placement.placed[0][0]
    for name, sent in on_device.items():
        received = getattr(got, name)
        assert received.dtype == sent.dtype and received.shape == sent.shape and torch.equal(received, sent), name
        assert received.untyped_storage().data_ptr() == block.untyped_storage().data_ptr(), name
        assert received.data_ptr() % 16 == block.data_ptr() % 16, name  # every tensor aligned in the block
    # The one sent twice is still one tensor; a host tensor stays where it was, with a storage of its own.
    assert got.again is got.input_ids
    assert torch.equal(got.on_host, torch.ones(2)) and got.on_host.untyped_storage().nbytes() == 8
    # The block holds the tensors' own elements, not the storages they are views of.
    assert block.numel() <= len(on_device) * 256
    # Without a placement the block goes to its device all the same.
    plain = unpack_prefill_batch(message, local)
    assert torch.equal(plain.strided, on_device["strided"]) and plain.again is plain.input_ids


def test_a_message_refers_to_its_device_tensors_only_through_the_unpacker(monkeypatch):
    import pickle

    from sglang_edgeacc.edge_acc_server import batch_codec

    tensor = torch.arange(4)
    monkeypatch.setattr(batch_codec, "_travels_on_the_device", lambda t: t is tensor)
    _, _, body = pickle.loads(pack_prefill_batch(SimpleNamespace(reqs=[], sampling_info=None, ids=tensor)))
    with pytest.raises(pickle.UnpicklingError, match="unpack_prefill_batch"):
        pickle.loads(body)


def test_host_tensors_of_every_kind_a_batch_holds_survive_the_trip_as_their_own_bytes():
    base = torch.arange(40, dtype=torch.int64)
    tensors = {
        "int64": torch.arange(7, dtype=torch.int64),
        "int32_view": base.to(torch.int32)[3:9],  # a view of a larger storage
        "strided": base.view(5, 8)[:, ::3],  # not contiguous
        "bf16": torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16),
        "float32_2d": torch.randn(3, 4),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(0.75, dtype=torch.float64),
        "empty": torch.empty((0, 3), dtype=torch.float16),
    }
    shared = torch.arange(5)
    batch = SimpleNamespace(reqs=[], sampling_info=None, again=shared, shared=shared, **tensors)
    got = unpack_prefill_batch(pack_prefill_batch(batch), _local())
    for name, sent in tensors.items():
        received = getattr(got, name)
        assert received.dtype == sent.dtype and received.shape == sent.shape, name
        assert torch.equal(received, sent), name
        assert received.untyped_storage().nbytes() == sent.numel() * sent.element_size(), name
    assert got.again is got.shared  # one tensor sent twice is one tensor received
    got.int64.add_(1)  # writable, as the forward may write into what it is given
    assert torch.equal(got.int64, torch.arange(1, 8))


def test_a_batchs_tensors_take_no_nested_torch_serialization():
    # torch's own reduction of a tensor pickles its storage through a nested pickler and a class per
    # storage: most of the time a real prefill batch took to pack and unpack.
    empty = SimpleNamespace(reqs=[], sampling_info=None)
    batch = SimpleNamespace(reqs=[], sampling_info=None,
                            **{f"t{i}": torch.arange(2048, dtype=torch.int64) for i in range(10)})
    message, empty_message = pack_prefill_batch(batch), pack_prefill_batch(empty)  # imports done
    unpack_prefill_batch(message, _local())
    per_tensor_pack = (_python_calls(lambda: pack_prefill_batch(batch))
                       - _python_calls(lambda: pack_prefill_batch(empty))) / 10
    per_tensor_unpack = (_python_calls(lambda: unpack_prefill_batch(message, _local()))
                         - _python_calls(lambda: unpack_prefill_batch(empty_message, _local()))) / 10
    assert per_tensor_pack < 15 and per_tensor_unpack < 10, (per_tensor_pack, per_tensor_unpack)


def test_a_real_prefill_batch_arrives_with_every_tensor_the_forward_reads():
    from sglang.srt.runtime_context import create_context, use_context
    from sglang.srt.server_args import ServerArgs

    from benchmarks import codec_cost
    from sglang_edgeacc.tiny_model import model_dir

    args = ServerArgs(model_path=str(model_dir()), load_format="dummy", device="cpu")
    with use_context(create_context(args, role="scheduler")):
        batch, local = codec_cost.real_prefill_batch(requests=2, tokens=300)
        got = unpack_prefill_batch(pack_prefill_batch(batch), LocalObjects(**local))
        for name in ("prefill_input_ids_cpu", "seq_lens", "seq_lens_cpu", "orig_seq_lens", "out_cache_loc",
                     "req_pool_indices", "req_pool_indices_cpu"):
            sent, received = getattr(batch, name), getattr(got, name)
            assert received.dtype == sent.dtype and torch.equal(received, sent), name
        info, got_info = batch.sampling_info, got.sampling_info
        for name in ("temperatures", "top_ps", "top_ks", "min_ps"):
            assert torch.equal(getattr(got_info, name), getattr(info, name)), name
        assert got.req_to_token_pool is local["req_to_token_pool"]
        assert [r.rid for r in got.reqs] == ["r0", "r1"] and list(got.reqs[1].origin_input_ids) == list(
            batch.reqs[1].origin_input_ids)
        # The benchmark's control still packs the same batch through torch's reduction.
        result = codec_cost.measure(requests=1, tokens=64, repeat=1)
        assert result["message_bytes"] > 0 and result["control_pack_ms"] > 0
