"""rlvr/Dataset-v0: a user's own file in TRL's, verl's or the plain row format trains with no code written; every bad
row is named by file, line and field."""

from __future__ import annotations

import asyncio
import json
import re
import warnings

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
    task = rlvr_env.make_task("Dataset", data_path=path, system_prompt="Be brief.")
    problem = task.problem(0, 0)
    assert problem.metadata == {"index": 0, "line": 1}
    assert task.messages(problem) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Halve 3."}]
    env = gym.make("rlvr/Dataset-v0", data_path=path, prompt_template="{prompt} Answer in \\boxed{{}}.")
    prompt, info = env.reset(seed=0)
    assert prompt == "Halve 3. Answer in \\boxed{}." and info["messages"] == [{"role": "user", "content": prompt}]
    assert env.step("so it is \\boxed{1.5}")[1] == 1.0
    env.reset(seed=0)
    assert env.step("\\boxed{2}")[1] == 0.0


def test_a_list_of_accepted_answers_scores_a_completion_equal_to_any(tmp_path):
    """verl's rows may list the answers a question accepts; the math verifier takes the best of them."""
    rows = [{"prompt": "Name 2 + 2.", "answer": ["4", "four", 4.0]}, {"prompt": "x", "answer": []}]
    path = write_jsonl(tmp_path / "rows.jsonl", rows[:1])
    task = rlvr_env.make_task("Dataset", data_path=path, format_weight=0.5)
    problem = task.problem(0, 0)
    assert problem.answer == ("4", "four", "4.0")
    scores = [task.verifier(text, answer=problem.answer).score for text in ("\\boxed{four}", "\\boxed{4}", "\\boxed{5}")]
    assert scores == [1.5, 1.5, 0.5]  # right by the second gold, by the first; wrong (the box's format credit only)
    assert task.gold_completion(problem) == "The answer is \\boxed{4}."  # the first accepted answer
    assert task.verifier(task.gold_completion(problem), answer=problem.answer).score == 1.5
    env = gym.make("rlvr/Dataset-v0", data_path=path)
    env.reset(seed=0)
    assert env.step("so \\boxed{four}")[1] == 1.0
    with pytest.raises(DataFileError, match=r":2: field 'answer' is an empty list of accepted answers"):
        rlvr_env.make_task("Dataset", data_path=write_jsonl(tmp_path / "bad.jsonl", rows))
    with pytest.raises(DataFileError, match=r"worse\.jsonl:1: field 'answer' must be a non-empty string or a number, got None"):
        rlvr_env.make_task("Dataset", data_path=write_jsonl(tmp_path / "worse.jsonl", [{"prompt": "x", "answer": [None]}]))


