"""rlvr/Dataset-v0: a user's own file in TRL's, verl's or the plain row format trains with no code written; every bad
row is named by file, line and field."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
import torch

import rlvr_env
from algos.algorithms.grpo import GRPOConfig
from algos.config import load_config
from algos.rollout.environment import make_env
from rlvr_env.data import DataFileError
from rlvr_env.testing import build_char_tokenizer

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_plain_rows_are_asked_through_the_template_and_scored_by_the_math_verifier(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "Halve 3.", "answer": "3/2"}])
    env = gym.make("rlvr/Dataset-v0", data_path=path, prompt_template="{prompt} Answer in \\boxed{{}}.")
    prompt, info = env.reset(seed=0)
    assert prompt == "Halve 3. Answer in \\boxed{}." and info["messages"] == [{"role": "user", "content": prompt}]
    assert env.step("so it is \\boxed{1.5}")[1] == 1.0
    env.reset(seed=0)
    assert env.step("\\boxed{2}")[1] == 0.0


def test_trl_conversational_rows_with_worked_solutions(tmp_path):
    rows = [{"prompt": QUESTION, "solution": "Two and two make \\boxed{4}."}]
    task = rlvr_env.make_task("Dataset", data_path=write_jsonl(tmp_path / "trl.jsonl", rows), answer_field="solution",
                              answer_in_boxed=True, system_prompt="Think first.", few_shot=[("1 + 1?", "\\boxed{2}")])
    problem = task.problem(0, 0)
    assert problem.answer == "4"
    assert task.messages(problem) == [
        {"role": "system", "content": "Think first."},
        {"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "\\boxed{2}"},
        *QUESTION,
    ]


def test_verl_parquet_rows_keep_their_own_system_turn_and_nested_ground_truth(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    turns = [{"role": "system", "content": "Box it."}, *QUESTION, {"role": "assistant", "content": "5?"},
             {"role": "user", "content": "Check again."}]
    rows = [{"data_source": "mine", "prompt": turns, "reward_model": {"style": "rule", "ground_truth": 4}}]
    path = tmp_path / "train.parquet"
    parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    task = rlvr_env.make_task("Dataset", data_path=str(path), answer_field="reward_model.ground_truth",
                              system_prompt="never shown: the row has its own")
    problem = task.problem(0, 0)
    assert problem.answer == "4" and problem.prompt == "Check again."
    assert task.messages(problem) == turns
    assert task.verifier("\\boxed{4}", answer=problem.answer).score == 1.0


def test_the_trainer_renders_chat_rows_with_the_models_template(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": QUESTION, "answer": "4"}])
    config = load_config(GRPOConfig, overrides={"env.id": "rlvr/Dataset-v0", "env.kwargs": f"{{data_path: {path}}}"})
    tokenizer = build_char_tokenizer()
    env = make_env(config, tokenizer, num_envs=2, device=torch.device("cpu"))
    env.reset(seed=0)
    assert tokenizer.decode(env.input_ids[0, : env.prompt_width]) == "U:What is 2 + 2?\nA:"


@pytest.mark.parametrize(("rows", "kwargs", "message"), [
    ([{"question": "x", "answer": "1"}], {}, r"rows\.jsonl:1: missing field 'prompt' \(the row has: answer, question\)"),
    ([{"prompt": "x", "reward_model": {"style": "rule"}}], {"answer_field": "reward_model.ground_truth"},
     r":1: missing field 'reward_model.ground_truth' \(reward_model has: style\)"),
    ([{"prompt": "x", "answer": "1"}, {"prompt": "", "answer": "1"}], {},
     r":2: field 'prompt' must be a non-empty string or a list of chat turns"),
    ([{"prompt": [{"role": "user", "text": "x"}], "answer": "1"}], {}, r":1: field 'prompt' turn 0 must be"),
    ([{"prompt": [*QUESTION, {"role": "assistant", "content": "4"}], "answer": "4"}], {},
     r"must start \(after a system turn\) and end with a user turn, got roles \['user', 'assistant'\]"),
    ([{"prompt": "x", "answer": [1, 2]}], {}, r":1: field 'answer' must be a non-empty string or a number"),
    ([{"prompt": "x", "answer": "no box"}], {"answer_in_boxed": True}, r":1: field 'answer' has no final \\boxed"),
])
def test_a_bad_row_is_named_by_file_line_and_field(tmp_path, rows, kwargs, message):
    with pytest.raises(DataFileError, match=message):
        rlvr_env.make_task("Dataset", data_path=write_jsonl(tmp_path / "rows.jsonl", rows), **kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"answer_field": "reward_model."}, "answer_field must be a field name"),
    ({"prompt_template": "no placeholder"}, r"prompt_template must contain \{prompt\}"),
    ({"answer_in_boxed": "yes"}, "answer_in_boxed must be true or false"),
])
def test_bad_config_is_named(tmp_path, kwargs, message):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "x", "answer": "1"}])
    with pytest.raises(ValueError, match=message):
        rlvr_env.make_task("Dataset", data_path=path, **kwargs)


def test_without_a_file_the_error_names_the_kwarg_and_the_variable(monkeypatch):
    monkeypatch.delenv("RLVR_DATASET_PATH", raising=False)
    with pytest.raises(DataFileError, match="pass data_path=... or set RLVR_DATASET_PATH"):
        rlvr_env.make_task("Dataset")
