"""Reading a checkpoint's JSON files: MTP layer present or not, and how it is quantised."""

from __future__ import annotations

import json
import os

from sglang_edgeacc.ascend.checkpoint import read_checkpoint

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "ascend")


def fixture(name):
    return read_checkpoint(os.path.join(FIXTURES, name))


def test_w8a8_without_mtp_weights():
    ck = fixture("dsv32_w8a8_no_mtp")
    assert ck.readable and ck.problems == ()
    assert ck.num_hidden_layers == 61 and ck.num_nextn_predict_layers == 1
    assert ck.mtp_prefix == "model.layers.61."
    assert ck.mtp_weights_present() is False
    assert ck.main_quantization() == "W8A8_DYNAMIC"
    assert ck.mtp_quantization() is None


def test_w8a8_with_quantized_mtp():
    ck = fixture("dsv32_w8a8_mtp")
    assert ck.mtp_weights_present() is True
    assert ck.main_quantization() == ck.mtp_quantization() == "W8A8_DYNAMIC"


def test_w8a8_with_bf16_mtp():
    ck = fixture("dsv32_w8a8_mtp_bf16")
    assert ck.mtp_weights_present() is True
    assert (ck.main_quantization(), ck.mtp_quantization()) == ("W8A8_DYNAMIC", "FLOAT")


def test_bf16_checkpoint_has_no_description():
    ck = fixture("dsv32_bf16_mtp")
    assert ck.mtp_weights_present() is True
    assert ck.main_quantization() is None and ck.mtp_quantization() is None


def test_config_without_nextn_layers():
    assert fixture("dsv32_w8a8_no_nextn_config").num_nextn_predict_layers == 0


def test_no_index_means_unknown_and_broken_json_is_a_problem(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_nextn_predict_layers": 1}))
    ck = read_checkpoint(str(tmp_path))
    assert ck.weight_names is None and ck.mtp_weights_present() is None
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    ck = read_checkpoint(str(tmp_path))
    assert ck.problems and "model.safetensors.index.json" in ck.problems[0]


def test_only_the_three_json_files_are_opened(tmp_path, monkeypatch):
    for name in ("config.json", "model.safetensors.index.json", "quant_model_description.json"):
        src = os.path.join(FIXTURES, "dsv32_w8a8_mtp", name)
        (tmp_path / name).write_bytes(open(src, "rb").read())
    (tmp_path / "model-00001-of-00004.safetensors").write_bytes(b"\0" * 16)
    opened = []
    real_open = open

    def spy(path, *a, **k):
        opened.append(os.path.basename(str(path)))
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", spy)
    read_checkpoint(str(tmp_path))
    assert sorted(opened) == ["config.json", "model.safetensors.index.json", "quant_model_description.json"]