def test_trl_conversational_rows_with_worked_solutions(tmp_path):
    rows = [{"prompt": QUESTION, "solution": "Two and two make \\boxed{4}."},
            {"prompt": QUESTION, "solution": "So $x = \\boxed{2}$ and $y = \\boxed{3}$."},
            {"prompt": QUESTION, "solution": "So $x = \\boxed{3}$ or $x = \\boxed{-3}$."}]
    task = rlvr_env.make_task("Dataset", data_path=write_jsonl(tmp_path / "trl.jsonl", rows), answer_field="solution",
                              answer_in_boxed=True, system_prompt="Think first.", few_shot=[("1 + 1?", "\\boxed{2}")])
    problem = task.problem(0, 0)
    # a final sentence's boxes answer together, the roots of "or" too: a gold solution lists, it does not hedge
    assert [task.problem(i, 0).answer for i in range(3)] == ["4", "2, 3", "3, -3"]
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
    ([{"prompt": "x", "answer": [1, [2]]}], {}, r":1: field 'answer' must be a non-empty string or a number"),
    ([{"prompt": "x", "answer": "no box"}], {"answer_in_boxed": True}, r":1: field 'answer' has no final \\boxed"),
    ([{"prompt": "x", "answer": None}], {"answer_in_boxed": True},
     r"rows\.jsonl:1: field 'answer' must be a non-empty string or a number, got None"),
    ([{"prompt": "x", "answer": "an empty \\boxed{}"}], {"answer_in_boxed": True}, r":1: field 'answer' has no final"),
    ([{"prompt": "x", "answer": "   "}], {}, r"rows\.jsonl:1: field 'answer' must be a non-empty string or a number"),
    ([{"prompt": "x", "answer": None}], {"verifier": "rewards:math_verifier"}, r"rows\.jsonl:1: field 'answer' is null"),
    ([{"prompt": [{"role": "system", "content": "s"}], "answer": "1"}], {}, r"rows\.jsonl:1: .*got roles \['system'\]"),
    ([{"prompt": "x", "gold": {"value": "1"}}], {"answer_field": "gold.value.text"},
     r"rows\.jsonl:1: missing field 'gold.value.text' \(gold.value has: str\)"),
    ([{"prompt": "x", "answer": "1"}], {"demonstration_field": "work"}, r"rows\.jsonl:1: missing field 'work'"),
    ([{"prompt": "x", "answer": "1"}], {"info_fields": ["meta.source"], "verifier": "rewards:math_verifier"},
     r"rows\.jsonl:1: missing field 'meta.source' \(the row has: answer, prompt\)"),
    ([{"prompt": 5, "answer": "1"}], {}, r"rows\.jsonl:1: field 'prompt' must be a non-empty string or a list"),
])
def test_a_bad_row_is_named_by_file_line_and_field(tmp_path, rows, kwargs, message):
    with pytest.raises(DataFileError, match=message):
        rlvr_env.make_task("Dataset", data_path=write_jsonl(tmp_path / "rows.jsonl", rows), **kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"answer_field": "reward_model."}, "answer_field must be a field name"),
    ({"prompt_field": ""}, "prompt_field must be a field name"),
    ({"demonstration_field": 3}, "demonstration_field must be a field name"),
    ({"info_fields": "source", "verifier": "rewards:math_verifier"}, "info_fields must be a list of field names"),
    ({"info_fields": 5, "verifier": "rewards:math_verifier"}, "info_fields must be a list of field names"),
    ({"fallback_last_number": "no"}, "fallback_last_number must be true or false"),
    ({"boxed_only": "no"}, "boxed_only must be true or false"),
    ({"prompt_template": "no placeholder"}, r"prompt_template must contain \{prompt\}"),
    ({"answer_in_boxed": "yes"}, "answer_in_boxed must be true or false"),
    ({"verifier_kwargs": {"strict": True}}, "verifier_kwargs go to a verifier of your own"),
    ({"verifier": "test_task_dataset:length_reward", "verifier_kwargs": ["strict"]},
     r"verifier_kwargs: .*its keyword arguments are a mapping of names to values, got \['strict'\]"),
    ({"verifier": "test_task_dataset:verl_reward", "verifier_kwargs": {"extra_info": {}}},
     "verifier_kwargs: .*keyword argument 'extra_info' is one the call sets itself"),
    ({"verifier": "test_task_dataset:trl_length_reward", "verifier_kwargs": {"answer": "4"}},
     "verifier_kwargs: .*keyword argument 'answer' is one the call sets itself"),  # the TRL function's answer column
    ({"reward_functions": "rewards:math_verifier"}, "reward_functions must be a list of 'package.module:function'"),
    ({"reward_functions": ["rewards:math_verifier", "nowhere_at_all:f"]}, r"reward_functions\[1\]: .*cannot import"),
    ({"reward_functions": ["rewards:math_verifier", "rewards.mathcheck:math_verifier"]},
     r"reward_functions\[1\] 'rewards.mathcheck:math_verifier': its component name 'math_verifier' is taken"),
    ({"reward_functions": ["test_task_dataset:format"]}, r"reward_functions\[0\] .*'format' is taken"),
    ({"reward_functions": ["test_task_dataset:correct"]}, r"reward_functions\[0\] .*'correct' is taken"),
    ({"reward_functions": ["rewards:math_verifier"], "reward_weights": [float("inf")]}, "reward_weights must be a list"),
    ({"reward_functions": ["rewards:math_verifier"], "reward_weights": [1.0, 2.0]},
     "reward_weights has 2 weights for 1 reward_functions: give one each, or none"),
    ({"reward_functions": ["rewards:math_verifier"], "reward_weights": [True]}, "reward_weights must be a list of finite"),
    ({"reward_functions": ["rewards:math_verifier"], "reward_weights": "1"}, "reward_weights must be a list of finite"),
])
def test_bad_config_is_named(tmp_path, kwargs, message):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "x", "answer": "1"}])
    with pytest.raises(ValueError, match=message):
        rlvr_env.make_task("Dataset", data_path=path, **kwargs)


