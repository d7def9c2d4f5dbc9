"""The DeepEP HCCL buffer model against the kernel formulas, computed by hand.

Every expected value below is written as the arithmetic of the sgl-kernel-npu
check it models (``hccl_budget.py`` names the kernel sources), with the
per-token slot sizes worked out in comments, so a reader can redo it on paper.

DeepSeek-V3.2: hidden 7168, top-k 8, 256 routed experts. Slots:
  normal dispatch slot = align512(align32(7168 * 2) + 44) = align512(14336 + 44 = 14380) = 14848 (29 x 512)
  combine slot         = align512(7168 * 2) = 14336 (28 x 512); x2 = 28672 while ant-moving runs > 1 round
  int8 LL dispatch slot (A3) = align512(align32(7168 * 1) + 44 = 7212) = 7680 (15 x 512)
"""

from __future__ import annotations

import math

import pytest

from sglang_edgeacc.ascend import hccl_budget as hb
from sglang_edgeacc.ascend.buffer_setting import BufferSetting, auto_buffer_mb, configured_buffer
from sglang_edgeacc.ascend.dispatch_inputs import AntMoving, ModelShape, ant_moving_problems, model_shape_from_config
from sglang_edgeacc.ascend.dispatch_plan import dispatch_modes

MB = 1024 * 1024
DSV32 = ModelShape(hidden_size=7168, topk=8, num_experts=256)


def mb_ceil(nbytes: int) -> int:
    return math.ceil(nbytes / MB)


def test_slot_sizes_are_512_aligned_bf16_slots():
    assert hb.align_up(hb.align_up(7168 * 2, 32) + 44, 512) == 14848
    assert hb.align_up(7168 * 2, 512) == 14336


# ----------------------------------------------------------------- normal dispatch


def test_a3_normal_ant_moving_off():
    req = hb.normal_requirement("a3", DSV32, ranks=16, tokens_per_rank=4096)
    # maxBs = min(per-round 8192 (default), 4096) = 4096; one round -> combine slot not doubled
    expected = (4096 * 8 * (14848 + 14336) + 4 * MB + 102 * MB) * 2
    assert req.required_bytes == expected
    assert req.required_mb == mb_ceil(expected) == 2036
    assert [t.name for t in req.terms][:3] == ["token slots", "combine state window", "notify dispatch window"]


def test_a3_normal_ant_moving_off_caps_at_one_8192_round():
    req = hb.normal_requirement("a3", DSV32, ranks=16, tokens_per_rank=8192)
    expected = (8192 * 8 * (14848 + 14336) + 4 * MB + 102 * MB) * 2
    assert req.required_mb == mb_ceil(expected) == 3860  # the reference's 3860 MB; the doc formula says 2024


def test_a3_normal_ant_moving_on():
    req = hb.normal_requirement("a3", DSV32, ranks=16, tokens_per_rank=3000, ant_moving=AntMoving(8, 512))
    # maxBs = min(per-round 512, 3000) = 512; 8 rounds -> combine slot doubled to 28672
    expected = (512 * 8 * (14848 + 2 * 14336) + 4 * MB + 102 * MB) * 2
    assert req.required_bytes == expected
    assert req.required_mb == 552


def test_a3_normal_ant_moving_single_round_does_not_double_combine():
    req = hb.normal_requirement("a3", DSV32, ranks=16, tokens_per_rank=1000, ant_moving=AntMoving(1, 2048))
    expected = (1000 * 8 * (14848 + 14336) + 4 * MB + 102 * MB) * 2
    assert req.required_bytes == expected


def test_a2_one_node_normal_ant_moving_off():
    req = hb.normal_requirement("a2", DSV32, ranks=8, tokens_per_rank=8192)
    # A2 (ops2) constants: 8 MB combine state, 404 MB notify window, then 4 state slots of 2 MB after the x2
    expected = (8192 * 8 * (14848 + 14336) + 8 * MB + 404 * MB) * 2 + 4 * 2 * MB
    assert req.required_bytes == expected
    assert req.required_mb == 4480


def test_a2_one_node_normal_ant_moving_on():
    req = hb.normal_requirement("a2", DSV32, ranks=8, tokens_per_rank=4096, ant_moving=AntMoving(4, 1024))
    expected = (1024 * 8 * (14848 + 2 * 14336) + 8 * MB + 404 * MB) * 2 + 4 * 2 * MB
    assert req.required_bytes == expected
    assert req.required_mb == 1512


