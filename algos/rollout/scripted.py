"""ScriptedRollout: completions written in advance, taken whole by the env (``env.finish_with``) and scored there."""

from __future__ import annotations

import torch

from algos.rollout.base import Rollout, _as_rollout, check_env_ready, check_seeds
from rlvr_env.token_vector_env import TokenVectorEnv


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

    def sync_weights(self, model) -> None:
        """Nothing to copy: no model writes the completions."""

    def generate(self, model, env: TokenVectorEnv, *, seeds: list[int] | None = None, **sampling) -> Rollout:
        check_env_ready(env)
        check_seeds(env, seeds)
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
