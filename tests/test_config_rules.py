"""Every rule of the shared config sections (algos/config.py), one bad value each: the error is the whole text that
names the key and says why; and values at each rule's edge are accepted. (PPO's own rules: tests/test_ppo.py.)"""

from __future__ import annotations

import json

import pytest

from algos.algorithms.grpo import GRPOConfig
from algos.config import STRATEGIES, load_config
from algos.core import LOSS_AGGREGATIONS, POLICY_LOSSES, ROLLOUT_CORRECTIONS

RULES = [
    ({"model.dtype": "float64"}, "config model.dtype: unknown dtype 'float64'"),
    ({"model.dtype": "float16"}, "config model.dtype: float16 weights cannot be trained: use model.dtype = float32 "
                                 "with model.autocast = float16 (or bfloat16)"),
    ({"model.autocast": "float32"}, "config model.autocast: must be 'auto', null, 'bfloat16' or 'float16', got "
                                    "'float32'"),
    ({"model.path": ""}, "config model.path: must name a directory or 'default'"),
    ({"model.compile_layers": "true"}, "config model.compile_layers: must be 'auto', 'on' or 'off', got 'true'"),
    ({"model.compile_layers": "on", "model.gradient_checkpointing": "true"},
     "config model.compile_layers: 'on' does not go with model.gradient_checkpointing (recomputing compiled layers is "
     "not tested; 'auto' compiles none there)"),
    ({"env.max_new_tokens": "0"}, "config env.max_new_tokens: must be >= 1"),
    ({"env.max_prompt_tokens": "0"}, "config env.max_prompt_tokens: must be >= 1 or null"),
    ({"env.eval_size": "0"}, "config env.eval_size: must be >= 1"),
    ({"env.eval_batch_size": "-1"}, "config env.eval_batch_size: must be >= 0 (0 = all at once)"),
    ({"rollout.prompts_per_step": "0"}, "config rollout.prompts_per_step: must be >= 1"),
    ({"rollout.max_episode_tokens": "0"}, "config rollout.max_episode_tokens: must be >= 1 or null"),
    ({"rollout.backend": ""}, "config rollout.backend: must name a rollout engine ('auto', 'hf', 'static', 'vllm', or "
                              "one registered in ROLLOUT_ENGINES), got ''"),
    ({"static.decode_graph": "always"}, "config static.decode_graph: must be 'auto', 'cuda', 'compile' or 'eager', "
                                        "got 'always'"),
    ({"vllm.gpu_memory_utilization": "0"}, "config vllm.gpu_memory_utilization: must be in (0, 1]"),
    ({"vllm.gpu_memory_utilization": "1.01"}, "config vllm.gpu_memory_utilization: must be in (0, 1]"),
    ({"vllm.dtype": "float64"}, "config vllm.dtype: must be null, 'float32', 'bfloat16' or 'float16', got 'float64'"),
    ({"vllm.engine_kwargs": json.dumps({"seed": 1, "model": "x", "enforce_eager": True})},
     "config vllm.engine_kwargs: ['model', 'seed'] are set by their own keys or by the rollout"),
    ({"rollout.temperature": "0"}, "config rollout.temperature: must be > 0"),
    ({"rollout.top_p": "0"}, "config rollout.top_p: must be in (0, 1]"),
    ({"rollout.top_p": "1.01"}, "config rollout.top_p: must be in (0, 1]"),
    ({"rollout.top_k": "-1"}, "config rollout.top_k: must be >= 0"),
    ({"optim.lr": "0"}, "config optim.lr: must be > 0, got 0.0"),
    ({"optim.adam_eps": "0"}, "config optim.adam_eps: must be > 0"),
    ({"optim.weight_decay": "-0.1"}, "config optim.weight_decay: must be >= 0"),
    ({"optim.betas": "[0.9, 1.0]"}, "config optim.betas: each must be in [0, 1)"),
    ({"optim.betas": "[-0.1, 0.99]"}, "config optim.betas: each must be in [0, 1)"),
    ({"optim.max_grad_norm": "-1"}, "config optim.max_grad_norm: must be >= 0"),
    ({"optim.warmup_steps": "-1"}, "config optim.warmup_steps: must be >= 0"),
    ({"optim.schedule": "step"}, "config optim.schedule: unknown 'step'"),
    ({"run.steps": "0"}, "config run.steps: must be >= 1"),
    ({"run.save_every": "-1"}, "config run.save_every: must be >= 0"),
    ({"run.keep_last": "0"}, "config run.keep_last: must be >= 1"),
    ({"run.eval_every": "-1"}, "config run.eval_every: must be >= 0"),
    ({"loss.surrogate": "trpo"}, f"config loss.surrogate: must be one of {POLICY_LOSSES.names}"),
    ({"loss.rollout_correction": "sometimes"}, "config loss.rollout_correction: must be one of "
     f"{('auto', 'none', *ROLLOUT_CORRECTIONS.names)}, got 'sometimes'"),
    ({"loss.rollout_correction_cap": "1"}, "config loss.rollout_correction_cap: must be > 1"),
    ({"loss.eps_low": "0"}, "config loss.eps_low: must be in (0, 1] (1: no lower bound on the ratio)"),
    ({"loss.eps_low": "1.01"}, "config loss.eps_low: must be in (0, 1] (1: no lower bound on the ratio)"),
    ({"loss.eps_high": "0"}, "config loss.eps_high: must be > 0"),
    ({"loss.dual_clip": "1"}, "config loss.dual_clip: must be > 1 or null"),
    ({"loss.dual_clip": "3", "loss.surrogate": "cispo"}, "config loss.dual_clip: bounds the clipped surrogate's loss; "
                                                         "loss.surrogate 'cispo' has none: set it to null"),
    ({"loss.aggregation": "median"}, f"config loss.aggregation: must be one of {LOSS_AGGREGATIONS.names}"),
    ({"loss.entropy_coef": "-0.01"}, "config loss.entropy_coef: must be >= 0 (a bonus; negative would penalise "
                                     "entropy)"),
    ({"loss.micro_batch_size": "0"}, "config loss.micro_batch_size: must be 'auto' or a number of rows >= 1, got 0"),
    ({"loss.micro_batch_memory_gb": "0"}, "config loss.micro_batch_memory_gb: must be > 0 (GiB) or null"),
    ({"loss.logprob_chunk_size": "0"}, "config loss.logprob_chunk_size: must be >= 1"),
    ({"distributed.strategy": "zero3"}, f"config distributed.strategy: must be one of {STRATEGIES}, got 'zero3'"),
    ({"distributed.backend": "mpi"}, "config distributed.backend: must be 'auto', 'gloo' or 'nccl', got 'mpi'"),
    ({"distributed.timeout_s": "0"}, "config distributed.timeout_s: must be > 0"),
    ({"distributed.world_size": "0"}, "config distributed.world_size: must be >= 1 or null"),
    *[({f"alarms.{name}": "-0.1"}, f"config alarms.{name}: must be >= 0 (0 turns the alarm off)")
      for name in ("entropy_collapse", "reward_stall", "zero_std_groups", "clip_spike", "truncation", "eval_drop")],
    ({"alarms.window": "0"}, "config alarms.window: must be >= 1"),
    *[({f"alarms.{name}": "1.01"}, f"config alarms.{name}: is a fraction: must be <= 1")
      for name in ("entropy_collapse", "zero_std_groups", "truncation")],
    ({"warm_start.steps": "-1"}, "config warm_start.steps: must be >= 0 (0 = no warm start)"),
    ({"warm_start.lr": "0"}, "config warm_start.lr: must be > 0, got 0.0"),
    ({"warm_start.batch_size": "0"}, "config warm_start.batch_size: must be >= 1"),
    ({"optim.max_grad_norm": "inf"}, "config optim.max_grad_norm: must be a finite number, got inf"),
    ({"loss.eps_high": "nan"}, "config loss.eps_high: must be a finite number, got nan"),
]


