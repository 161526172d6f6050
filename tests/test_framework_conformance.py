"""Each adapter loaded and called the way its framework's own code does, read from that framework's source.

Where a framework installs on CPU without changing torch or transformers (verifiers 0.3.1, skyrl-gym
0.4.0) the test runs it for real, and skips when it is absent; verl (its wheel pins another transformers),
OpenRLHF and slime (GPU stacks: vLLM, DeepSpeed, Megatron, SGLang) are not installable here, so their
loaders and callers are reproduced from the files cited in each section. TRL's GRPOTrainer runs for real in
tests/test_rewards_shaping.py. The strings each section loads are the ones README.md and docs/rewards.md give.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import importlib.util
import logging
import os
import pickle
import sys
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rewards.adapters import MissingGoldWarning, make_trl_reward, verifiers_reward

REPO_ROOT = Path(__file__).resolve().parents[1]

# What README.md's "In other frameworks, without glue" block and docs/rewards.md tell each framework to load.
VERL_PATHS = ("pkg://rewards.adapters", "rewards/reward_file.py")
VERL_FUNCTION = "compute_score"
OPENRLHF_REMOTE_RM_URL = "rewards/reward_file.py"
SLIME_CUSTOM_RM_PATH = "rewards.adapters.slime_reward"
SKYRL_REGISTRATION = 'register(id="rlvr_arithmetic", entry_point="rlvr_env.skyrl_env:RlvrTaskEnv", kwargs={"task": "Arithmetic"})'

SMOLLM2_PROMPT = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("doc", ["README.md", "docs/rewards.md"])
def test_the_docs_give_what_these_tests_load(doc):
    text = (REPO_ROOT / doc).read_text()
    for line in (
        *(f"custom_reward_function.path={path}" for path in VERL_PATHS), f"custom_reward_function.name={VERL_FUNCTION}",
        f"--remote_rm_url {OPENRLHF_REMOTE_RM_URL}", f"--custom-rm-path {SLIME_CUSTOM_RM_PATH}",
        SKYRL_REGISTRATION,
        "vf.Rubric(funcs=[verifiers_reward])", 'make_trl_reward(answer_column="solution")',
    ):
        assert line in text, f"{doc} lacks {line!r}"


# ---------------------------------------------------------------------------------------------------------------
# verl (volcengine/verl @ b178a3cd56f58b2d502255daba591e92833930a7)
#   verl/utils/import_utils.py       load_module / load_extern_object: "pkg://a.b" -> importlib.import_module("a.b")
#                                    (since v0.7.0); a file path -> spec_from_file_location(f"custom_module_{hash}",
#                                    path), executed, not added to sys.modules (before v0.7.0: "custom_module")
#   verl/trainer/ppo/reward.py       get_custom_reward_fn: reward_kwargs merged over each call's kwargs
#   verl/workers/reward_manager/naive.py  per sample, by keyword; extra_info gains num_turns and
#                                    rollout_reward_scores; a dict result gives "score" and logs every key
#   verl/workers/reward_manager/batch.py  one call: data_sources and extra_infos are the batch's NumPy object
#                                    arrays, solution_strs and ground_truths lists, plus the manager's reward_kwargs
# ---------------------------------------------------------------------------------------------------------------

def verl_load_module(module_path: str):
    if module_path.startswith("pkg://"):
        return importlib.import_module(module_path[len("pkg://"):].replace("/", "."))
    spec = importlib.util.spec_from_file_location(f"custom_module_{hash(os.path.abspath(module_path))}", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _verl_call_with_kwargs(raw_fn, extra_kwargs, *args, **kwargs):
    return raw_fn(*args, **{**kwargs, **extra_kwargs})


def verl_custom_reward_fn(module_path: str, name: str, reward_kwargs: dict):
    return functools.partial(_verl_call_with_kwargs, getattr(verl_load_module(module_path), name), reward_kwargs)


def _verl_reward(score: Any, extra: dict) -> float:
    if isinstance(score, dict):
        for key, value in score.items():
            extra[key].append(value)
        return score["score"]
    return score


def verl_naive_manager(compute_score, rows) -> tuple[list, dict]:
    rewards, extra = [], defaultdict(list)
    for data_source, response, ground_truth, extra_info in rows:
        extra_info = {**extra_info, "num_turns": None, "rollout_reward_scores": {}}
        score = compute_score(data_source=data_source, solution_str=response, ground_truth=ground_truth,
                              extra_info=extra_info)
        rewards.append(_verl_reward(score, extra))
    return rewards, dict(extra)


def verl_batch_manager(compute_score, rows, **manager_reward_kwargs) -> tuple[list, dict]:
    extra_infos = np.array([{**row[3], "rollout_reward_scores": {}} for row in rows], dtype=object)
    scores = compute_score(data_sources=np.array([row[0] for row in rows], dtype=object),
                           solution_strs=[row[1] for row in rows], ground_truths=[row[2] for row in rows],
                           extra_infos=extra_infos, **manager_reward_kwargs)
    extra = defaultdict(list)
    return [_verl_reward(scores[i], extra) for i in range(len(rows))], dict(extra)


VERL_MANAGERS = {"naive": verl_naive_manager, "batch": verl_batch_manager}

VERL_ROWS = [  # (data_source, decoded response, reward_model.ground_truth, extra_info)
    ("openai/gsm8k", "2 + 2 = 4, so \\boxed{4}", "4", {"index": 0, "split": "train"}),
    ("lighteval/MATH", "the answer is \\boxed{\\frac{1}{2}}", np.array(["0.5", "1/3"], dtype=object), {"index": 1}),
    ("openai/gsm8k", "#### 71", "72", {"index": 2, "answer": "71"}),
]


@pytest.mark.parametrize("module_path", VERL_PATHS)
@pytest.mark.parametrize("manager", VERL_MANAGERS)
def test_verl_loads_and_scores_through_each_reward_manager(module_path, manager, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # verl resolves a relative path against its working directory
    compute_score = verl_custom_reward_fn(module_path, VERL_FUNCTION, {"format_score": 0.1})
    rewards, extra = VERL_MANAGERS[manager](compute_score, VERL_ROWS)
    assert rewards == [1.0, 1.0, 0.0] and extra == {}


def test_verl_loads_the_adapters_file_itself_as_a_top_level_module(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    module = verl_load_module("rewards/adapters.py")  # used to fail: relative import with no known parent package
    assert module.__name__.startswith("custom_module_") and module.__name__ not in sys.modules
    assert verl_naive_manager(module.compute_score, VERL_ROWS) == ([1.0, 1.0, 0.0], {})


@pytest.mark.parametrize("module_path", VERL_PATHS)
def test_verl_prime_manager_sends_the_function_to_its_process_pool(module_path, monkeypatch):
    """verl/workers/reward_manager/prime.py runs partial(evaluation_func, task, completion, reference,
    task_extra_info) in a ProcessPoolExecutor: the loaded function is pickled, then called by position."""
    monkeypatch.chdir(REPO_ROOT)
    evaluation_func = pickle.loads(pickle.dumps(verl_custom_reward_fn(module_path, VERL_FUNCTION, {})))
    task = functools.partial(evaluation_func, "openai/gsm8k", "so \\boxed{4}", "4", {"index": 0})
    assert pickle.loads(pickle.dumps(task))() == 1.0


@pytest.mark.parametrize("manager, message", [
    ("naive", r"compute_score: ground_truth = '' \(data_source 'openai/gsm8k'\) has no usable answer"),
    ("batch", r"compute_score: ground_truths\[1\] = None \(data_source 'openai/gsm8k'\) has no usable answer"),
])
def test_verl_stops_on_a_sample_without_ground_truth(manager, message):
    rows = [VERL_ROWS[0], ("openai/gsm8k", "\\boxed{4}", "" if manager == "naive" else None, {"index": 1})]
    compute_score = verl_custom_reward_fn(VERL_PATHS[0], VERL_FUNCTION, {})
    with pytest.raises(ValueError, match=message):
        VERL_MANAGERS[manager](compute_score, rows)


def test_verl_batch_call_refuses_a_mix_and_mismatched_lengths():
    compute_score = verl_custom_reward_fn(VERL_PATHS[0], VERL_FUNCTION, {})
    with pytest.raises(TypeError, match="not a mix"):
        compute_score(solution_str="\\boxed{4}", ground_truths=["4"])
    with pytest.raises(ValueError, match="2 solution_strs, 1 ground_truths"):
        compute_score(solution_strs=["a", "b"], ground_truths=["4"])


# ---------------------------------------------------------------------------------------------------------------
# OpenRLHF (OpenRLHF/OpenRLHF @ 3c3be6234e0cb353e76bb8019947db9dfe99fca7)
#   openrlhf/utils/agent.py          SingleTurnAgentExecutor: a --remote_rm_url ending in .py is loaded with
#                                    spec_from_file_location("reward_func", path); execute() decodes prompt +
#                                    response with skip_special_tokens=False and _fetch_rewards_via_func calls
#                                    reward_func([query], [prompt], [label]) in asyncio.to_thread, one sample a
#                                    call; "scores" falls back to "rewards"; extra_logs or {}
#   openrlhf/trainer/ppo_utils/samples_generator.py  _process_response_into_experience: torch.tensor([reward]),
#                                    each extra_logs value as its first element's .item()
#   openrlhf/datasets/prompts_dataset.py  preprocess_data: label = "" when --label_key is not set
# ---------------------------------------------------------------------------------------------------------------

def openrlhf_load_reward_func(path: str):
    spec = importlib.util.spec_from_file_location("reward_func", path)
    reward_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward_module)
    return reward_module.reward_func


def openrlhf_experience_infos(reward_func, queries, prompts, labels) -> list[dict[str, float]]:
    async def fetch_all():
        return await asyncio.gather(*(asyncio.to_thread(reward_func, [q], [p], [label])
                                      for q, p, label in zip(queries, prompts, labels)))

    infos = []
    for rewards_info in asyncio.run(fetch_all()):
        score = rewards_info.get("scores")
        info = {"reward": torch.tensor([rewards_info.get("rewards")]),
                "score": torch.tensor([score if score is not None else rewards_info.get("rewards")])}
        for key, value in (rewards_info.get("extra_logs") or {}).items():
            info[key] = torch.tensor([value.flatten()[0].item() if isinstance(value, torch.Tensor) else value])
        infos.append({key: value.item() for key, value in info.items()})
    return infos


def test_openrlhf_loads_the_file_and_scores_one_sample_a_call(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    reward_func = openrlhf_load_reward_func(OPENRLHF_REMOTE_RM_URL)
    responses = ["\\boxed{4}", "The answer is 5.", ""]
    queries = [SMOLLM2_PROMPT + response + "<|im_end|>" for response in responses]
    infos = openrlhf_experience_infos(reward_func, queries, [SMOLLM2_PROMPT] * 3, ["4"] * 3)
    assert [(i["reward"], i["score"], i["no_answer"], i["missing_label"]) for i in infos] == [
        (1.0, 1.0, 0.0, 0.0), (0.0, 0.0, 0.0, 0.0), (0.0, 0.0, 1.0, 0.0)]


def test_openrlhf_without_label_key_logs_every_sample_and_warns(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    reward_func = openrlhf_load_reward_func(OPENRLHF_REMOTE_RM_URL)
    query = SMOLLM2_PROMPT + "\\boxed{4}<|im_end|>"
    with pytest.warns(MissingGoldWarning, match=r"is --label_key set\?"):
        infos = openrlhf_experience_infos(reward_func, [query] * 3, [SMOLLM2_PROMPT] * 3, ["", None, "4"])
    assert [(i["reward"], i["missing_label"]) for i in infos] == [(0.0, 1.0), (0.0, 1.0), (1.0, 0.0)]


# ---------------------------------------------------------------------------------------------------------------
# TRL: GRPOTrainer(reward_funcs=[make_trl_reward(answer_column="solution")]) trains a real step in
# tests/test_rewards_shaping.py. trl 1.16 grpo_trainer.py _calculate_rewards turns a None into NaN and leaves it
# out of the row's reward sum.
# ---------------------------------------------------------------------------------------------------------------

def test_trl_rows_without_gold_get_none_and_one_warning():
    reward = make_trl_reward(answer_column="solution")
    batch = {"prompts": ["q"] * 4, "completions": ["\\boxed{4}"] * 4, "completion_ids": [[1]] * 4,
             "solution": ["4", "", None, float("nan")]}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's own filter: a repeated warning is shown once
        for _ in range(2):  # TRL calls it from one place, once a batch
            assert reward(**batch) == [1.0, None, None, None]
    assert [w.category for w in caught] == [MissingGoldWarning]
    assert "'solution' is None or blank get None" in str(caught[0].message)


# ---------------------------------------------------------------------------------------------------------------
# verifiers (PrimeIntellect-ai/verifiers @ a60a606ecc4d309247edf9ff92c3eabca362781f; installed: 0.3.1)
#   verifiers/legacy/rubrics/rubric.py  Rubric._call_individual_reward_func passes a reward function the score
#                                    objects its signature names (prompt, completion, answer = state.get("answer",
#                                    ""), state, info, task, parser), awaits it when it is async, float()s it, and
#                                    logs an exception as an error, scoring 0.0; score_rollout / score_group
# ---------------------------------------------------------------------------------------------------------------

def _rollout(answer: Any, completion: Any):
    import verifiers as vf

    return vf.State(input={"prompt": [{"role": "user", "content": "What is 2+2?"}], "answer": answer, "info": {},
                           "example_id": 0}, completion=completion, trajectory=[])


def test_verifiers_rubric_scores_rollouts():
    vf = pytest.importorskip("verifiers", minversion="0.3")
    rubric = vf.Rubric(funcs=[verifiers_reward])
    right = _rollout("4", [{"role": "assistant", "content": "2 + 2 = \\boxed{4}"}])
    asyncio.run(rubric.score_rollout(right))
    assert (right["reward"], right["metrics"]) == (1.0, {"verifiers_reward": 1.0})
    group = [_rollout("4", "so \\boxed{4}"), _rollout("4", "so \\boxed{5}")]
    asyncio.run(rubric.score_group(group))
    assert [state["reward"] for state in group] == [1.0, 0.0]


def test_verifiers_rubric_logs_a_rollout_without_answer(caplog):
    vf = pytest.importorskip("verifiers", minversion="0.3")
    rubric = vf.Rubric(funcs=[verifiers_reward])
    rubric.logger.addHandler(caplog.handler)  # verifiers may stop its loggers propagating to the root logger
    try:
        state = _rollout("", "so \\boxed{4}")
        asyncio.run(rubric.score_rollout(state))
    finally:
        rubric.logger.removeHandler(caplog.handler)
    assert state["reward"] == 0.0
    errors = {r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and r.name == rubric.logger.name}
    assert errors == {"Error calling reward function verifiers_reward: verifiers_reward: the rollout's answer is '': "
                      "the dataset needs an 'answer' column"}


# ---------------------------------------------------------------------------------------------------------------
# slime (THUDM/slime @ 624b824a898ab0ec1fcb4d373004c7f3852bf515)
#   slime/utils/misc.py              load_function: path.rpartition(".") -> getattr(importlib.import_module(...))
#   slime/rollout/rm_hub/__init__.py async_rm: await rm_function(args, sample); batched_async_rm (--group-rm):
#                                    await rm_function(args, samples) -> one reward per sample
#   slime/rollout/sglang_rollout.py  generate_and_rm: sample.reward = await async_rm(args, sample), the group's
#                                    samples concurrently on one event loop
#   slime/utils/types.py             Sample: response str, label str | None (None without --label-key), index
# ---------------------------------------------------------------------------------------------------------------

def slime_load_function(path: str):
    module_path, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module_path), attr)


@dataclass
class SlimeSample:  # the fields of slime.utils.types.Sample a reward function reads
    index: int | None = None
    prompt: str | list = ""
    response: str = ""
    label: str | None = None
    reward: float | dict | None = None
    metadata: dict = field(default_factory=dict)


def _slime_group(labels) -> list[SlimeSample]:
    responses = ["so \\boxed{4}", "it is 5", "\\boxed{2^2}"]
    return [SlimeSample(index=i, prompt="What is 2+2?", response=r, label=label)
            for i, (r, label) in enumerate(zip(responses, labels))]


def test_slime_scores_each_sample_and_each_group():
    rm = slime_load_function(SLIME_CUSTOM_RM_PATH)
    args = argparse.Namespace(custom_rm_path=SLIME_CUSTOM_RM_PATH, group_rm=False)

    async def per_sample(group):
        for sample, reward in zip(group, await asyncio.gather(*(rm(args, sample) for sample in group))):
            sample.reward = reward

    group = _slime_group(["4"] * 3)
    asyncio.run(per_sample(group))
    assert [sample.reward for sample in group] == [1.0, 0.0, 1.0]
    args.group_rm = True
    assert asyncio.run(rm(args, _slime_group(["4"] * 3))) == [1.0, 0.0, 1.0]


def test_slime_stops_on_a_sample_without_label():
    rm = slime_load_function(SLIME_CUSTOM_RM_PATH)
    args = argparse.Namespace(custom_rm_path=SLIME_CUSTOM_RM_PATH, group_rm=True)
    with pytest.raises(ValueError, match=r"sample 1 \(position 1 of 3\) has label None.*--label-key"):
        asyncio.run(rm(args, _slime_group(["4", None, "4"])))
    with pytest.raises(ValueError, match="sample 0 .* has label ' '"):
        asyncio.run(rm(args, _slime_group([" "])[0]))


# ---------------------------------------------------------------------------------------------------------------
# SkyRL-gym (NovaSky-AI/SkyRL @ a9564572eb8e91076be43c1bd5e4615e3de17265; installed: skyrl-gym 0.4.0)
#   skyrl-gym/skyrl_gym/envs/registration.py  register(id, entry_point, kwargs); make(id, **kwargs) builds
#                                    entry_point(**{**spec.kwargs, **kwargs})
#   skyrl/train/dataset/dataset.py   PromptDataset reads parquet with datasets.load_dataset; a row's prompt and
#                                    env_class are popped, the rest is env_extras
#   skyrl/train/generators/skyrl_gym_generator.py  env_extras["max_turns"] set; skyrl_gym.make(env_class,
#                                    env_config=..., extras=env_extras); env.init(prompt); env.step(response
#                                    text) -> observations, reward, done, metadata; env.get_metrics(); env.close()
#   skyrl-gym/skyrl_gym/envs/gsm8k/env.py  the gold answer is extras["reward_spec"]["ground_truth"]
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture
def skyrl_gym_with_rlvr_env():
    skyrl_gym = pytest.importorskip("skyrl_gym")
    from skyrl_gym.envs import deregister, register

    eval(SKYRL_REGISTRATION, {"register": register})  # the line the docs give, as written
    yield skyrl_gym
    deregister("rlvr_arithmetic")


def test_skyrl_gym_env_scores_rows_read_as_skyrl_reads_them(skyrl_gym_with_rlvr_env, tmp_path):
    import datasets

    from rlvr_env.skyrl_env import skyrl_dataset_rows

    path = tmp_path / "train.parquet"
    datasets.Dataset.from_list(skyrl_dataset_rows("Arithmetic", 2, env_class="rlvr_arithmetic")).to_parquet(path)
    dataframe = datasets.load_dataset("parquet", data_files=str(path), keep_in_memory=True)["train"]
    outputs = []
    for item, response in enumerate(["\\boxed{{{}}}", "\\boxed{{{}1}}"]):
        row = dataframe[item]
        prompt, env_class, extras = row.pop("prompt"), row.pop("env_class"), row
        extras["max_turns"] = 1
        env = skyrl_gym_with_rlvr_env.make(env_class, env_config={}, extras=extras)
        init_prompt, _ = env.init(prompt)
        step = env.step(response.format(extras["reward_spec"]["ground_truth"]))
        outputs.append((init_prompt == prompt, step["observations"], step["reward"], step["done"], env.get_metrics()))
        env.close()
    assert outputs == [(True, [], 1.0, True, {"correct": 1.0, "format": 1.0, "solved": 1.0}),  # the task's
                       (True, [], 0.1, True, {"correct": 0.0, "format": 1.0, "solved": 0.0})]  # format credit


@pytest.mark.parametrize("extras", [{}, {"reward_spec": {"method": "rule"}}, {"reward_spec": {"ground_truth": " "}}])
def test_skyrl_gym_env_refuses_a_row_without_ground_truth(skyrl_gym_with_rlvr_env, extras):
    with pytest.raises(ValueError, match=r"RlvrTaskEnv\('Arithmetic'\): the row's reward_spec.ground_truth is"):
        skyrl_gym_with_rlvr_env.make("rlvr_arithmetic", env_config={}, extras={**extras, "max_turns": 1})
