"""PPO on multi-turn episodes: the tool outputs and env messages between the policy's messages are context, not
actions. The loss mask is the policy's tokens, GAE steps over the others as if they were not there, the episode's
return lands on the policy's last token, and a step trains and logs the episodes."""

import math

import pytest
import torch
from calculator_models import TASK_KWARGS, tool_tokenizer

from algos.algorithms.ppo import PPOConfig, PPOTrainer
from algos.config import load_config
from algos.core.gae import gae_advantages
from rlvr_env.multiturn_env import Reply
from rlvr_env.registry import register_task
from rlvr_env.tasks.calculator_arithmetic import CalculatorArithmeticTask
from rlvr_env.testing import build_tiny_model


class RepliesToEveryMessage(CalculatorArithmeticTask):
    """Answers each message that calls no tool with "ok" (reward 0.25): episodes run to max_turns, env text between
    the policy's messages."""

    def reply(self, problem, messages):
        return Reply("ok", 0.25)


ENV_ID = register_task("PPOTestReplies", RepliesToEveryMessage, **TASK_KWARGS)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    path = tmp_path_factory.mktemp("ppo-multiturn")
    tokenizer = tool_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, max_position_embeddings=1024)
    model.save_pretrained(path / "model")
    tokenizer.save_pretrained(path / "model")
    overrides = {
        "model.path": str(path / "model"), "env.id": ENV_ID, "env.max_new_tokens": "24", "env.eval_size": "2",
        "run.steps": "1", "run.output_dir": str(path / "run"), "run.save_every": "0", "run.progress": "false",
        "run.tensorboard": "false", "run.plots": "false", "rollout.prompts_per_step": "4", "rollout.group_size": "2",
        "ppo.whiten_advantages": "false", "ppo.lam": "0.9", "ppo.kl_coef": "0", "rollout.max_episode_tokens": "60",
        "model.autocast": "null",
    }
    torch.manual_seed(0)
    return PPOTrainer(load_config(PPOConfig, overrides=overrides))


def test_gae_skips_the_tool_tokens_and_the_return_lands_on_the_last_policy_token(trainer):
    batch, metrics = trainer.collect(1)
    assert metrics["turns_mean"] > 1  # some episodes have env text between two of their messages
    width = batch.prompt_width
    response_attention = batch.attention_mask[:, width:]
    context_only = (response_attention == 1) & (batch.mask == 0)
    assert context_only.any() and (batch.mask <= response_attention).all()
    assert (batch.advantages[context_only] == 0).all() and (batch.returns[context_only] == 0).all()
    p = trainer.config.ppo
    for row in range(batch.num_rows):
        actions = batch.mask[row].bool()
        # The same episode with the env's tokens cut out: GAE over the policy's tokens alone gives the same numbers.
        values = batch.old_values[row, actions].unsqueeze(0)
        episode_return = batch.returns[row, actions][-1]  # = r_T, the last token's reward: V after it is 0
        rewards = torch.zeros_like(values)
        rewards[0, -1] = episode_return
        advantages, returns = gae_advantages(rewards, values, torch.ones_like(values), p.gamma, p.lam)
        torch.testing.assert_close(batch.advantages[row, actions], advantages[0])
        torch.testing.assert_close(batch.returns[row, actions], returns[0])
        # and that reward is the episode's score (0.25 per env reply), on the policy's last token
        assert episode_return.item() in {0.25 * turns for turns in range(1, TASK_KWARGS["max_turns"] + 1)}


def test_a_step_trains_on_the_episodes_and_logs_them(trainer):
    metrics = trainer.train_step(1, logger=type("Quiet", (), {"write": lambda self, line: None})())
    for key in ("turns_mean", "tool_calls_mean", "policy_len_mean", "policy_loss", "value_loss"):
        assert key in metrics and math.isfinite(metrics[key])