@pytest.mark.parametrize(("overrides", "error"), RULES, ids=[error.split(":")[0][7:] for _, error in RULES])
def test_each_rule_names_its_key_and_why(overrides, error):
    with pytest.raises(ValueError) as raised:
        load_config(GRPOConfig, overrides=overrides)
    assert str(raised.value) == error


EDGES = {
    "lower": {"env.max_new_tokens": "1", "env.max_prompt_tokens": "1", "env.eval_size": "1", "env.eval_batch_size": "0",
              "rollout.prompts_per_step": "1", "rollout.max_episode_tokens": "1", "rollout.top_k": "0",
              "optim.weight_decay": "0", "optim.betas": "[0.0, 0.0]", "optim.max_grad_norm": "0",
              "optim.warmup_steps": "0", "run.steps": "1", "run.save_every": "0", "run.keep_last": "1",
              "run.eval_every": "0", "loss.entropy_coef": "0", "loss.micro_batch_size": "1",
              "loss.logprob_chunk_size": "1", "distributed.world_size": "1", "alarms.window": "1",
              "alarms.entropy_collapse": "0", "alarms.reward_stall": "0", "alarms.zero_std_groups": "0",
              "alarms.clip_spike": "0", "alarms.truncation": "0", "alarms.eval_drop": "0", "warm_start.steps": "0",
              "warm_start.batch_size": "1", "model.gradient_checkpointing": "true"},  # compile_layers "auto" there
    "upper": {"vllm.gpu_memory_utilization": "1", "rollout.top_p": "1", "loss.eps_low": "1",
              "alarms.entropy_collapse": "1", "alarms.zero_std_groups": "1", "alarms.truncation": "1",
              "loss.rollout_correction_cap": "1.0001", "loss.dual_clip": "1.0001", "loss.surrogate": "gspo",
              "model.gradient_checkpointing": "true", "model.compile_layers": "off"},
    "nulls": {"env.max_prompt_tokens": "null", "rollout.max_episode_tokens": "null", "vllm.dtype": "null",
              "loss.dual_clip": "null", "loss.micro_batch_memory_gb": "null", "distributed.world_size": "null",
              "model.autocast": "null", "vllm.engine_kwargs": json.dumps({"enforce_eager": True})},
}


@pytest.mark.parametrize("edge", EDGES)
def test_values_at_each_rules_edge_are_accepted(edge):
    assert isinstance(load_config(GRPOConfig, overrides=EDGES[edge]), GRPOConfig)