def test_without_a_file_the_error_names_the_kwarg_and_the_variable(monkeypatch):
    monkeypatch.delenv("RLVR_DATASET_PATH", raising=False)
    with pytest.raises(DataFileError, match="pass data_path=... or set RLVR_DATASET_PATH"):
        rlvr_env.make_task("Dataset")


# Reward functions of a user's own, as a test module names them (they run in this process only: ImportedVerifier is
# called directly; score_batch's workers import the project's own functions below).
def length_reward(completion, *, answer, **info):
    return {"score": min(len(completion) / answer, 1.0), "length": len(completion)}


def verl_reward(data_source, solution_str, ground_truth, extra_info=None):
    return float(data_source == "mine" and extra_info["bonus"] and solution_str.strip() == str(ground_truth))


def raising_reward(completion, *, answer, **info):
    raise KeyError(answer)


def junk_reward(completion, *, answer, **info):
    return "yes"


def source_reward(completion, *, answer, source):
    return source == "mine"  # a bool scores 0 or 1


def trl_length_reward(completions, solution, **kwargs):  # TRL's batched signature: lists in, a list out
    return [min(len(completion) / target, 1.0) for completion, target in zip(completions, solution)]


def trl_seen_reward(completions, prompts, source):  # no **kwargs: only the names it takes are passed
    return [float(source[0] == "mine" and prompts[0] == "asked") * len(completions)]


def trl_shape_reward(completions, prompts, **kwargs):  # 1.0 for exactly GRPOTrainer's conversational shapes
    return [float(completions == [[{"role": "assistant", "content": "ok"}]] and type(prompts[0]) is list)]


async def trl_async_reward(completions, **kwargs):
    return [1.0 if completions[0][0]["content"] == "ok" else 0.0]


def verl_scaled_reward(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
    return scale * float(solution_str == ground_truth)


def trl_scaled_reward(completions, answer, scale, **kwargs):
    return [scale * float(completions[0] == answer[0])]


def test_verifier_kwargs_reach_the_function_on_every_call_as_verls_reward_kwargs(tmp_path):
    """verl's custom_reward_function.reward_kwargs: keyword arguments of the verifier's own, in each convention (a TRL
    function's as they are, not as a column)."""
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "2 + 2?", "answer": "4", "source": "a"}])
    for spec in ("test_task_dataset:verl_scaled_reward", "test_task_dataset:trl_scaled_reward"):
        task = rlvr_env.make_task("Dataset", data_path=path, verifier=spec, verifier_kwargs={"scale": 0.25})
        assert task.verify("4", task.problem(0, 0)).score == 0.25
    own = rlvr_env.make_task("Dataset", data_path=path, verifier="test_task_dataset:source_reward",
                             verifier_kwargs={"source": "mine"})  # this project's signature: beside the row's info
    assert own.verify("4", own.problem(0, 0)).score == 1.0
    from rewards.imported import ImportedVerifier

    verl = ImportedVerifier("test_task_dataset:verl_scaled_reward", answer_column="scale", kwargs={"scale": 2.0})
    assert verl("4", answer="4").score == 2.0  # the answer column is a TRL function's only


def trl_too_many_rewards(completions, **kwargs):
    return [1.0, 1.0]


