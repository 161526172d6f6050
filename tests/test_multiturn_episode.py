"""The pieces of a multi-turn rollout one at a time (algos/rollout/multiturn.py): an Episode's bookkeeping of messages,
observations and budgets against a scripted env, the episodes' result tensors, the turn seeds, the cache squeeze and
the episode metrics. tests/test_multiturn_rollout.py plays whole episodes with real models."""

from __future__ import annotations

import types

import pytest
import torch
from calculator_models import TASK_KWARGS, tool_tokenizer

from algos.rollout.multiturn import (
    Episode,
    EpisodeDriver,
    MultiTurnHFRollout,
    MultiTurnRollout,
    episode_metrics,
    episodes_result,
    position_seed,
    squeeze_cache_holes,
    start_episodes,
)
from rewards.result import NO_ANSWER
from rlvr_env import TokenVectorEnv
from rlvr_env.tasks.arithmetic import ArithmeticTask
from rlvr_env.tasks.calculator_arithmetic import CalculatorArithmeticTask
from rlvr_env.testing import build_tiny_model

REPLY = "\nU:ok\nA:"


class ScriptedEnv:
    """A MultiTurnEnv stand-in: each step records the message and answers REPLY (reward 0.25), rendering the stop
    token's text after the message as a chat template does; the step numbered ``terminate_at`` ends the episode."""

    max_message_chars = 1000

    def __init__(self, stop_text: str, terminate_at: int = 99) -> None:
        self.stop_text, self.terminate_at = stop_text, terminate_at
        self.messages: list[str] = []

    def start(self, problem):
        return None, {"prompt": "P:"}

    def step(self, message):
        self.messages.append(message)
        prompt = self.info_prompt + message + self.stop_text + REPLY
        self.info_prompt = prompt
        terminated = len(self.messages) >= self.terminate_at
        return None, 0.25, terminated, False, {"prompt": prompt, "turn": len(self.messages)}

    info_prompt = "P:"


@pytest.fixture(scope="module")
def tokenizer():
    return tool_tokenizer()


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def episode(tokenizer, max_policy_tokens=10, max_tokens=40, terminate_at=99) -> Episode:
    env = ScriptedEnv(tokenizer.eos_token, terminate_at)
    played = Episode(env, tokenizer, frozenset({tokenizer.eos_token_id}), max_policy_tokens, max_tokens)
    assert played.begin(None) == "P:"
    assert not played.done and not played.truncated and played.return_ == 0.0 and played.tokens == []
    return played


def feed(played: Episode, tokens: list[int]) -> list[list[int]]:
    return [played.take(token, -0.5) for token in tokens]


def test_a_message_goes_to_the_env_without_its_stop_token_and_the_observation_follows(tokenizer):
    played = episode(tokenizer)
    eos, bos = tokenizer.eos_token_id, tokenizer.bos_token_id
    one, two = ids(tokenizer, "1")[0], ids(tokenizer, "2")[0]
    feeds = feed(played, [one, bos, two, eos])
    assert feeds[:3] == [[one], [bos], [two]]  # inside a message the model reads its own token
    observation = ids(tokenizer, REPLY)  # the template's stop-token text is not read twice
    assert feeds[3] == [eos, *observation]
    assert played.env.messages == ["12"]  # no stop token, special tokens skipped
    assert played.tokens == [one, bos, two, eos, *observation]
    assert played.policy == [1, 1, 1, 1] + [0] * len(observation)
    assert played.logprobs == [-0.5] * 4 + [0.0] * len(observation)
    assert played.policy_tokens == 4 and played.return_ == 0.25 and not played.done
    # the next message is decoded from its own first token on
    three = ids(tokenizer, "3")[0]
    feed(played, [three, eos])
    assert played.env.messages == ["12", "3"] and played.return_ == 0.5


def test_a_terminated_step_ends_the_episode_untruncated(tokenizer):
    played = episode(tokenizer, terminate_at=1)
    assert feed(played, [ids(tokenizer, "7")[0], tokenizer.eos_token_id])[-1] == []
    assert played.done and not played.truncated and played.env.messages == ["7"]


def test_the_policy_budget_ends_a_message_and_the_episode_truncated(tokenizer):
    played = episode(tokenizer, max_policy_tokens=3)
    digits = ids(tokenizer, "123")
    assert feed(played, digits) == [[digits[0]], [digits[1]], []]
    assert played.done and played.truncated and played.env.messages == ["123"]  # the cut message is still played


def test_the_episode_budget_counts_every_token_to_the_last_one(tokenizer):
    played = episode(tokenizer, max_policy_tokens=20, max_tokens=5)
    digits = ids(tokenizer, "12345")
    assert feed(played, digits)[-1] == [] and played.done and played.truncated
    assert len(played.tokens) == 5 and played.env.messages == ["12345"]


