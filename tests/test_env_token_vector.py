"""TokenVectorEnv: groups, EOS/truncation, batch scoring, autoreset mode, device placement,
tasks that override their verifier, Gymnasium's vector wrappers."""

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, VectorWrapper
from gymnasium.wrappers.vector import RecordEpisodeStatistics

import rlvr_env
from rewards import VerifyResult
from rlvr_env.tasks.arithmetic import ArithmeticTask
from rlvr_env.testing import available_devices, build_char_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def ids(tokenizer, text):
    return [tokenizer.convert_tokens_to_ids(c) for c in text]


def make_env(tokenizer, num_envs=4, max_new_tokens=6, **kwargs):
    task = rlvr_env.make_task("Arithmetic", digits=1)
    return rlvr_env.TokenVectorEnv(task, tokenizer, num_envs=num_envs, max_new_tokens=max_new_tokens, **kwargs)


def test_declares_disabled_autoreset_and_spaces(tokenizer):
    env = make_env(tokenizer)
    assert env.metadata["autoreset_mode"] == AutoresetMode.DISABLED
    assert env.single_action_space.n == len(tokenizer) and env.action_space.shape == (4,)
    obs, _ = env.reset(seed=0)
    assert obs["input_ids"].shape == (4, env.prompt_width + 6)
    assert env.observation_space["input_ids"].shape == (4, env.prompt_width + 6)


def test_groups_share_prompts_and_rows_end_independently(tokenizer):
    env = make_env(tokenizer, num_envs=4, max_new_tokens=4)
    obs, info = env.reset(seed=3, options={"group_size": 2})
    assert info["group_ids"].tolist() == [0, 0, 1, 1]
    prompts = env.prompt_ids
    assert torch.equal(prompts[0], prompts[1]) and torch.equal(prompts[2], prompts[3])
    assert not torch.equal(prompts[0], prompts[2])
    answer = env.problems[0].answer
    eos = tokenizer.eos_token_id
    a = tokenizer.convert_tokens_to_ids("a")
    # row 0: the right answer then EOS; row 1: "a" then EOS; rows 2, 3 run to the budget
    plan = [ids(tokenizer, answer)[0], a, a, a], [eos if len(answer) == 1 else ids(tokenizer, answer)[1], eos, a, a]
    width = env.prompt_width
    first = env.step(torch.tensor(plan[0]))
    assert first[1].tolist() == [0.0] * 4 and not first[2].any()
    _, reward, terminated, truncated, info = env.step(torch.tensor(plan[1]))
    assert terminated.tolist()[:2] == [len(answer) == 1, True]
    assert reward[1] == 0.0 and info["ended"][1]
    while not env.all_done:
        _, reward, terminated, truncated, _ = env.step(torch.full((4,), eos if len(answer) > 1 else a))
    assert truncated.tolist()[2:] == [True, True] and not truncated[:2].any()
    assert (terminated & truncated).sum() == 0
    result = env.results()
    assert result.completions[0] == answer and result.scores[0] == pytest.approx(0.9)
    assert result.completions[1] == "a" and result.statuses[1] == "ok" and result.scores[1] == 0.0
    assert result.completions[2] == "aaaa" and result.truncated.tolist() == [False, False, True, True]
    assert set(result.reward_components) == {"correct", "format"}
    assert result.reward_components["correct"].tolist()[:2] == [1.0, 0.0]
    # response mask: generated tokens incl. EOS; finished rows' later actions stored as pad
    assert result.response_mask[1].tolist() == [1, 1, 0, 0] and result.response_ids[1, 2] == tokenizer.pad_token_id
    assert env.input_ids[1, width + 1] == eos and env.num_generated.tolist()[1:] == [2, 4, 4]
    with pytest.raises(RuntimeError, match="reset"):
        env.step(torch.zeros(4, dtype=torch.long))