def test_an_imported_reward_function_is_called_its_own_way_and_never_raises():
    from rewards import VerifyResult
    from rewards.imported import ImportedVerifier

    result = ImportedVerifier("test_task_dataset:length_reward")("abc", answer=6)
    assert result == VerifyResult(0.5, "ok", {"length": 3})
    verl = ImportedVerifier("test_task_dataset:verl_reward")
    assert verl(" 4 ", answer=4, data_source="mine", extra_info={"bonus": True}).score == 1.0
    assert verl(" 4 ", answer=4, data_source="theirs", extra_info={"bonus": True}).score == 0.0
    assert ImportedVerifier("test_task_dataset:raising_reward")("x", answer="k") == VerifyResult(
        0.0, "error", {"reason": "KeyError: 'k'"})
    assert ImportedVerifier("test_task_dataset:junk_reward")("x", answer=1) == VerifyResult(
        0.0, "error", {"reason": "the reward function returned 'yes', not a score"})
    assert ImportedVerifier("test_task_dataset:source_reward")("x", answer=1, source="mine") == VerifyResult(1.0, "ok", {})


def test_a_trl_reward_function_gets_a_batch_of_one_as_grpo_trainer_passes_it():
    """TRL's reward_func(completions, prompts, **columns): one-item lists, the answer under its column's name, the
    completion as chat messages when the prompt is chat turns (TRL's rule), an async one awaited; whatever else it
    returns, or raises, is the row's error."""
    from rewards import VerifyResult
    from rewards.imported import ImportedVerifier

    length = ImportedVerifier("test_task_dataset:trl_length_reward", answer_column="solution")
    assert length.convention == "trl" and length("abc", answer=6) == VerifyResult(0.5, "ok", {})
    named = ImportedVerifier("test_task_dataset:trl_seen_reward")
    assert named("x", answer=1, prompt="asked", source="mine", unused="left out").score == 1.0
    assert named("x", answer=1, prompt="other", source="mine").score == 0.0
    shape = ImportedVerifier("test_task_dataset:trl_shape_reward")
    assert shape("ok", answer=1, prompt=({"role": "user", "content": "q"},)).score == 1.0  # turns as a list, as TRL's
    assert [ImportedVerifier(spec).convention for spec in ("test_task_dataset:length_reward", "rewards:math_verifier",
                                                           "test_task_dataset:verl_reward", "builtins:max")] == [
        "rlvr", "rlvr", "verl", "rlvr"]  # a builtin without a signature is called this project's way
    chat = ImportedVerifier("test_task_dataset:trl_async_reward")
    assert chat("ok", answer=1, prompt=[{"role": "user", "content": "q"}]).score == 1.0

    async def from_a_running_loop():  # a notebook's: asyncio.run cannot start a second loop in its thread
        return chat("ok", answer=1, prompt=[{"role": "user", "content": "q"}])

    assert asyncio.run(from_a_running_loop()) == VerifyResult(1.0, "ok", {})
    text_prompt = chat("ok", answer=1, prompt="q")
    assert text_prompt.status == "error" and text_prompt.details["reason"].startswith("TypeError: string indices")
    assert "completions were text, as TRL passes them for a text prompt" in text_prompt.details["reason"]
    assert ImportedVerifier("test_task_dataset:trl_too_many_rewards")("x", answer=1) == VerifyResult(0.0, "error", {
        "reason": "ValueError: it returned [1.0, 1.0], not a list of one reward for the one completion"})
    missing = ImportedVerifier("test_task_dataset:trl_length_reward")("abc", answer=6)  # its answer column is "solution"
    assert missing.status == "error" and "missing 1 required positional argument: 'solution'" in missing.details["reason"]


TRL_CALLS: list[dict] = []


def recording_reward(completions, **kwargs):  # what it was called with, kept; a TRL reward function's signature
    TRL_CALLS.append({"completions": completions, **kwargs})
    return [0.5] * len(completions)