def test_an_observation_that_leaves_no_room_ends_the_episode(tokenizer):
    eos = tokenizer.eos_token_id
    observation = ids(tokenizer, REPLY)
    exact = 2 + len(observation)  # "1" + EOS + the observation reaches the budget: no policy token would fit
    played = episode(tokenizer, max_tokens=exact)
    assert feed(played, [ids(tokenizer, "1")[0], eos])[-1] == []
    assert played.done and played.truncated and len(played.tokens) == 2
    roomy = episode(tokenizer, max_tokens=exact + 1)
    assert feed(roomy, [ids(tokenizer, "1")[0], eos])[-1] == [eos, *observation] and not roomy.done
    assert roomy.tokens_left == 1


def test_episodes_result_holds_each_episodes_fields(tokenizer):
    first = types.SimpleNamespace(tokens=[5, 6, 7], policy=[1, 0, 1], logprobs=[-0.5, 0.0, -0.25], return_=1.25,
                                  truncated=False, info={"turn": 2, "tool_calls": ["call"], "tool_errors": 1,
                                                         "verifier_status": "correct",
                                                         "reward_components": {"format": 0.5}})
    special = tokenizer.bos_token_id
    second = types.SimpleNamespace(tokens=[special, 8], policy=[1, 1], logprobs=[-1.0, -2.0], return_=0.0,
                                   truncated=True, info={"turn": 1, "tool_calls": [], "tool_errors": 0})
    env = types.SimpleNamespace(pad_id=0, tokenizer=tokenizer, group_ids=torch.tensor([0, 0]), problems=("a", "b"))
    prompt_ids, prompt_mask = torch.tensor([[0, 3], [4, 4]]), torch.tensor([[0, 1], [1, 1]])
    result = episodes_result(env, [first, second], prompt_ids, prompt_mask)
    assert isinstance(result, MultiTurnRollout)
    assert result.prompt_ids is prompt_ids and result.prompt_mask is prompt_mask
    assert result.response_ids.tolist() == [[5, 6, 7], [special, 8, 0]]
    assert result.response_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert result.policy_mask.tolist() == [[1, 0, 1], [1, 1, 0]]
    assert result.logprobs.tolist() == [[-0.5, 0.0, -0.25], [-1.0, -2.0, 0.0]]
    assert result.scores.tolist() == [1.25, 0.0] and result.scores.dtype == torch.float32
    assert {name: value.tolist() for name, value in result.reward_components.items()} == {"format": [0.5, 0.0]}
    assert result.reward_components["format"].dtype == torch.float32
    assert result.statuses == ["correct", NO_ANSWER]
    assert result.completions == tokenizer.batch_decode([[5, 6, 7], [8]])  # special tokens skipped
    assert result.truncated.tolist() == [False, True]
    assert result.group_ids is env.group_ids and result.problems == ["a", "b"]
    assert result.process_rewards.tolist() == [[0.0] * 3] * 2 and result.process_rewards.dtype == torch.float32
    assert result.process_step_mask.dtype == torch.bool and not result.process_step_mask.any()
    assert result.turns.tolist() == [2, 1] and result.tool_calls.tolist() == [1, 0]
    assert result.tool_errors.tolist() == [1, 0]
    for name in ("response_ids", "response_mask", "policy_mask", "logprobs"):
        assert getattr(result, name).shape == (2, 3), name
    for name in ("response_ids", "response_mask", "policy_mask", "turns", "tool_calls", "tool_errors"):
        assert getattr(result, name).dtype == torch.long, name

    on_meta = episodes_result(env, [first, second], prompt_ids.to("meta"), prompt_mask.to("meta"))
    tensors = {name: value for name, value in vars(on_meta).items() if isinstance(value, torch.Tensor)}
    tensors.update({f"reward_components.{k}": v for k, v in on_meta.reward_components.items()})
    assert {name: value.device.type for name, value in tensors.items() if name != "group_ids"} == {
        name: "meta" for name in tensors if name != "group_ids"}


def episode_counts(turns, tool_calls, tool_errors, policy_mask) -> MultiTurnRollout:
    """A MultiTurnRollout holding only what episode_metrics reads."""
    unread = dict.fromkeys(("prompt_ids", "prompt_mask", "response_ids", "response_mask", "scores", "truncated",
                            "group_ids", "process_rewards", "process_step_mask"))
    return MultiTurnRollout(**unread, reward_components={}, statuses=[], completions=[], problems=[],
                            turns=torch.tensor(turns), tool_calls=torch.tensor(tool_calls),
                            tool_errors=torch.tensor(tool_errors), policy_mask=torch.tensor(policy_mask))


