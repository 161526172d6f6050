"""Multi-turn rollouts: the trainers on MultiTurnTasks (tool calls, env replies) through one backend.

:class:`MultiTurnHFRollout` plays one :class:`~rlvr_env.multiturn_env.MultiTurnEnv` per row of a reset TokenVectorEnv
(which gives the rows' problems, groups, tokenizer, stop tokens and policy-token budget). Every row's tokens after its
initial prompt grow append-only: the policy's messages, each ending with its stop token, and between them the
observations (tool outputs, the task's replies, the chat template's turn markers), tokenized from the text the env
renders. So the trainer scores exactly the sequence the sampler read. The returned :class:`MultiTurnRollout` marks the
policy's tokens (``policy_mask``), which GRPO's loss covers alone.

Two drivers play the episodes. :class:`EpisodeDriver` plays them with any engine that continues token rows
(``continue_rows``: vllm's, the static engine's): each turn, every unfinished row's context is continued up to its
first stop token, the message goes to the row's env, and the observation joins the context for the next turn.
:class:`MultiTurnHFRollout` keeps one KV cache across the turns instead. It decodes one token per row per forward, rows
in different turns side by side: a row whose message ends has its tool run (or the task reply) at once, and its stop
token and observation enter the next forward together with the other rows' next tokens, as a right-aligned chunk (the
others padded, the padding masked). The KV cache is extended, never recomputed: padding leaves masked holes in it,
squeezed out when they outnumber its real columns, and finished rows leave it as HFRollout's do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from algos.core.padding import left_padded, right_padded
from algos.model.loading import context_length
from algos.model.policy import position_ids_from_mask
from algos.rollout.base import Rollout, check_env_ready, check_seeds, sample_tokens
from algos.rollout.engines import ROLLOUT_ENGINES, RolloutEngine
from algos.rollout.hf import HFRollout
from algos.system.distributed import sum_over_ranks
from rewards.result import NO_ANSWER
from rlvr_env.multiturn_env import MultiTurnEnv, MultiTurnTask
from rlvr_env.prompting import encode_prompts, uses_chat_template


@dataclass
class MultiTurnRollout(Rollout):
    """A Rollout whose response is the whole episode after the initial prompt. ``response_mask`` is 1 on every token
    of it (what the model reads), ``policy_mask`` (Long[B, T]) on the tokens the policy sampled only, 0 on the
    observations; ``logprobs`` are 0 off the policy's tokens. ``turns``, ``tool_calls``, ``tool_errors``: Long[B]
    per episode. ``scores``: the episode's return (each turn's reward, the final answer's score included);
    ``truncated``: a budget ended the episode (env.max_new_tokens policy tokens, the episode's token budget, or the
    task's max_turns)."""

    policy_mask: torch.Tensor | None = None
    turns: torch.Tensor | None = None
    tool_calls: torch.Tensor | None = None
    tool_errors: torch.Tensor | None = None


def observation_text(prompt: str, message: str, next_prompt: str, stop_text: str) -> str:
    """The text the model reads between its message and its next one: ``next_prompt`` (the conversation rendered
    after the step) less ``prompt + message`` (before the step, and the message), less the stop token's text when the
    template writes it there (the policy's own stop token already stands in its place)."""
    if not next_prompt.startswith(prompt + message):
        raise ValueError(
            "the chat template does not render the conversation append-only (it changes earlier turns or the "
            "assistant's text), so the next prompt does not extend the tokens the model read: use a template that "
            "appends turns, or env.use_chat_template = false"
        )
    tail = next_prompt[len(prompt) + len(message) :]
    return tail[len(stop_text) :] if stop_text and tail.startswith(stop_text) else tail


class Episode:
    """One row: its MultiTurnEnv and the tokens it has grown after the initial prompt."""

    def __init__(self, env: MultiTurnEnv, tokenizer, stop_ids: frozenset[int], max_policy_tokens: int,
                 max_tokens: int) -> None:
        self.env, self.tokenizer, self.stop_ids = env, tokenizer, stop_ids
        self.max_policy_tokens, self.max_tokens = max_policy_tokens, max_tokens
        self.tokens: list[int] = []
        self.policy: list[int] = []  # 1 where the policy sampled the token
        self.logprobs: list[float] = []
        self.message_start = 0
        self.observation_tokens = 0
        self.return_, self.done, self.truncated = 0.0, False, False
        self.info: dict = {}

    def begin(self, problem) -> str:
        """Start on ``problem``; the initial prompt."""
        _, self.info = self.env.start(problem)
        return self.info["prompt"]

    @property
    def policy_tokens(self) -> int:
        """The tokens the policy sampled so far (the observations between its messages are not its own)."""
        return len(self.tokens) - self.observation_tokens

    @property
    def tokens_left(self) -> int:
        """Tokens ``take`` accepts before a budget ends the episode: the policy's (env.max_new_tokens) or the
        episode's; at least 1 while the episode goes on."""
        return min(self.max_policy_tokens - self.policy_tokens, self.max_tokens - len(self.tokens))

    def take(self, token: int, logprob: float) -> list[int]:
        """Append the policy's next token; the tokens the model reads next: the token, followed by the observation
        when its message ended and the episode goes on ([] when the episode ended)."""
        self.tokens.append(token)
        self.policy.append(1)
        self.logprobs.append(logprob)
        out_of_tokens = self.policy_tokens >= self.max_policy_tokens or len(self.tokens) >= self.max_tokens
        if token not in self.stop_ids and not out_of_tokens:
            return [token]
        message_ids = self.tokens[self.message_start :]
        message_ids = message_ids[:-1] if token in self.stop_ids else message_ids
        message = self.tokenizer.decode(message_ids, skip_special_tokens=True)
        prompt = self.info["prompt"]
        _, reward, terminated, truncated, self.info = self.env.step(message)
        self.return_ += reward
        if terminated or truncated or out_of_tokens:
            return self.end(truncated or out_of_tokens)
        stop_text = self.tokenizer.decode([token]) if token in self.stop_ids else ""
        text = observation_text(prompt, message[: self.env.max_message_chars], self.info["prompt"], stop_text)
        observation = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(self.tokens) + len(observation) >= self.max_tokens:  # no room left for a policy token after it
            return self.end(True)
        self.tokens += observation
        self.observation_tokens += len(observation)
        self.policy += [0] * len(observation)
        self.logprobs += [0.0] * len(observation)
        self.message_start = len(self.tokens)
        return [token, *observation]

    def end(self, truncated: bool) -> list[int]:
        """End the episode here (``truncated``: cut by a budget); [], the tokens the model reads next."""
        self.done, self.truncated = True, truncated
        return []


def squeeze_cache_holes(cache, mask: torch.Tensor) -> torch.Tensor:
    """Drop the masked columns of a DynamicCache (the padding of observation chunks), each row's kept columns
    right-aligned: [n, L] attention mask of the cache -> [n, L'] that of the squeezed cache, L' its longest row. The
    keys carry their positions (rotary embeddings are applied before caching), so moving them changes nothing."""
    kept = int(mask.sum(1).max())
    order = torch.sort(mask, dim=1, stable=True).indices[:, -kept:]  # masked columns first, then each row's own
    for layer in cache.layers:
        index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
        layer.keys, layer.values = layer.keys.gather(2, index), layer.values.gather(2, index)
    return mask.gather(1, order)


class MultiTurnHFRollout(HFRollout):
    """HFRollout's sampling (its parameters, seeds and cache handling) over multi-turn episodes; see the module.

    ``max_episode_tokens``: each episode's tokens after its initial prompt, the policy's and the observations'
    together (None: twice env.max_new_tokens); an observation that would reach it ends the episode truncated.
    env.max_new_tokens bounds the policy's tokens over the whole episode. Rows take their seeds' draws in the order
    of their policy tokens, so a row samples the same tokens whatever the other rows do.
    """

    # Squeeze the cache's holes out when its width passes this many times its longest row's real columns: each squeeze
    # copies the cache once, each forward after it attends over fewer columns.
    squeeze_above = 2.0

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                 max_episode_tokens: int | None = None) -> None:
        super().__init__(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        if max_episode_tokens is not None and max_episode_tokens < 1:
            raise ValueError(f"max_episode_tokens must be >= 1 or None, got {max_episode_tokens}")
        self.max_episode_tokens = max_episode_tokens

    def _generate(self, model, env, params, generator, draws) -> MultiTurnRollout:
        from transformers import DynamicCache

        episodes, prompts = start_episodes(env, model, self.max_episode_tokens)
        device, group_size = env.input_ids.device, env.group_size
        prompt_ids, prompt_mask = left_padded(prompts, env.pad_id, device)
        first_rows = torch.arange(0, env.num_envs, group_size, device=device)  # each group's prompt runs once
        positions = position_ids_from_mask(prompt_mask[first_rows])
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=prompt_ids[first_rows], attention_mask=prompt_mask[first_rows], position_ids=positions,
                       past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        cache.batch_repeat_interleave(group_size)
        logits = logits.repeat_interleave(group_size, dim=0)
        cache_mask = prompt_mask.clone()  # [n, L]: which of the cache's columns are real tokens
        next_position = positions[:, -1].repeat_interleave(group_size) + 1
        cached_rows = torch.arange(env.num_envs, device=device)  # the env row of each cache row
        squeezable = all(type(layer).__name__ == "DynamicLayer" for layer in cache.layers)  # sliding windows: no
        vocab = env.single_action_space.n
        while True:
            rows = cached_rows.tolist()
            uniforms = None
            if draws is not None:  # a finished row's draw is never used; clamp its index into range
                taken = torch.tensor([min(episodes[r].policy_tokens, env.max_new_tokens - 1) for r in rows], device=device)
                uniforms = draws[cached_rows, taken]
            tokens, logprobs = sample_tokens(logits[:, :vocab], params, generator, uniforms)
            feeds = [[] if episodes[r].done else episodes[r].take(token, logprob)
                     for r, token, logprob in zip(rows, tokens.tolist(), logprobs.tolist())]
            going = torch.tensor([bool(feed) for feed in feeds], device=device)
            if not going.any():
                break
            if going.sum() <= self.compact_below * len(rows):
                keep = going.nonzero().flatten()
                cache.batch_select_indices(keep)
                cached_rows, cache_mask, next_position = cached_rows[keep], cache_mask[keep], next_position[keep]
                feeds = [feeds[i] for i in keep.tolist()]
            chunk, chunk_mask = left_padded(feeds, env.pad_id, device)  # right-aligned: each row's last column predicts
            cache_mask = torch.cat([cache_mask, chunk_mask], 1)
            logits = model(input_ids=chunk, attention_mask=cache_mask,
                           position_ids=next_position[:, None] + (chunk_mask.cumsum(1) - 1).clamp(min=0),
                           past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
            next_position = next_position + chunk_mask.sum(1)
            if squeezable and cache_mask.shape[1] > self.squeeze_above * int(cache_mask.sum(1).max()):
                cache_mask = squeeze_cache_holes(cache, cache_mask)
        return episodes_result(env, episodes, prompt_ids, prompt_mask)


class EpisodeDriver:
    """Plays a MultiTurnTask's episodes, one per row of a reset TokenVectorEnv, with any engine that continues token
    rows: ``engine.continue_rows(model, contexts, max_new_tokens=, stop_ids=, vocab_size=, seeds=, **sampling)`` ->
    each context's sampled tokens up to and including its first stop token, and their log-probs (VLLMRollout's).

    Each turn, every unfinished row's context (its initial prompt, then the episode so far) is continued within the
    tokens its episode has left; the message goes to the row's env, whose observation joins the context. A row's turn
    is sampled from its seed and the episode's length so far (position_seed), so it samples the same tokens whatever
    the other rows do. ``max_episode_tokens`` as MultiTurnHFRollout's."""

    def __init__(self, engine, max_episode_tokens: int | None = None) -> None:
        if max_episode_tokens is not None and max_episode_tokens < 1:
            raise ValueError(f"max_episode_tokens must be >= 1 or None, got {max_episode_tokens}")
        self.engine, self.max_episode_tokens = engine, max_episode_tokens

    def sync_weights(self, model) -> None:
        self.engine.sync_weights(model)

    def generate(self, model, env, *, seeds: list[int] | None = None, **sampling) -> MultiTurnRollout:
        check_env_ready(env, model)
        check_seeds(env, seeds)
        episodes, contexts = start_episodes(env, model, self.max_episode_tokens)
        prompt_ids, prompt_mask = left_padded(contexts, env.pad_id, env.input_ids.device)
        stop_ids = env.stop_ids.tolist()
        while going := [row for row, episode in enumerate(episodes) if not episode.done]:
            turn_seeds = None if seeds is None else [position_seed(seeds[row], len(episodes[row].tokens)) for row in going]
            continued = self.engine.continue_rows(
                model, [contexts[row] for row in going], max_new_tokens=[episodes[row].tokens_left for row in going],
                stop_ids=stop_ids, vocab_size=env.single_action_space.n, seeds=turn_seeds, **sampling)
            for row, (tokens, logprobs) in zip(going, continued):
                episode = episodes[row]
                for token, logprob in zip(tokens, logprobs):
                    contexts[row] += episode.take(token, logprob)
                    if episode.done:
                        break
                if not episode.done and (not tokens or tokens[-1] not in stop_ids):
                    episode.end(truncated=True)  # the engine stopped short of a stop token: its own context limit
        return episodes_result(env, episodes, prompt_ids, prompt_mask)


def position_seed(seed: int, position: int) -> int:
    """The sampling seed of a row's turn starting ``position`` tokens into its episode (a 31-bit int, vllm's range)."""
    return int(np.random.SeedSequence([seed % 2**63, position]).generate_state(1)[0]) % (2**31 - 1)


def start_episodes(env, model, max_episode_tokens: int | None) -> tuple[list[Episode], list[list[int]]]:
    """One Episode per row of the freshly reset ``env`` (a MultiTurnTask's), begun on its problem -> (the episodes,
    each row's initial prompt token ids). ``max_episode_tokens`` None: twice env.max_new_tokens. The longest prompt
    plus that budget must fit ``model``'s context (no model, no check)."""
    if not isinstance(env.task, MultiTurnTask):
        raise ValueError(f"multi-turn rollouts play MultiTurnTasks; {type(env.task).__name__} is single-turn")
    tokenizer = env.tokenizer
    max_tokens = max_episode_tokens or 2 * env.max_new_tokens
    stop_ids = frozenset(env.stop_ids.tolist())
    chat = uses_chat_template(tokenizer, env.use_chat_template)
    episodes = [
        Episode(MultiTurnEnv(env.task, tokenizer if chat else None, problem_seed=env.problem_seed,
                             chat_template_kwargs=env.chat_template_kwargs),
                tokenizer, stop_ids, env.max_new_tokens, max_tokens)
        for _ in env.problems
    ]
    prompts = encode_prompts([episode.begin(problem) for episode, problem in zip(episodes, env.problems)], tokenizer,
                             chat_rendered=chat)
    limit = context_length(model) if model is not None else None
    longest = max(len(ids) for ids in prompts)
    if limit is not None and longest + max_tokens > limit:
        raise ValueError(f"the longest initial prompt ({longest} tokens) + the episode's token budget "
                         f"({max_tokens}: rollout.max_episode_tokens) exceed the model's context ({limit})")
    return episodes, prompts


def episodes_result(env, episodes: list[Episode], prompt_ids, prompt_mask) -> MultiTurnRollout:
    """The MultiTurnRollout of finished ``episodes`` after their left-padded initial prompts."""
    device = prompt_ids.device
    infos = [episode.info for episode in episodes]
    names = sorted({name for info in infos for name in info.get("reward_components", {})})
    policy_mask = right_padded([e.policy for e in episodes], 0, torch.long, device)
    return MultiTurnRollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=right_padded([e.tokens for e in episodes], env.pad_id, torch.long, device),
        response_mask=right_padded([[1] * len(e.tokens) for e in episodes], 0, torch.long, device),
        scores=torch.tensor([e.return_ for e in episodes], dtype=torch.float32, device=device),
        reward_components={
            name: torch.tensor([info.get("reward_components", {}).get(name, 0.0) for info in infos],
                               dtype=torch.float32, device=device)
            for name in names
        },
        statuses=[info.get("verifier_status", NO_ANSWER) for info in infos],
        completions=env.tokenizer.batch_decode([e.tokens for e in episodes], skip_special_tokens=True),
        truncated=torch.tensor([e.truncated for e in episodes], device=device),
        group_ids=env.group_ids,
        problems=list(env.problems),
        process_rewards=torch.zeros(policy_mask.shape, device=device),
        process_step_mask=torch.zeros(policy_mask.shape, dtype=torch.bool, device=device),
        logprobs=right_padded([e.logprobs for e in episodes], 0.0, torch.float32, device),
        policy_mask=policy_mask,
        turns=torch.tensor([info["turn"] for info in infos], device=device),
        tool_calls=torch.tensor([len(info["tool_calls"]) for info in infos], device=device),
        tool_errors=torch.tensor([info["tool_errors"] for info in infos], device=device),
    )


def episode_metrics(result) -> dict[str, float]:
    """A multi-turn rollout's per-episode means over every rank's rows: turns, tool calls, tool errors and policy
    tokens; {} for a single-turn one. Every rank calls it."""
    if not isinstance(result, MultiTurnRollout):
        return {}
    rows, turns, calls, errors, policy = sum_over_ranks(
        result.turns.numel(), result.turns.sum().item(), result.tool_calls.sum().item(),
        result.tool_errors.sum().item(), result.policy_mask.sum().item())
    rows = max(1.0, rows)
    return {"turns_mean": turns / rows, "tool_calls_mean": calls / rows, "tool_errors_mean": errors / rows,
            "policy_len_mean": policy / rows}


def build_hf_rollout(config, sampling: dict[str, Any], multiturn: bool):
    """rollout.backend = "hf": transformers + KV cache in the trainer's process; multi-turn: whole episodes."""
    if multiturn:
        return MultiTurnHFRollout(**sampling, max_episode_tokens=config.rollout.max_episode_tokens)
    return HFRollout(**sampling)


# "hf" is registered here, not in hf.py: its multi-turn rollout extends HFRollout, so hf.py imports nothing of this module
ROLLOUT_ENGINES.register("hf", RolloutEngine(build_hf_rollout, plays_multiturn=True, samples_while_training=True))