def test_a_trl_reward_function_gets_what_grpo_trainer_passes_it_for_the_same_row(tmp_path):
    """A real TRL GRPOTrainer step on conversational rows with extra columns, and the same rows as rlvr/Dataset-v0
    (the columns as info_fields): for the same completion, the function gets the same prompts, completions and
    columns, each one row of TRL's batch (TRL's own trainer_state, log hooks and completion ids aside)."""
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    from rlvr_env.testing import build_tiny_model

    rows = [{"prompt": [{"role": "user", "content": "3+4="}], "solution": "7", "source": "mine", "level": 2}]
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2)
    seven = tokenizer.convert_tokens_to_ids("7")
    args = TRLConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=2, num_generations=2,
                     max_completion_length=1, max_steps=1, use_cpu=True, report_to="none", save_strategy="no",
                     generation_kwargs={"suppress_tokens": [i for i in range(len(tokenizer)) if i != seven]})
    TRL_CALLS.clear()
    TRLTrainer(model=model, reward_funcs=[recording_reward], args=args, train_dataset=Dataset.from_list(rows),
               processing_class=tokenizer).train()
    trl_row = {name: values[0] for name, values in TRL_CALLS[0].items() if isinstance(values, list)}
    del trl_row["completion_ids"]  # token ids: a verifier reads text

    TRL_CALLS.clear()
    task = rlvr_env.make_task("Dataset", data_path=write_jsonl(tmp_path / "rows.jsonl", rows), answer_field="solution",
                              verifier="test_task_dataset:recording_reward", info_fields=["source", "level"])
    assert task.verify(trl_row["completions"][0]["content"], task.problem(0, 0)).score == 0.5
    assert {name: values[0] for name, values in TRL_CALLS[0].items()} == trl_row
    assert trl_row["completions"] == [{"role": "assistant", "content": "7"}] and trl_row["solution"] == "7"


def test_trls_own_reward_functions_score_conversational_rows_through_every_view(tmp_path):
    """TRL's accuracy_reward (math-verify) and think_format_reward as they ship, on TRL's conversational rows: its
    None for a gold it cannot parse ("does not apply") is the row's error, with its reason; scored in score_batch's
    worker process too."""
    from rewards import WeightedSum, error_reason, score_batch
    from rewards.imported import ImportedVerifier

    rows = [{"prompt": QUESTION, "solution": "\\frac{1}{3}"}, {"prompt": QUESTION, "solution": "no maths here"}]
    kwargs = {"data_path": write_jsonl(tmp_path / "trl.jsonl", rows), "answer_field": "solution",
              "verifier": "trl.rewards:accuracy_reward"}
    task = rlvr_env.make_task("Dataset", **kwargs)
    problem = task.problem(0, 0)
    assert task.verifier_info(problem) == {"prompt": QUESTION}  # TRL's prompts: the row's turns
    assert task.verify("So \\boxed{\\frac{1}{3}}", problem).score == 1.0
    assert task.verify("So \\boxed{\\frac{1}{2}}", problem).score == 0.0
    unparsed = task.verify("So \\boxed{1}", task.problem(1, 0))
    assert unparsed.status == "error" and "does not apply to this row" in error_reason(unparsed)

    env = gym.make("rlvr/Dataset-v0", **kwargs)
    env.reset(seed=0, options={"problem_index": 0})
    assert env.step("\\boxed{1/3}")[1] == 1.0

    both = WeightedSum([("think", ImportedVerifier("trl.rewards:think_format_reward"), 1.0),
                        ("correct", task.verifier, 1.0)])
    scored = score_batch(["<think>\nso\n</think>\n\\boxed{1/3}", "\\boxed{1/3}"], [problem.answer] * 2,
                         verifier=both, infos=[task.verifier_info(problem)] * 2, workers=1)
    assert [r.score for r in scored] == [2.0, 1.0] and [r.status for r in scored] == ["ok", "ok"]


def format(completion, *, answer, **info):  # reward functions named as the verifier's own components
    return 1.0


def correct(completion, *, answer, **info):
    return 1.0


class Rewards:
    @staticmethod
    def trl_truth(completions, ground_truth, **kwargs):  # verl's nested answer field, read by its last part
        return [float(completions[0] == ground_truth[0])]


