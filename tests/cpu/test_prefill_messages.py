"""In the real server: a prefill batch's message stays small with a production-sized tokenizer and pool."""

from __future__ import annotations

import re

import pytest
import requests

from tests import serving_models
from tests.harness import SglangServer

pytestmark = pytest.mark.server


def _histogram(text: str, name: str) -> tuple[float, float]:
    total = sum(float(v) for v in re.findall(rf"^{name}_sum{{[^}}]*}} ([0-9.e+]+)$", text, re.M))
    count = sum(float(v) for v in re.findall(rf"^{name}_count{{[^}}]*}} ([0-9.e+]+)$", text, re.M))
    return total, count


def test_messages_do_not_carry_the_tokenizer_or_the_pool(tmp_path):
    model = serving_models.tiny_model_with_production_tokenizer(tmp_path / "tiny-prod-tok")
    server = SglangServer(args=("--enable-edge-acc", "--enable-metrics", "--max-total-tokens", "400000",
                                "--chunked-prefill-size", "256"), model_path=str(model))
    server.start()
    try:
        for i in range(3):
            server.generate([5 + i] * 300, max_new_tokens=4)
        text = requests.get(f"{server.url}/metrics", timeout=30).text
    finally:
        server.stop()
    total, count = _histogram(text, "sglang_edgeacc_prefill_message_bytes")
    assert count >= 3, text[-2000:]
    # The tokenizer alone pickles to 7.8 MB and the pool's free list to 3.2 MB.
    assert total / count < 200_000, f"mean prefill message {total / count:.0f} bytes"