def test_left_padding_and_prompt_mask(tokenizer):
    env = make_env(tokenizer, num_envs=2, max_new_tokens=2, use_chat_template=False)
    env.reset(seed=0, options={"problem_indices": [0, 1], "task": {"digits": 1, "terms": 2}})
    long_task = rlvr_env.make_task("Arithmetic", digits=1)
    texts = [long_task.problem(i, 0).prompt for i in (0, 1)]
    for row, text in enumerate(texts):
        mask = env.prompt_mask[row]
        assert tokenizer.decode(env.prompt_ids[row][mask.bool()]) == text
        assert mask.tolist() == sorted(mask.tolist())  # pads on the left only


def test_reset_errors(tokenizer):
    env = make_env(tokenizer, num_envs=4, max_prompt_tokens=5)
    with pytest.raises(ValueError, match="group_size"):
        env.reset(options={"group_size": 3})
    with pytest.raises(ValueError, match="problem_indices"):
        env.reset(options={"group_size": 2, "problem_indices": [1]})
    with pytest.raises(ValueError, match="max_prompt_tokens=5"):
        env.reset(seed=0)
    with pytest.raises(ValueError, match="unknown reset option 'groups'"):
        env.reset(options={"groups": 2})
    with pytest.raises(RuntimeError, match="finished batch"):
        make_env(tokenizer).results()


def test_same_seed_same_batch(tokenizer):
    first, second = make_env(tokenizer), make_env(tokenizer)
    assert torch.equal(first.reset(seed=9)[0]["input_ids"], second.reset(seed=9)[0]["input_ids"])


@pytest.mark.parametrize("device", available_devices())
def test_state_lives_on_the_chosen_device(tokenizer, device):
    env = make_env(tokenizer, num_envs=2, max_new_tokens=3, device=device)
    obs, _ = env.reset(seed=0)
    assert all(t.device.type == device for t in obs.values())
    _, reward, terminated, truncated, _ = env.step(torch.full((2,), tokenizer.eos_token_id, device=device))
    assert reward.device.type == terminated.device.type == device and terminated.all()
    result = env.results()
    assert result.scores.device.type == result.response_ids.device.type == device


def test_step_outputs_keep_their_values_and_obs_are_live_views(tokenizer):
    env = make_env(tokenizer, num_envs=2, max_new_tokens=3)
    obs, _ = env.reset(seed=0)
    eos, a = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("a")
    first = env.step(torch.tensor([eos, a]))
    snapshot = [t.clone() for t in first[1:4]]
    while not env.all_done:
        last = env.step(torch.tensor([a, a]))
    assert all(torch.equal(t, s) for t, s in zip(first[1:4], snapshot))  # later steps write other rows
    assert first[2].tolist() == [True, False] and last[2].tolist() == [True, False] and last[3].tolist() == [False, True]
    assert last[0] is obs and obs["num_generated"].tolist() == [1, 3]  # one dict of views, updated in place


@dataclass(frozen=True)
class WorkingRequired:
    """A verifier wrapping another: no reward without the working shown."""

    inner: object
    in_process_safe = True  # the wrapped arithmetic verifier is bounded; the check is one substring test

    def __call__(self, completion, *, answer, **info):
        result = self.inner(completion, answer=answer, **info)
        if "=" in completion:
            return result
        return VerifyResult(0.0, result.status, {**result.details, "components": {"correct": 0.0, "format": 0.0}})


class WorkingRequiredArithmetic(ArithmeticTask):
    """Overrides its verifier, the one scoring hook of the Task contract."""

    @property
    def verifier(self):
        return WorkingRequired(super().verifier)


def test_every_view_scores_a_task_that_overrides_its_verifier(tokenizer):
    task = WorkingRequiredArithmetic(digits=1)
    problem = task.problem(0, 0)
    completions = [f"\\boxed{{{problem.answer}}}", task.gold_completion(problem)]  # right answer; with working
    eos = tokenizer.eos_token_id

    completion_rewards, token_rewards = [], []
    for text in completions:
        env = rlvr_env.CompletionEnv(task)
        env.reset(seed=0, options={"problem_index": 0})
        completion_rewards.append(env.step(text)[1])
        env = rlvr_env.TokenEnv(task, tokenizer, max_new_tokens=64)
        env.reset(seed=0, options={"problem_index": 0})
        for token in ids(tokenizer, text) + [eos]:
            reward = env.step(token)[1]
        token_rewards.append(reward)

    vector = rlvr_env.TokenVectorEnv(task, tokenizer, num_envs=2, max_new_tokens=64)
    vector.reset(seed=0, options={"group_size": 2, "problem_indices": [0]})
    plans = [ids(tokenizer, text) + [eos] for text in completions]
    for step in range(max(len(plan) for plan in plans)):
        vector.step(torch.tensor([plan[min(step, len(plan) - 1)] for plan in plans]))
    result = vector.results()

    assert completion_rewards == token_rewards == result.scores.tolist() == [0.0, 1.0]
    assert result.reward_components["correct"].tolist() == [0.0, 1.0] and result.completions == completions


