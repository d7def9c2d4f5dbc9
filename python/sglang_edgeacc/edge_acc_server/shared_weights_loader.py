"""The prefill side's model loader: build the model without memory, then bind the decode side's weights.

The model skeleton is built on the meta device (no allocation, no checkpoint
read) from the same config and quantization the decode side used, and every
parameter and buffer is then bound to the decode side's tensor of the same
name. The prefill side therefore holds no second copy of the weights: on a
GPU, its own allocation for weights is zero.

The decode side exports its model after ``process_weights_after_loading``, so
a quantization method that keeps state outside parameters and buffers cannot
be completed this way; that is detected (a tensor left on the meta device)
and refused with the name of the tensor.
"""

from __future__ import annotations

import logging
from typing import Mapping

import torch

from sglang.srt.model_loader.loader import BaseModelLoader

from sglang_edgeacc.edge_acc.tensor_import import bind_into_module

logger = logging.getLogger(__name__)


class SharedWeightsLoader(BaseModelLoader):
    def __init__(self, load_config, weights: Mapping[str, torch.Tensor]):
        super().__init__(load_config)
        self._weights = weights

    def download_model(self, model_config) -> None:
        del model_config  # nothing to read: the weights are the decode side's

    def load_model(self, *, model_config, device_config) -> torch.nn.Module:
        from sglang.srt.model_loader.loader import _get_quantization_config, _initialize_model
        from sglang.srt.model_loader.utils import set_default_torch_dtype

        del device_config  # the bound tensors already live on the decode side's device
        quant_config = _get_quantization_config(model_config, self.load_config)
        with set_default_torch_dtype(model_config.dtype), torch.device("meta"):
            model = _initialize_model(model_config, self.load_config, quant_config)
        bind_into_module(model, self._weights)
        leftover = [
            f"{module_name}.{attr}"
            for module_name, module in model.named_modules()
            for attr, value in vars(module).items()
            if isinstance(value, torch.Tensor) and value.is_meta
        ]
        if leftover:
            raise RuntimeError(
                "EdgeAcc: the prefill side cannot share these tensors of the model, which the decode "
                f"side keeps outside its parameters and buffers: {leftover[:5]}. Serve this model "
                "without --enable-edge-acc."
            )
        logger.info("EdgeAcc prefill side: bound %d shared weight tensors, no weight copy", len(self._weights))
        return model.eval()
