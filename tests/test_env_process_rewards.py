"""Per-step process rewards: the Task hook, Countdown's lines of working, and how both token envs credit them."""

from collections import Counter

import pytest
import torch

import rlvr_env
from rlvr_env.tasks.countdown import apply_working_line
from rlvr_env.testing import build_char_tokenizer

STEP_REWARD = 0.1


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def task():
    return rlvr_env.make_task("Countdown", num_numbers=3, step_reward=STEP_REWARD)


def working(problem) -> str:
    """Two valid lines of working, a blank line, prose, then the boxed gold expression."""
    a, b, c = problem.answer["numbers"]
    return f"{a} + {b} = {a + b}\n\n{a + b} * {c} = {(a + b) * c}\nso:\n\\boxed{{{problem.metadata['solution']}}}"


def test_working_lines_use_available_numbers_once():
    available = Counter([3, 5, 7])
    assert apply_working_line("Step 1: 3 + 5 = 8.", available)
    assert available == Counter({7: 1, 8: 1})
    assert not apply_working_line("3 + 5 = 8", available)  # 3 and 5 are used up
    assert apply_working_line("8 * 7 = 56", available) and available == Counter({56: 1})
    assert not apply_working_line("56 = 56", Counter([56]))  # one number: no operation, no credit
    assert not apply_working_line("2 + 2 = 5", Counter([2, 2]))
    assert not apply_working_line("the answer is 8", Counter([8]))
    assert not apply_working_line("import os = 1", Counter([1]))


def test_countdown_process_reward_is_opt_in_and_validated(task):
    problem = task.problem(0, 0)
    a, b, _ = problem.answer["numbers"]
    assert rlvr_env.make_task("Countdown").process_step_end is None
    assert task.process_step_end == "\n"
    assert task.process_reward(problem, f"{a} + {b} = {a + b}\n") == STEP_REWARD
    assert task.process_reward(problem, f"{a} + {b} = {a + b}\n{a} + {b} = {a + b}\n") == 0.0  # reused numbers
    with pytest.raises(ValueError, match="step_reward"):
        rlvr_env.make_task("Countdown", step_reward=-1)


def step_text(env, tokenizer, text: str):
    """Step TokenEnv through ``text`` then EOS; the rewards of every step and the final info."""
    outcomes = [env.step(tokenizer.convert_tokens_to_ids(ch)) for ch in text]
    outcomes.append(env.step(tokenizer.eos_token_id))
    return [o[1] for o in outcomes], outcomes[-1][4]


def test_token_env_credits_each_step_on_its_newline(task, tokenizer):
    env = rlvr_env.TokenEnv(task, tokenizer, max_new_tokens=200)
    _, info = env.reset(seed=0)
    problem = task.problem(info["problem_index"], 0)
    text = working(problem)
    rewards, final_info = step_text(env, tokenizer, text)
    newlines = [i for i, ch in enumerate(text) if ch == "\n"]
    credited = {i for i, r in enumerate(rewards[:-1]) if r}
    assert credited == {newlines[0], newlines[2]}  # each valid line, on its own newline; not the blank line
    assert all(rewards[i] == STEP_REWARD for i in credited)
    assert final_info["verifier_status"] == "ok" and rewards[-1] == pytest.approx(1.0)  # answer line: no working


def test_token_env_credits_a_trailing_step_at_truncation(task, tokenizer):
    env = rlvr_env.TokenEnv(task, tokenizer, max_new_tokens=20)
    _, info = env.reset(seed=0)
    a, b, _ = task.problem(info["problem_index"], 0).answer["numbers"]
    line = f"{a} + {b} = {a + b}"
    outcomes = [env.step(tokenizer.convert_tokens_to_ids(ch)) for ch in line.ljust(20)[:20]]
    assert outcomes[-1][3] and outcomes[-1][1] == pytest.approx(STEP_REWARD)  # truncated: score 0 + the last line
    assert sum(o[1] for o in outcomes) == pytest.approx(STEP_REWARD)


def test_vector_env_matches_token_env_per_step(task, tokenizer):
    env = rlvr_env.TokenVectorEnv(task, tokenizer, num_envs=2, max_new_tokens=200)
    env.reset(seed=0, options={"group_size": 2})
    problem = env.problems[0]
    texts = [working(problem), "1 + 1 = 3\nno"]  # row 1: no valid line
    plans = [[tokenizer.convert_tokens_to_ids(ch) for ch in t] + [tokenizer.eos_token_id] for t in texts]
    step_rewards = []
    for step in range(max(map(len, plans))):
        actions = torch.tensor([p[step] if step < len(p) else tokenizer.pad_token_id for p in plans])
        step_rewards.append(env.step(actions)[1])
    assert env.all_done
    result = env.results()
    single = rlvr_env.TokenEnv(task, tokenizer, max_new_tokens=200)
    single.reset(seed=0, options={"problem_index": env.problems[0].metadata["index"]})
    expected, _ = step_text(single, tokenizer, texts[0])
    assert [r[0].item() for r in step_rewards] == pytest.approx(expected)
    assert result.process_rewards.shape == result.response_ids.shape
    assert result.process_rewards[0].sum().item() == pytest.approx(2 * STEP_REWARD)
    assert not result.process_rewards[1].any() and result.scores.tolist() == [1.0, 0.0]  # scores exclude process rewards
    # Every step is marked where it ends, 0-reward steps too ("so:", the answer line, row 1's invalid line);
    # the blank line is no step. A final step ends on the stop token.
    newlines = [i for i, ch in enumerate(texts[0]) if ch == "\n"]
    assert result.process_step_mask[0].nonzero().flatten().tolist() == [newlines[0], newlines[2], newlines[3], len(texts[0])]
    assert result.process_step_mask[1].nonzero().flatten().tolist() == [texts[1].index("\n"), len(texts[1])]


def test_process_rewards_off_by_default(tokenizer):
    env = rlvr_env.TokenVectorEnv(rlvr_env.make_task("Countdown"), tokenizer, num_envs=2, max_new_tokens=4)
    env.reset(seed=0)
    newline = tokenizer.convert_tokens_to_ids("\n")
    while not env.all_done:
        _, reward, *_ = env.step(torch.full((2,), newline))
        assert not reward.any()
    result = env.results()
    assert not result.process_rewards.any() and not result.process_step_mask.any()
