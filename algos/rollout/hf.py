"""HFRollout: a transformers causal LM with its KV cache, each prompt prefilled once for its group, then one token
per env step for the rows still generating, on the model's device. Its engine, rollout.backend = "hf", is registered in
multiturn.py, which adds the multi-turn episodes (MultiTurnHFRollout, an HFRollout)."""

from __future__ import annotations

import torch

from algos.model.attention import decoding_attention
from algos.model.policy import position_ids_from_mask
from algos.rollout.base import Rollout, SamplingParams, _as_rollout, checked_call, row_uniforms, sample_tokens
from algos.system.runtime import release_free_memory, weights_cast_once
from rlvr_env.token_vector_env import TokenVectorEnv


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

    def sync_weights(self, model) -> None:
        """Nothing to copy: every step runs ``model`` itself."""

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