def test_results_carry_their_prompts_and_which_rows_solved(tokenizer):
    task = rlvr_env.make_task("Arithmetic", digits=1)
    env = rlvr_env.TokenVectorEnv(task, tokenizer, num_envs=3, max_new_tokens=32)
    env.reset(seed=0, options={"group_size": 3})
    prompt_ids, prompt_mask = env.prompt_ids.clone(), env.prompt_mask.clone()
    answer = env.problems[0].answer
    texts = [f"\\boxed{{{answer}}}", f"I get {answer}", f"\\boxed{{{int(answer) + 1}}}"]  # full, correct unboxed, format only
    tokens = torch.full((3, 32), env.pad_id)
    for row, text in enumerate(texts):
        tokens[row, : len(text) + 1] = torch.tensor(ids(tokenizer, text) + [tokenizer.eos_token_id])
    result = env.finish_with(tokens)
    env.reset(seed=1)

    assert result.scores.tolist() == pytest.approx([1.0, 0.9, 0.1])
    expected = [task.is_success(task.verifier(text, answer=answer)) for text in texts]
    assert result.solved.dtype == torch.bool and result.solved.tolist() == expected == [True, True, False]
    assert torch.equal(result.prompt_ids, prompt_ids) and torch.equal(result.prompt_mask, prompt_mask)  # kept past the next reset
    assert result.prompt_ids.dtype == result.prompt_mask.dtype == torch.long


def test_solved_is_the_correct_component_else_the_score_at_full_credit():
    from rlvr_env.task import solved

    assert solved(1.1, {"correct": 0.65}) is False and solved(0.9, {"correct": 1.0}) is True and solved(1.0, {}) is True
    scores = torch.tensor([1.0, 0.99, 0.5])
    assert solved(scores, {}).tolist() == [True, False, False]
    assert solved(scores, {"correct": torch.tensor([0.0, 1.0, 1.0])}).tolist() == [False, True, True]


def test_gymnasium_vector_wrappers_are_refused_with_the_reason(tokenizer):
    """RecordEpisodeStatistics failed on the env's torch tensors with a TypeError about NumPy concatenation."""
    with pytest.raises(TypeError, match=r"cannot run under Gymnasium's vector wrappers \(RecordEpisodeStatistics\)"):
        RecordEpisodeStatistics(make_env(tokenizer)).reset(seed=0)

    class TorchAwareWrapper(VectorWrapper):  # a user's own wrapper, written for tensors, is left alone
        pass

    obs, _ = TorchAwareWrapper(make_env(tokenizer)).reset(seed=0)
    assert obs["input_ids"].shape[0] == 4


def test_the_views_the_docs_name_instead_work_under_record_episode_statistics(tokenizer):
    completions = RecordEpisodeStatistics(gym.make_vec("rlvr/Arithmetic-v0", num_envs=2, digits=1))
    completions.reset(seed=0)
    *_, info = completions.step(("\\boxed{1}", "\\boxed{2}"))
    assert info["episode"]["l"].tolist() == [1, 1]

    def token_env():
        return rlvr_env.TokenEnv(rlvr_env.make_task("Arithmetic", digits=1), tokenizer, max_new_tokens=3)

    tokens = RecordEpisodeStatistics(gym.vector.SyncVectorEnv([token_env, token_env]))
    tokens.reset(seed=0)
    *_, info = tokens.step(np.array([tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("a")]))
    assert info["_episode"].tolist() == [True, False] and info["episode"]["l"][0] == 1