def test_int8_does_not_shrink_normal_slots():
    # The normal dispatch slot is sized with MAX_OUT_DTYPE_SIZE = 2 whatever the payload, so
    # there is no int8 argument to give; the same call answers for both.
    assert hb.normal_requirement("a3", DSV32, 16, 2048).required_bytes == (2048 * 8 * (14848 + 14336) + 106 * MB) * 2


def test_a2_two_nodes_normal_is_the_layered_combine_minimum():
    req = hb.normal_requirement("a2", DSV32, ranks=16, tokens_per_rank=4096)
    # servers 2 x bs 4096 x (h*2 + 4 int32 per top-k entry) + 4 MB IPC + 800 MB RDMA + 400 MB notify
    expected = 2 * 4096 * (7168 * 2 + 4 * 8 * 4) + 4 * MB + 800 * MB + 400 * MB
    assert req.required_bytes == expected
    assert req.required_mb == 1317
    assert "layered" in req.path


def test_a2_two_nodes_normal_scales_with_tokens():
    req = hb.normal_requirement("a2", DSV32, ranks=16, tokens_per_rank=512)
    assert req.required_bytes == 2 * 512 * (14336 + 128) + 1204 * MB


def test_a2_two_nodes_refuses_ant_moving():
    with pytest.raises(hb.UnsupportedDispatch, match="ant-moving"):
        hb.normal_requirement("a2", DSV32, ranks=16, tokens_per_rank=512, ant_moving=AntMoving(8, 512))


def test_a3_two_nodes_stays_on_the_one_domain_formula():
    # A3 superpods keep one HCCS domain: 32 ranks use the same tiling check as 16.
    assert hb.normal_requirement("a3", DSV32, 32, 2125).required_bytes == hb.normal_requirement("a3", DSV32, 16, 2125).required_bytes
    # 68000 prefill tokens over 32 ranks (the official A3 V3.2 prefill recipe): fits its HCCL_BUFFSIZE=1200
    assert hb.normal_requirement("a3", DSV32, 32, math.ceil(68000 / 32)).required_mb <= 1200


def test_doc_formula_taken_literally_underestimates():
    # docs: 2 * (102MB + 4MB + TOTAL_SEQ_LEN * (h + h) * topk) + 20MB, hidden_size counted as bytes
    doc = 2 * (102 * MB + 4 * MB + 8192 * (7168 + 7168) * 8) + 20 * MB
    assert mb_ceil(doc) == 2024
    assert hb.normal_requirement("a3", DSV32, 16, 8192).required_mb > mb_ceil(doc) + 1800


# ----------------------------------------------------------------- low-latency dispatch


def test_a3_low_latency_bf16():
    req = hb.low_latency_requirement("a3", DSV32, ranks=16, max_dispatch_tokens_per_rank=256)
    # (bs * dispatch slot * all experts + bs * combine slot * (k + shared 0)) * 2
    expected = (256 * 14848 * 256 + 256 * 14336 * 8) * 2
    assert req.required_bytes == expected
    assert req.required_mb == 1912  # sgl-kernel-npu's CI uses 1913 for this case


def test_a3_low_latency_int8():
    req = hb.low_latency_requirement("a3", DSV32, ranks=16, max_dispatch_tokens_per_rank=8, int8_dispatch=True)
    expected = (8 * 7680 * 256 + 8 * 14336 * 8) * 2
    assert req.required_bytes == expected
    assert req.required_mb == 32


def test_a3_low_latency_counts_redundant_and_shared_experts():
    shape = ModelShape(7168, 8, 256 + 32, shared_expert_num=1)
    req = hb.low_latency_requirement("a3", shape, ranks=16, max_dispatch_tokens_per_rank=64)
    assert req.required_bytes == (64 * 14848 * 288 + 64 * 14336 * (8 + 1)) * 2


