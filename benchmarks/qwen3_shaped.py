"""A Qwen3-shaped transformer forward in plain torch, for EdgeAcc's latency benchmark.

Why not transformers' model directly: the decode step must be captured in a CUDA
graph (as SGLang's decode is) and must read a KV cache laid out like SGLang's
pool, which transformers' eager decode does neither of; its per-layer Python
overhead would make every decode step CPU-bound and hide the GPU interference
this benchmark measures. The math is Qwen3's (RMSNorm in float32, per-head q/k
RMSNorm, neox RoPE, GQA, SwiGLU, untied lm_head); :func:`compare_with_transformers`
checks it against ``transformers``' ``Qwen3ForCausalLM`` on the same weights.

Weights are a flat ``dict[str, Tensor]`` so the decode side can export them with
``edge_acc.tensor_share`` and the prefill side can use the imported dict as is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Qwen3Shape:
    hidden: int = 4096
    layers: int = 36
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 12288
    vocab: int = 151936
    rope_theta: float = 1_000_000.0
    eps: float = 1e-6

    @property
    def n_rep(self) -> int:
        return self.heads // self.kv_heads

    def weight_specs(self, dtype: torch.dtype) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = {"embed": ((self.vocab, self.hidden), dtype)}
        for i in range(self.layers):
            p = f"layers.{i}."
            specs[p + "in_norm"] = ((self.hidden,), dtype)
            specs[p + "qkv"] = ((q + 2 * kv, self.hidden), dtype)
            specs[p + "q_norm"] = ((self.head_dim,), dtype)
            specs[p + "k_norm"] = ((self.head_dim,), dtype)
            specs[p + "o"] = ((self.hidden, q), dtype)
            specs[p + "post_norm"] = ((self.hidden,), dtype)
            specs[p + "gate_up"] = ((2 * self.intermediate, self.hidden), dtype)
            specs[p + "down"] = ((self.hidden, self.intermediate), dtype)
        specs["final_norm"] = ((self.hidden,), dtype)
        specs["lm_head"] = ((self.vocab, self.hidden), dtype)
        return specs

    def param_count(self) -> int:
        return sum(math.prod(s) for s, _ in self.weight_specs(torch.float32).values())


def random_weights(shape: Qwen3Shape, device, dtype=torch.bfloat16, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights with Qwen3-like scales (std 0.02; norm weights 1), generated on ``device``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    weights = {}
    for name, (dims, dt) in shape.weight_specs(dtype).items():
        if name.endswith("norm"):
            weights[name] = torch.ones(dims, dtype=dt, device=device)
        else:
            w = torch.empty(dims, dtype=dt, device=device)
            w.normal_(0.0, 0.02, generator=gen)
            weights[name] = w
    return weights


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


class Qwen3Forward:
    """Prefill and decode over a weight dict; KV lives in caller-provided (shared) buffers."""

    def __init__(self, shape: Qwen3Shape, weights: dict[str, torch.Tensor], max_positions: int = 32768):
        self.s = shape
        self.w = weights
        device = weights["embed"].device
        inv_freq = 1.0 / (
            shape.rope_theta ** (torch.arange(0, shape.head_dim, 2, dtype=torch.int64, device=device).float() / shape.head_dim)
        )
        freqs = torch.outer(torch.arange(max_positions, device=device, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        dtype = weights["embed"].dtype
        self.cos = emb.cos().to(dtype)
        self.sin = emb.sin().to(dtype)
        self.scale = shape.head_dim**-0.5

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        # x: [..., T, heads, head_dim] with pos: [T]
        cos = self.cos[pos].unsqueeze(-2)
        sin = self.sin[pos].unsqueeze(-2)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def _qkv(self, i: int, h: torch.Tensor, pos: torch.Tensor):
        s, p = self.s, f"layers.{i}."
        q_dim, kv_dim = s.heads * s.head_dim, s.kv_heads * s.head_dim
        qkv = h @ self.w[p + "qkv"].t()
        q = qkv[..., :q_dim].unflatten(-1, (s.heads, s.head_dim))
        k = qkv[..., q_dim : q_dim + kv_dim].unflatten(-1, (s.kv_heads, s.head_dim))
        v = qkv[..., q_dim + kv_dim :].unflatten(-1, (s.kv_heads, s.head_dim))
        q = rms_norm(q, self.w[p + "q_norm"], s.eps)
        k = rms_norm(k, self.w[p + "k_norm"], s.eps)
        return self._rope(q, pos), self._rope(k, pos), v

    def _expand_kv(self, kv: torch.Tensor) -> torch.Tensor:
        # [L, kv_heads, hd] -> [heads, L, hd], query head h reading KV head h // n_rep (as
        # transformers' repeat_kv). expand+reshape rather than repeat_interleave: no host
        # sync, so a chunk can be captured in a CUDA graph.
        kvh, n_rep = self.s.kv_heads, self.s.n_rep
        t = kv.transpose(0, 1)
        return t[:, None].expand(kvh, n_rep, *t.shape[1:]).reshape(kvh * n_rep, *t.shape[1:])

    def _mlp_and_residual(self, i: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        p = f"layers.{i}."
        x = x + attn @ self.w[p + "o"].t()
        h = rms_norm(x, self.w[p + "post_norm"], self.s.eps)
        gate, up = (h @ self.w[p + "gate_up"].t()).chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ self.w[p + "down"].t()

    def _logits(self, x_last: torch.Tensor) -> torch.Tensor:
        return rms_norm(x_last, self.w["final_norm"], self.s.eps) @ self.w["lm_head"].t()

    @torch.inference_mode()
    def prefill(
        self,
        ids: torch.Tensor,
        k_pool: list[torch.Tensor],
        v_pool: list[torch.Tensor],
        slot0: int,
        past_len: int = 0,
        return_logits: bool = False,
    ) -> torch.Tensor:
        """Extend one request by ``ids`` (its first ``past_len`` tokens are already in the pool).

        The request's KV occupies pool slots ``[slot0, slot0 + past_len + len(ids))`` of
        every layer's ``[slots, kv_heads, head_dim]`` buffer (SGLang's MHA pool layout).
        Returns the greedy next token (or the last position's logits).
        """
        s = self.s
        t = ids.shape[0]
        pos = torch.arange(past_len, past_len + t, device=ids.device)
        x = self.w["embed"][ids]
        mask: Optional[torch.Tensor] = None
        if past_len:
            kv_pos = torch.arange(past_len + t, device=ids.device)
            mask = kv_pos[None, :] <= pos[:, None]
        for i in range(s.layers):
            h = rms_norm(x, self.w[f"layers.{i}.in_norm"], s.eps)
            q, k, v = self._qkv(i, h, pos)
            start = slot0 + past_len
            k_pool[i][start : start + t] = k
            v_pool[i][start : start + t] = v
            keys = self._expand_kv(k_pool[i][slot0 : start + t])
            vals = self._expand_kv(v_pool[i][slot0 : start + t])
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1).unsqueeze(0),
                keys.unsqueeze(0),
                vals.unsqueeze(0),
                attn_mask=mask,
                is_causal=mask is None,
                scale=self.scale,
            )
            x = self._mlp_and_residual(i, x, o.squeeze(0).transpose(0, 1).reshape(t, -1))
        logits = self._logits(x[-1:])
        return logits if return_logits else logits.argmax(-1)

    def decode_step(
        self, ids: torch.Tensor, position: int, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]
    ) -> torch.Tensor:
        """One decode step for a batch whose caches are ``[batch, kv_heads, ctx, head_dim]`` per layer.

        Steady state for benchmarking: every request sits at ``position`` (< ctx) and
        attends over cache positions ``[0, position]``; the new KV overwrites slot
        ``position``. Written without host syncs so it can be captured in a CUDA graph.
        """
        s = self.s
        b = ids.shape[0]
        pos = torch.full((1,), position, device=ids.device, dtype=torch.int64)
        x = self.w["embed"][ids]  # [b, hidden]
        for i in range(s.layers):
            h = rms_norm(x, self.w[f"layers.{i}.in_norm"], s.eps)
            q, k, v = self._qkv(i, h.unsqueeze(1), pos)  # [b, 1, heads, hd]
            k_cache[i][:, :, position] = k[:, 0]
            v_cache[i][:, :, position] = v[:, 0]
            # GQA without expanding the cache: the n_rep query heads of one KV head
            # form that head's "query sequence" (one decode position, no mask needed).
            qg = q[:, 0].unflatten(1, (s.kv_heads, s.n_rep))  # [b, kvh, n_rep, hd]
            o = F.scaled_dot_product_attention(
                qg, k_cache[i][:, :, : position + 1], v_cache[i][:, :, : position + 1], scale=self.scale
            )
            x = self._mlp_and_residual(i, x, o.reshape(b, -1))
        return self._logits(x).argmax(-1)


def compare_with_transformers(device: str = "cpu", seed: int = 0) -> float:
    """Max relative logit error of :class:`Qwen3Forward` against transformers' Qwen3 (float32, tiny shape).

    Covers whole prefill, chunked prefill over a prefix and a decode step.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    shape = Qwen3Shape(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=96, vocab=128)
    config = Qwen3Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        rope_theta=shape.rope_theta,
        rms_norm_eps=shape.eps,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    ref = Qwen3ForCausalLM(config).to(device).float().eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    q_dim = shape.heads * shape.head_dim
    weights = {"embed": ref.model.embed_tokens.weight, "final_norm": ref.model.norm.weight, "lm_head": ref.lm_head.weight}
    for i, layer in enumerate(ref.model.layers):
        a, m, p = layer.self_attn, layer.mlp, f"layers.{i}."
        weights[p + "in_norm"] = layer.input_layernorm.weight
        weights[p + "post_norm"] = layer.post_attention_layernorm.weight
        weights[p + "qkv"] = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
        weights[p + "q_norm"] = a.q_norm.weight
        weights[p + "k_norm"] = a.k_norm.weight
        weights[p + "o"] = a.o_proj.weight
        weights[p + "gate_up"] = torch.cat([m.gate_proj.weight, m.up_proj.weight])
        weights[p + "down"] = m.down_proj.weight
    weights = {k: v.detach() for k, v in weights.items()}
    assert weights["layers.0.qkv"].shape[0] == q_dim + 2 * shape.kv_heads * shape.head_dim
    fwd = Qwen3Forward(shape, weights, max_positions=256)

    ids = torch.randint(0, shape.vocab, (40,), device=device)
    with torch.no_grad():
        ref_logits = ref(ids[None]).logits[0].float()

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).norm() / b.norm())

    k_pool = [torch.zeros(64, shape.kv_heads, shape.head_dim, device=device) for _ in range(shape.layers)]
    v_pool = [torch.zeros_like(k) for k in k_pool]
    whole = fwd.prefill(ids, k_pool, v_pool, slot0=3, return_logits=True)[0]
    errors = [rel(whole, ref_logits[-1])]
    k2 = [torch.zeros_like(k) for k in k_pool]
    v2 = [torch.zeros_like(k) for k in k_pool]
    fwd.prefill(ids[:25], k2, v2, slot0=5, return_logits=True)
    chunked = fwd.prefill(ids[25:], k2, v2, slot0=5, past_len=25, return_logits=True)[0]
    errors.append(rel(chunked, ref_logits[-1]))
    # Decode: the cache holds ids[:39] at positions 0..38; the step feeds ids[39] at position 39.
    kc = [k_pool[i][3 : 3 + 40].transpose(0, 1).unsqueeze(0).clone() for i in range(shape.layers)]
    vc = [v_pool[i][3 : 3 + 40].transpose(0, 1).unsqueeze(0).clone() for i in range(shape.layers)]
    for c in kc + vc:
        c[:, :, 39] = 0  # the step must write this position itself
    logits_holder = {}
    orig = fwd._logits
    fwd._logits = lambda x: logits_holder.setdefault("l", orig(x))  # type: ignore[method-assign]
    with torch.no_grad():
        fwd.decode_step(ids[39:40], 39, kc, vc)
    errors.append(rel(logits_holder["l"][0], ref_logits[-1]))
    return max(errors)


if __name__ == "__main__":
    print(f"max relative logit error vs transformers Qwen3 (float32): {compare_with_transformers():.2e}")
