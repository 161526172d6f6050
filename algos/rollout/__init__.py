"""Rollout engines: what fills a reset TokenVectorEnv with sampled tokens, registered by name in ROLLOUT_ENGINES.

base.py       the Rollout returned, SamplingParams, the RolloutBackend protocol, token sampling
hf.py         HFRollout: transformers + KV cache (rollout.backend = "hf", registered in multiturn.py)
static.py     StaticRollout: fixed-shape decode replayed as CUDA graphs ("static", the GPU default)
vllm.py       VLLMRollout ("vllm")
scripted.py   ScriptedRollout: completions written in advance (tests, recorded data)
multiturn.py  whole multi-turn episodes: MultiTurnHFRollout (one KV cache), EpisodeDriver (any engine's continue_rows);
              the "hf" engine's registration (single-turn HFRollout, multi-turn MultiTurnHFRollout)
engines.py    the registry, make_rollout_backend, resolve_rollout_backend ("auto"), engine_for_model (its fallback)
environment.py build_task and make_env: the task and the TokenVectorEnv a run samples in
metrics.py    the per-step rollout metrics

Importing this package registers every built-in engine.
"""

from algos.rollout.base import Rollout, RolloutBackend, SamplingParams, row_seeds, sample_tokens, weights_version
from algos.rollout.engines import (
    ROLLOUT_ENGINES,
    RolloutEngine,
    engine_for_model,
    make_rollout_backend,
    resolve_rollout_backend,
)
from algos.rollout.environment import build_task, is_multiturn_task, make_env
from algos.rollout.hf import HFRollout
from algos.rollout.metrics import policy_token_mask, rollout_metrics
from algos.rollout.multiturn import EpisodeDriver, MultiTurnHFRollout, MultiTurnRollout, episode_metrics
from algos.rollout.scripted import ScriptedRollout
from algos.rollout.static import StaticRollout
from algos.rollout.vllm import VLLMRollout, VLLMWeightLoader

__all__ = [
    "ROLLOUT_ENGINES", "EpisodeDriver", "HFRollout", "MultiTurnHFRollout", "MultiTurnRollout", "Rollout",
    "RolloutBackend", "RolloutEngine", "SamplingParams", "ScriptedRollout", "StaticRollout", "VLLMRollout",
    "VLLMWeightLoader", "build_task", "episode_metrics", "is_multiturn_task", "make_env", "make_rollout_backend",
    "policy_token_mask", "engine_for_model", "resolve_rollout_backend", "rollout_metrics", "row_seeds", "sample_tokens",
    "weights_version",
]