def test_episode_metrics_are_means_over_the_episodes():
    result = episode_counts([2, 1, 3, 2], [1, 0, 2, 1], [1, 0, 0, 0], [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    assert episode_metrics(result) == {"turns_mean": 2.0, "tool_calls_mean": 1.0, "tool_errors_mean": 0.25,
                                       "policy_len_mean": 1.5}
    one = episode_counts([3], [2], [1], [[1, 1]])
    assert episode_metrics(one) == {"turns_mean": 3.0, "tool_calls_mean": 2.0, "tool_errors_mean": 1.0,
                                    "policy_len_mean": 2.0}
    assert episode_metrics(types.SimpleNamespace(response_mask=torch.ones(1, 1))) == {}  # single-turn: none


def test_turn_seeds_are_pinned_and_fold_any_python_int():
    # Literal values: a changed formula would resample every multi-turn run's tokens
    assert position_seed(0, 0) == 821328063 and position_seed(12345, 17) == 1846581357
    assert position_seed(2**63 + 5, 3) == position_seed(5, 3) == 727168946  # seeds of any size fold to numpy's range
    assert all(0 <= position_seed(seed, 1) < 2**31 - 1 for seed in range(200))


def test_squeezing_keeps_each_rows_columns_in_order():
    class Layer:
        def __init__(self, keys):
            self.keys, self.values = keys, -keys

    keys = torch.arange(2 * 1 * 5 * 1, dtype=torch.float32).reshape(2, 1, 5, 1)
    cache = types.SimpleNamespace(layers=[Layer(keys.clone())])
    mask = torch.tensor([[1, 0, 1, 0, 1], [0, 1, 1, 0, 0]])
    squeezed = squeeze_cache_holes(cache, mask)
    assert squeezed.tolist() == [[1, 1, 1], [0, 1, 1]]  # the longest row's 3 columns, each row right-aligned
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [0.0, 2.0, 4.0]
    assert cache.layers[0].keys[1, 0, 1:, 0].tolist() == [6.0, 7.0]  # row 1's real columns 1 and 2, in order
    assert torch.equal(cache.layers[0].values, -cache.layers[0].keys)


def calculator_env(tokenizer, max_new_tokens=8):
    env = TokenVectorEnv(CalculatorArithmeticTask(CalculatorArithmeticTask.config_cls(**TASK_KWARGS)), tokenizer,
                         num_envs=2, max_new_tokens=max_new_tokens)
    env.reset(seed=0, options={"group_size": 1})
    return env


def test_start_episodes_budgets_and_the_models_context(tokenizer):
    env = calculator_env(tokenizer)
    episodes, prompts = start_episodes(env, None, None)
    assert [e.max_tokens for e in episodes] == [16, 16] and [e.max_policy_tokens for e in episodes] == [8, 8]
    assert all(e.env.problem_seed == env.problem_seed for e in episodes)
    # each row's conversation, rendered by the episode's env through the chat template once, tokenized as it is
    assert [tokenizer.decode(prompt) for prompt in prompts] == [e.info["prompt"] for e in episodes]
    assert all(e.info["prompt"].startswith("S:calculator\nU:") and e.info["prompt"].count("U:") == 1 for e in episodes)
    longest = max(len(p) for p in prompts)
    model = build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2)
    model.config.max_position_embeddings = longest + 16
    start_episodes(env, model, None)  # exactly fits
    model.config.max_position_embeddings = longest + 15
    with pytest.raises(ValueError, match=rf"longest initial prompt \({longest} tokens\) \+ the episode's token budget "
                                         rf"\(16: rollout.max_episode_tokens\) exceed the model's context \({longest + 15}\)"):
        start_episodes(env, model, None)
    for player in (EpisodeDriver(None), MultiTurnHFRollout()):  # both players check their model's context
        with pytest.raises(ValueError, match="exceed the model's context"):
            player.generate(model, env)
    single = TokenVectorEnv(ArithmeticTask(ArithmeticTask.config_cls()), tokenizer, num_envs=1, max_new_tokens=4)
    single.reset(seed=0)
    with pytest.raises(ValueError, match="multi-turn rollouts play MultiTurnTasks; ArithmeticTask is single-turn"):
        start_episodes(single, None, None)


def test_the_episode_players_take_their_settings(tokenizer):
    player = MultiTurnHFRollout(temperature=0.5, top_p=0.9, top_k=3, seed=1, max_episode_tokens=1)
    assert (player.params.temperature, player.params.top_p, player.params.top_k) == (0.5, 0.9, 3)
    assert player.seed == 1 and player.max_episode_tokens == 1
    with pytest.raises(ValueError, match="max_episode_tokens must be >= 1 or None, got 0"):
        MultiTurnHFRollout(max_episode_tokens=0)
    assert EpisodeDriver("engine", max_episode_tokens=1).max_episode_tokens == 1
    with pytest.raises(ValueError, match="seeds: one per env row, got 1 for 2 rows"):
        EpisodeDriver("engine").generate(None, calculator_env(tokenizer), seeds=[1])
    synced = []
    EpisodeDriver(types.SimpleNamespace(sync_weights=synced.append)).sync_weights("model")
    assert synced == ["model"]


def test_a_seeded_player_samples_the_same_episodes_whatever_torchs_global_rng(tokenizer):
    """MultiTurnHFRollout(seed=) draws from its own generator when no row seeds are given."""
    torch.manual_seed(0)
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, max_position_embeddings=1024)
    played = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        played.append(MultiTurnHFRollout(seed=7).generate(model, calculator_env(tokenizer)).response_ids)
    assert torch.equal(played[0], played[1])
    torch.manual_seed(1)
    assert not torch.equal(MultiTurnHFRollout(seed=8).generate(model, calculator_env(tokenizer)).response_ids, played[0])