def test_a2_one_node_low_latency_tiling_binds_and_ignores_int8():
    req = hb.low_latency_requirement("a2", DSV32, ranks=8, max_dispatch_tokens_per_rank=128, int8_dispatch=True)
    # A2's ops2 always sizes dispatch slots for bf16 (14848), int8 or not
    tiling = (128 * 14848 * 256 + 128 * 14336 * 8) * 2
    kernel = (128 * 8 * min(256 // 8, 8) * 7168 * 2 + 2 * MB) * 2
    assert tiling > kernel
    assert req.required_bytes == tiling
    assert req.required_mb == 956


def test_a2_one_node_low_latency_kernel_assert_binds_for_a_tiny_model():
    tiny = ModelShape(hidden_size=128, topk=2, num_experts=8)
    req = hb.low_latency_requirement("a2", tiny, ranks=8, max_dispatch_tokens_per_rank=1)
    # tiling: slot align512(align32(256) + 44) = 512, combine align512(256) = 512
    tiling = (1 * 512 * 8 + 1 * 512 * 2) * 2
    # kernel: bs 1 x ranks 8 x min(1 local expert, k 2) x h 128 x 2 B, plus 2 MB state, twice
    kernel = (1 * 8 * 1 * 128 * 2 + 2 * MB) * 2
    assert kernel > tiling
    assert req.required_bytes == kernel
    assert req.required_mb == 5


def test_a2_two_nodes_low_latency_layered():
    req = hb.low_latency_requirement("a2", DSV32, ranks=16, max_dispatch_tokens_per_rank=32)
    # experts 256 x bs 32 x (h*2 + 4 x align8(k=8) x 4 B) + 4 MB + 800 MB
    expected = 256 * 32 * (7168 * 2 + 4 * 8 * 4) + 4 * MB + 800 * MB
    assert req.required_bytes == expected
    assert req.required_mb == 917


def test_a2_two_nodes_low_latency_aligns_topk_to_8():
    shape = ModelShape(7168, 6, 256)
    req = hb.low_latency_requirement("a2", shape, ranks=16, max_dispatch_tokens_per_rank=32)
    assert req.required_bytes == 256 * 32 * (7168 * 2 + 4 * 8 * 4) + 804 * MB  # k 6 counts as 8


# ----------------------------------------------------------------- settings and inputs


def test_buffer_precedence_and_default():
    assert configured_buffer({}) == BufferSetting(200, "default")
    assert configured_buffer({"HCCL_BUFFSIZE": "1500"}).mb == 1500
    both = configured_buffer({"HCCL_BUFFSIZE": "1500", "DEEPEP_HCCL_BUFFSIZE": "900"})
    assert (both.mb, both.source, both.explicit) == (900, "DEEPEP_HCCL_BUFFSIZE", True)
    assert configured_buffer({"DEEPEP_HCCL_BUFFSIZE": "", "HCCL_BUFFSIZE": "700"}).source == "HCCL_BUFFSIZE"
    with pytest.raises(ValueError, match="HCCL_BUFFSIZE='1.5G'"):
        configured_buffer({"HCCL_BUFFSIZE": "1.5G"})


def test_auto_margin():
    assert auto_buffer_mb(1317) == (1317 + 200, 200)  # 10% = 132 < 200
    assert auto_buffer_mb(3860) == (3860 + 386, 386)


def test_ant_moving_limits():
    assert ant_moving_problems(AntMoving(8, 512)) == []
    assert ant_moving_problems(AntMoving(16, 8192)) == []  # product 131072 is the limit itself
    assert any("131072" in p for p in ant_moving_problems(AntMoving(17, 8192)))
    assert any("ROUND=0" in p for p in ant_moving_problems(AntMoving(0, 512)))
    assert any("PER_ROUND_TOKENS=16" in p for p in ant_moving_problems(AntMoving(2, 16)))


def test_model_shape_from_config():
    cfg = {"hidden_size": 7168, "num_experts_per_tok": 8, "n_routed_experts": 256, "n_shared_experts": 1}
    assert model_shape_from_config(cfg) == DSV32
    assert model_shape_from_config(cfg, redundant_experts=32).num_experts == 288
    qwen = {"hidden_size": 4096, "num_experts_per_tok": 8, "num_experts": 128}
    assert model_shape_from_config(qwen).num_experts == 128
    with pytest.raises(ValueError, match="n_routed_experts"):
        model_shape_from_config({"hidden_size": 5120, "num_experts_per_tok": 0})


def test_deepep_mode_auto_needs_both():
    assert dispatch_modes("auto") == ("normal", "low_latency")
    assert dispatch_modes("normal") == ("normal",)
    assert dispatch_modes("low_latency") == ("low_latency",)


def test_layered_only_for_a2_beyond_one_server():
    assert hb.is_layered("a2", 16) and not hb.is_layered("a2", 8) and not hb.is_layered("a3", 32)


def test_buffer_model_imports_only_the_standard_library():
    import ast
    import sys

    from sglang_edgeacc.ascend import buffer_setting, dispatch_inputs

    model = {m.__name__: m for m in (hb, buffer_setting, dispatch_inputs)}
    for module in model.values():
        tree = ast.parse(open(module.__file__, encoding="utf-8").read())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        outside = {name for name in imported if name not in model}
        tops = {name.split(".")[0] for name in outside}
        assert tops <= set(sys.stdlib_module_names) | {"__future__"}, (module.__name__, outside)
