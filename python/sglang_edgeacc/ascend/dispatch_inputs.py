"""What DeepEP's HCCL buffer depends on besides the hardware: the model's MoE shape and ant-moving.

Only the standard library is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

# Ant-moving (DEEPEP_NORMAL_LONG_SEQ_*), deep_ep.cpp Buffer::Buffer.
ANT_MOVING_DEFAULT_ROUNDS = 1
ANT_MOVING_DEFAULT_PER_ROUND_TOKENS = 8192
ANT_MOVING_ROUNDS_RANGE = (1, 256)
ANT_MOVING_PER_ROUND_TOKENS_RANGE = (32, 8192)
ANT_MOVING_MAX_TOTAL_TOKENS = 131072


@dataclass(frozen=True)
class ModelShape:
    """What the MoE dispatch of a model depends on (from its config.json)."""

    hidden_size: int
    topk: int  # num_experts_per_tok
    num_experts: int  # routed experts, plus redundant ones (EPLB) if any
    shared_expert_num: int = 0  # shared experts dispatched through the A2A (sglang: none)

    def __post_init__(self) -> None:
        for name in ("hidden_size", "topk", "num_experts"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.shared_expert_num < 0:
            raise ValueError(f"shared_expert_num must be >= 0, got {self.shared_expert_num}")


def model_shape_from_config(config: Mapping[str, object], redundant_experts: int = 0) -> ModelShape:
    """Read the dispatch shape from a Hugging Face ``config.json`` mapping.

    Routed experts are ``n_routed_experts`` (DeepSeek), ``num_experts`` (Qwen-MoE)
    or ``num_local_experts`` (Mixtral); EPLB's redundant experts add slots to the
    same window. Shared experts run locally in sglang, not through the A2A.
    """
    text_config = config.get("text_config")
    if isinstance(text_config, Mapping) and "hidden_size" not in config:
        config = text_config
    missing = []
    hidden = config.get("hidden_size")
    topk = config.get("num_experts_per_tok")
    experts = next(
        (config[key] for key in ("n_routed_experts", "num_experts", "num_local_experts") if config.get(key)),
        None,
    )
    if not hidden:
        missing.append("hidden_size")
    if not topk:
        missing.append("num_experts_per_tok")
    if not experts:
        missing.append("n_routed_experts/num_experts")
    if missing:
        raise ValueError(
            f"config.json lacks {', '.join(missing)}: it is not a MoE model DeepEP can dispatch "
            "(or pass the shape by hand to `sglang-edgeacc hccl-budget`)."
        )
    return ModelShape(
        hidden_size=int(hidden), topk=int(topk), num_experts=int(experts) + int(redundant_experts)
    )


@dataclass(frozen=True)
class AntMoving:
    """DEEPEP_NORMAL_LONG_SEQ_ROUND x DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS."""

    rounds: int
    per_round_tokens: int

    @property
    def capacity(self) -> int:
        return self.rounds * self.per_round_tokens


DEFAULT_ANT_MOVING = AntMoving(ANT_MOVING_DEFAULT_ROUNDS, ANT_MOVING_DEFAULT_PER_ROUND_TOKENS)


def ant_moving_problems(ant: AntMoving) -> list[str]:
    """Why deep_ep.cpp's Buffer constructor would reject these values (empty when it accepts them)."""
    problems = []
    lo, hi = ANT_MOVING_ROUNDS_RANGE
    if not lo <= ant.rounds <= hi:
        problems.append(f"DEEPEP_NORMAL_LONG_SEQ_ROUND={ant.rounds} is outside [{lo}, {hi}]")
    lo, hi = ANT_MOVING_PER_ROUND_TOKENS_RANGE
    if not lo <= ant.per_round_tokens <= hi:
        problems.append(f"DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS={ant.per_round_tokens} is outside [{lo}, {hi}]")
    if ant.capacity > ANT_MOVING_MAX_TOTAL_TOKENS:
        problems.append(
            f"ROUND x PER_ROUND_TOKENS = {ant.capacity} exceeds {ANT_MOVING_MAX_TOTAL_TOKENS} (MAX_TOTAL_TOKENS)"
        )
    return problems
