"""Each EdgeAcc side captures only its own CUDA graphs, on upstream's real config and server-args records."""

from __future__ import annotations

import pickle

from sglang.srt.model_executor.cuda_graph_config import Backend, default_cuda_graph_config
from sglang.srt.server_args import prepare_server_args

from sglang_edgeacc.edge_acc_server.graph_roles import keep_decode_graphs_only, prefill_side_server_args
from sglang_edgeacc.tiny_model import model_dir


def _record(prefill_backend=Backend.BREAKABLE):
    server_args = prepare_server_args(["--model-path", str(model_dir()), "--load-format", "dummy"])
    config = default_cuda_graph_config()
    config.decode.backend, config.prefill.backend = Backend.FULL, prefill_backend
    server_args.cuda_graph_config = config  # what the CUDA platform resolves to
    return server_args


def test_decode_sides_skip_prefill_graphs_and_the_prefill_side_gets_them_back_without_decode_graphs():
    server_args = _record()
    keep_decode_graphs_only(server_args)
    # The record every decode side inherits (it crosses processes pickled).
    decode_side = pickle.loads(pickle.dumps(server_args))
    assert decode_side.cuda_graph_config.prefill.backend == Backend.DISABLED
    assert decode_side.cuda_graph_config.decode.backend == Backend.FULL
    prefill_side = prefill_side_server_args(decode_side)
    assert prefill_side.cuda_graph_config.prefill.backend == Backend.BREAKABLE
    assert prefill_side.cuda_graph_config.decode.backend == Backend.DISABLED
    assert prefill_side.disable_decode_cuda_graph and not prefill_side.disable_prefill_cuda_graph
    # The decode side's own record is untouched by making its prefill side's.
    assert decode_side.cuda_graph_config.decode.backend == Backend.FULL


def test_prefill_graphs_the_user_turned_off_stay_off_on_the_prefill_side():
    server_args = _record(prefill_backend=Backend.DISABLED)
    server_args.disable_prefill_cuda_graph = True
    keep_decode_graphs_only(server_args)
    prefill_side = prefill_side_server_args(server_args)
    assert prefill_side.cuda_graph_config.prefill.backend == Backend.DISABLED
    assert prefill_side.disable_prefill_cuda_graph


def test_without_a_graph_config_the_records_are_left_alone():
    server_args = prepare_server_args(["--model-path", str(model_dir()), "--load-format", "dummy"])
    server_args.cuda_graph_config = None  # the CPU platform's
    keep_decode_graphs_only(server_args)
    assert prefill_side_server_args(server_args) is server_args