def test_more_reward_functions_add_to_the_score_as_trls_reward_funcs_and_weights(tmp_path):
    """TRL's reward_funcs=[accuracy_reward, think_format_reward], reward_weights=[1.0, 0.5]: the first is the verifier
    ("correct", which accuracy reads), the others reward_functions, each its own component; beside the math verifier
    too, with info_fields then reaching them."""
    rows = [{"prompt": QUESTION, "solution": "4", "source": "mine"}]
    path = write_jsonl(tmp_path / "trl.jsonl", rows)
    trl = rlvr_env.make_task("Dataset", data_path=path, answer_field="solution", verifier="trl.rewards:accuracy_reward",
                             reward_functions=["trl.rewards:think_format_reward"], reward_weights=[0.5])
    problem = trl.problem(0, 0)
    result = trl.verify("<think>\n2 + 2\n</think>\n\\boxed{4}", problem)
    assert result.score == 1.5 and result.details["components"] == {"correct": 1.0, "think_format_reward": 1.0}
    assert trl.verify("\\boxed{4}", problem).details["components"] == {"correct": 1.0, "think_format_reward": 0.0}

    beside_math = rlvr_env.make_task("Dataset", data_path=path, answer_field="solution", format_weight=0.25,
                                     reward_functions=["test_task_dataset:source_reward"], info_fields=["source"])
    result = beside_math.verify("\\boxed{4}", beside_math.problem(0, 0))
    assert result.score == 2.25 and result.details["components"] == {"correct": 1.0, "format": 1.0, "source_reward": 1.0}
    assert "prompt" not in beside_math.verifier_info(beside_math.problem(0, 0))  # no TRL function: no prompts

    nested = write_jsonl(tmp_path / "verl.jsonl", [{"prompt": "2 + 2?", "reward_model": {"ground_truth": "4"}}])
    verl = rlvr_env.make_task("Dataset", data_path=nested, answer_field="reward_model.ground_truth",
                              reward_functions=["test_task_dataset:Rewards.trl_truth"])
    assert verl.verify("4", verl.problem(0, 0)).details["components"] == {"correct": 1.0, "trl_truth": 1.0}


def test_a_batch_the_verifier_cannot_score_at_all_is_a_warning_that_says_why(tmp_path):
    """TRL's accuracy_reward reads chat messages; on text prompts TRL (and so this project) passes text, so it raises on
    every row: the rollout says so once, with the reason, instead of training on zeros in silence."""
    from rewards import VerifierErrorWarning

    path = write_jsonl(tmp_path / "text.jsonl", [{"prompt": "What is 2 + 2?", "solution": "4"}])
    task = rlvr_env.make_task("Dataset", data_path=path, answer_field="solution", verifier="trl.rewards:accuracy_reward")
    tokenizer = build_char_tokenizer()
    env = rlvr_env.TokenVectorEnv(task, tokenizer, num_envs=2, max_new_tokens=4, score_workers=0)
    nothing = torch.full((2, 4), tokenizer.eos_token_id)
    env.reset(seed=0)
    with pytest.warns(VerifierErrorWarning, match="could not score any of the 2 completions") as caught:
        assert env.finish_with(nothing).statuses == ["error", "error"]
    assert "completions were text, as TRL passes them for a text prompt" in str(caught[0].message)
    env.reset(seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per env
        assert env.finish_with(nothing).statuses == ["error", "error"]
@pytest.mark.parametrize(("spec", "message"), [
    ("no_colon", "a reward function is named 'package.module:function', got 'no_colon'"),
    (["a:b"], "a reward function is named 'package.module:function', got ['a:b']"),
    ("no_such_module_here:f", "cannot import 'no_such_module_here'"),
    ("test_task_dataset:missing", "'test_task_dataset' has no 'missing'"),
    ("test_task_dataset:QUESTION", "is a list, not a function"),
])
def test_a_reward_function_that_cannot_be_called_is_named_at_config_time(tmp_path, spec, message):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "x", "answer": "1"}])
    with pytest.raises(ValueError, match=f"verifier must be 'math' or 'package.module:function': .*{re.escape(message)}"):
        rlvr_env.make_task("Dataset", data_path=path, verifier=spec)


