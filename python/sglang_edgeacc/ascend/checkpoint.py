"""What a checkpoint directory says about its MoE shape and its MTP (NextN) layer.

Only three small JSON files are read — ``config.json``,
``model.safetensors.index.json`` and ModelSlim's ``quant_model_description.json``
— never a weight file, so the preflight costs nothing on a multi-hundred-GB model.

DeepSeek-V3/V3.2 layout: the main model is ``model.layers.0 .. N-1`` with
``N = num_hidden_layers``; the MTP module sglang's NEXTN/EAGLE loads from the same
checkpoint is ``model.layers.N`` (``num_nextn_predict_layers`` of them, 1 for
DeepSeek). sglang's loader skips tensors that are not there without an error,
so a checkpoint exported without the MTP layer starts with an uninitialised
draft model; that is why it is checked here.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
QUANT_DESCRIPTION = "quant_model_description.json"
UNQUANTIZED = "FLOAT"  # ModelSlim's value for a tensor kept in bf16


@dataclass(frozen=True)
class CheckpointFacts:
    path: str
    config: Optional[dict] = None
    weight_names: Optional[frozenset[str]] = None  # keys of the index's weight_map; None without an index
    quant_description: Optional[dict] = None
    problems: tuple[str, ...] = field(default_factory=tuple)  # files that exist but cannot be read

    @property
    def readable(self) -> bool:
        return self.config is not None

    @property
    def num_hidden_layers(self) -> Optional[int]:
        value = (self.config or {}).get("num_hidden_layers")
        return int(value) if value is not None else None

    @property
    def num_nextn_predict_layers(self) -> int:
        return int((self.config or {}).get("num_nextn_predict_layers") or 0)

    @property
    def mtp_prefix(self) -> Optional[str]:
        layers = self.num_hidden_layers
        return None if layers is None else f"model.layers.{layers}."

    def mtp_weights_present(self) -> Optional[bool]:
        """True/False from the index; None when there is no index to tell (single-file checkpoint)."""
        if self.weight_names is None or self.mtp_prefix is None:
            return None
        return any(name.startswith(self.mtp_prefix) for name in self.weight_names)

    def _quant_types(self, in_mtp: bool) -> Counter:
        prefix = self.mtp_prefix
        counts: Counter = Counter()
        for name, kind in (self.quant_description or {}).items():
            if not (name.startswith("model.layers.") and name.endswith(".weight") and isinstance(kind, str)):
                continue
            # Norms are FLOAT in every scheme; only projections say how a layer is quantised.
            if "norm" in name.rsplit(".", 2)[-2]:
                continue
            if (prefix is not None and name.startswith(prefix)) == in_mtp:
                counts[kind] += 1
        return counts

    def main_quantization(self) -> Optional[str]:
        """The ModelSlim scheme of the main layers' projections (e.g. W8A8_DYNAMIC), FLOAT, or None.

        None when the checkpoint has no quantization description.
        """
        if self.quant_description is None:
            return None
        counts = self._quant_types(in_mtp=False)
        quantized = {k: v for k, v in counts.items() if k != UNQUANTIZED}
        if quantized:
            return max(quantized, key=quantized.get)
        top = self.quant_description.get("model_quant_type")
        return str(top) if counts == Counter() and top else UNQUANTIZED

    def mtp_quantization(self) -> Optional[str]:
        """The MTP layer's scheme: a ModelSlim type, FLOAT, or None when the description has no MTP entries."""
        if self.quant_description is None:
            return None
        counts = self._quant_types(in_mtp=True)
        if not counts:
            return None
        quantized = {k: v for k, v in counts.items() if k != UNQUANTIZED}
        return max(quantized, key=quantized.get) if quantized else UNQUANTIZED


def _read_json(path: str) -> tuple[Optional[dict], Optional[str]]:
    if not os.path.isfile(path):
        return None, None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        return None, f"{path}: {exc}"
    if not isinstance(data, dict):
        return None, f"{path}: expected a JSON object"
    return data, None


def read_checkpoint(path: str) -> CheckpointFacts:
    """Read the three JSON files of a local checkpoint directory (missing ones are simply absent)."""
    problems = []
    config, err = _read_json(os.path.join(path, CONFIG))
    if err:
        problems.append(err)
    index, err = _read_json(os.path.join(path, INDEX))
    if err:
        problems.append(err)
    names = None
    if index is not None:
        weight_map = index.get("weight_map")
        if isinstance(weight_map, dict):
            names = frozenset(weight_map)
        else:
            problems.append(f"{os.path.join(path, INDEX)}: no weight_map object")
    quant, err = _read_json(os.path.join(path, QUANT_DESCRIPTION))
    if err:
        problems.append(err)
    return CheckpointFacts(path, config, names, quant, tuple(problems))
