"""TokenVectorEnv.finish_with: whole completions at once leave the env and its results as stepping them token by token."""

import dataclasses

import pytest
import torch

import rlvr_env
from rlvr_env.testing import available_devices, build_char_tokenizer

MAX_NEW_TOKENS = 64
DEVICES = available_devices()


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def task():
    return rlvr_env.make_task("Countdown", num_numbers=3, step_reward=0.1)


def scripted_texts(problems) -> list[str]:
    """Per row: full working and the answer; a wrong answer; nothing; working cut at max_new_tokens mid-line and
    on a newline; a trailing line of working before the stop token."""
    texts = []
    for row, problem in enumerate(problems):
        a, b, c = problem.answer["numbers"]
        first, second = f"{a} + {b} = {a + b}\n", f"{a + b} * {c} = {(a + b) * c}\n"
        texts.append([
            first + "\n" + second + f"\\boxed{{{problem.metadata['solution']}}}",
            "\\boxed{1}",
            "",
            (first + second) * 4,
            (first + "x" * (MAX_NEW_TOKENS - 2 * len(first) - 1) + "\n" + first)[: MAX_NEW_TOKENS + 5],
            first + f"{a + b} * {c} = {(a + b) * c}",
        ][row % 6])
    return texts


def planned_tokens(env, tokenizer, texts) -> torch.Tensor:
    """Long[B, max_new_tokens]: each text's ids, then EOS, then pad; a text too long for the row is cut."""
    tokens = torch.full((env.num_envs, env.max_new_tokens), env.pad_id, dtype=torch.long)
    for row, text in enumerate(texts):
        ids = (tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id])[: env.max_new_tokens]
        tokens[row, : len(ids)] = torch.tensor(ids)
    return tokens


def fresh_env(task, tokenizer, num_envs=12, device="cpu"):
    env = rlvr_env.TokenVectorEnv(task, tokenizer, num_envs=num_envs, max_new_tokens=MAX_NEW_TOKENS, device=device)
    env.reset(seed=0, options={"group_size": 6})
    return env


def assert_same(env, expected_env, result, expected):
    for field in dataclasses.fields(expected):
        ours, theirs = getattr(result, field.name), getattr(expected, field.name)
        if isinstance(theirs, torch.Tensor):
            assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), field.name
        elif isinstance(theirs, dict):
            assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs), field.name
        else:
            assert ours == theirs, field.name
    for name in ("terminated", "truncated", "running", "num_generated", "input_ids", "attention_mask"):
        assert torch.equal(getattr(env, name), getattr(expected_env, name)), name
    assert env.all_done and env._steps == expected_env._steps


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stepped_first", [0, 3])
def test_matches_stepping_token_by_token_with_process_rewards_and_truncation(task, tokenizer, stepped_first, device):
    stepped, finished = fresh_env(task, tokenizer, device=device), fresh_env(task, tokenizer, device=device)
    tokens = planned_tokens(stepped, tokenizer, scripted_texts(stepped.problems)).to(device)
    column = 0
    while not stepped.all_done:
        stepped.step(tokens[:, column])
        column += 1
    expected = stepped.results()
    for column in range(stepped_first):  # finish_with takes over an env already stepped part of the way
        finished.step(tokens[:, column])
    result = finished.finish_with(tokens[:, stepped_first:])

    assert_same(finished, stepped, result, expected)
    # The scenario reaches what it is meant to: truncated rows, process rewards on several steps, a solved row.
    assert expected.truncated.tolist() == [False, False, False, True, True, False] * 2
    assert (expected.process_rewards > 0).sum() >= 8 and expected.process_step_mask.sum() > (expected.process_rewards > 0).sum()
    assert expected.scores.tolist()[:3] == [1.0, 0.0, 0.0] and expected.statuses[2] == "no_answer"


def test_needs_every_row_to_reach_its_end(task, tokenizer):
    env = fresh_env(task, tokenizer, num_envs=6)
    tokens = planned_tokens(env, tokenizer, scripted_texts(env.problems))
    with pytest.raises(ValueError, match=r"rows \[0, 3, 4\] have no stop token in their 30 response_ids"):
        env.finish_with(tokens[:, :30])
    tokens[2, 0] = len(tokenizer)
    with pytest.raises(ValueError, match=rf"response_ids of rows \[2\] are \[{len(tokenizer)}\], not token ids"):
        env.finish_with(tokens)
    with pytest.raises(ValueError, match=r"Long\[num_envs=6, T\]"):
        env.finish_with(tokens[0])
    assert not env.num_generated.any()  # refused before writing anything
    env.finish_with(planned_tokens(env, tokenizer, [""] * 6))
    with pytest.raises(RuntimeError, match="every row has finished"):
        env.finish_with(tokens)


def test_tokens_after_a_rows_end_are_ignored(task, tokenizer):
    env, padded = fresh_env(task, tokenizer, num_envs=6), fresh_env(task, tokenizer, num_envs=6)
    tokens = planned_tokens(env, tokenizer, ["\\boxed{1}"] * 6)
    noisy = tokens.clone()
    noisy[tokens == env.pad_id] = tokenizer.convert_tokens_to_ids("7")
    assert_same(env, padded, env.finish_with(noisy), padded.finish_with(tokens))