def test_verl_rows_scored_by_a_verl_compute_score_through_every_view(tmp_path):
    """verl's own row shape and its reward function's signature (the project's verl adapter,
    rewards.adapters:compute_score, importable in score_batch's worker processes), with data_source and extra_info
    from the row."""
    rows = [{"data_source": "mine", "prompt": QUESTION, "reward_model": {"ground_truth": ["4", "four"]},
             "extra_info": {"index": 7, "split": "train"}}]
    path = write_jsonl(tmp_path / "verl.jsonl", rows)
    kwargs = {"data_path": path, "answer_field": "reward_model.ground_truth", "verifier": "rewards.adapters:compute_score",
              "info_fields": ["data_source", "extra_info"], "format_weight": 0.5}
    task = rlvr_env.make_task("Dataset", **kwargs)
    problem = task.problem(0, 0)
    assert problem.answer == ["4", "four"]  # a verifier of one's own gets the field as it is
    assert task.verifier_info(problem) == {"data_source": "mine", "extra_info": {"index": 7, "split": "train"}}
    dotted = rlvr_env.make_task("Dataset", **{**kwargs, "info_fields": ["extra_info.split"]})
    assert dotted.verifier_info(dotted.problem(0, 0)) == {"split": "train"}  # under its last dotted part

    env = gym.make("rlvr/Dataset-v0", **kwargs)
    env.reset(seed=0)
    _, reward, _, _, info = env.step("\\boxed{4}")
    assert reward == 1.5 and info["reward_components"] == {"correct": 1.0, "format": 1.0}

    tokenizer = build_char_tokenizer()
    vector_env = rlvr_env.TokenVectorEnv(task, tokenizer, num_envs=2, max_new_tokens=12, score_workers=1)
    vector_env.reset(seed=0)
    texts = ["\\boxed{four}", "\\boxed{5}"]
    ids = torch.full((2, 12), tokenizer.eos_token_id)
    for row, text in enumerate(texts):
        ids[row, : len(text)] = torch.tensor(tokenizer.encode(text, add_special_tokens=False))
    result = vector_env.finish_with(ids)  # scored in a worker process
    assert result.scores.tolist() == [1.5, 0.5] and result.statuses == ["ok", "ok"]


def test_info_fields_need_a_verifier_of_ones_own(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "x", "answer": "1", "source": "a"}])
    with pytest.raises(ValueError, match="info_fields go to a verifier of your own"):
        rlvr_env.make_task("Dataset", data_path=path, info_fields=["source"])
    with pytest.raises(DataFileError, match=r":1: missing field 'origin'"):
        rlvr_env.make_task("Dataset", data_path=path, info_fields=["origin"], verifier="rewards:math_verifier")


def test_the_warm_start_imitates_the_rows_worked_solutions(tmp_path):
    from algos.run.warm_start import IGNORE_INDEX, demonstration_row

    solution = "Two and two make four: \\boxed{4}."
    rows = [{"prompt": "What is 2 + 2?", "solution": solution}]
    task = rlvr_env.make_task("Dataset", data_path=write_jsonl(tmp_path / "trl.jsonl", rows), answer_field="solution",
                              answer_in_boxed=True, demonstration_field="solution")
    problem = task.problem(0, 0)
    assert task.gold_completion(problem) == solution
    assert task.verifier(solution, answer=problem.answer).score == 1.0  # the gold self-test holds on this row
    tokenizer = build_char_tokenizer()
    ids, labels = demonstration_row(task, problem, tokenizer, use_chat_template=True)
    assert tokenizer.decode([i for i, label in zip(ids, labels) if label != IGNORE_INDEX]) == solution + "</s>"
    with pytest.raises(DataFileError, match=r":1: field 'solution' must be a non-empty string \(a worked solution\)"):
        rlvr_env.make_task("Dataset", data_path=write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "x", "answer": "4",
                                                                                     "solution": 4}]),
                           demonstration_field="solution")
