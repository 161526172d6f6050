"""Bad actions and reset options get errors that name them; envs own their task; async vectorisation."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlvr_env
from rlvr_env.curriculum import Curriculum
from rlvr_env.testing import build_char_tokenizer
from rlvr_env.token_env import step_end_flags

GSM8K_FILE = "tests/data/gsm8k_tiny.jsonl"


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def vector_env(tokenizer, num_envs=4, **kwargs):
    task = rlvr_env.make_task("Arithmetic", digits=1)
    return rlvr_env.TokenVectorEnv(task, tokenizer, num_envs=num_envs, max_new_tokens=4, **kwargs)


def test_token_ids_outside_the_tokenizer_are_named(tokenizer):
    env = vector_env(tokenizer)
    env.reset(seed=0)
    vocab = len(tokenizer)
    with pytest.raises(ValueError, match=rf"rows \[1, 3\] are \[{vocab}, -2\], not token ids in \[0, {vocab}\)"):
        env.step(torch.tensor([5, len(tokenizer), 5, -2]))


@pytest.mark.parametrize(
    "options, message",
    [
        ({"problem_indices": [0, -1, 2, 3]},
         r"'problem_indices': -1 is not a problem index of ArithmeticTask \(an integer >= 0\)"),
        ({"problem_indices": [0, 1.7, 2, 3]}, r"'problem_indices': 1.7 is not a problem index"),
        ({"task": "digits=3"}, r"reset option 'task' must be a mapping of ArithmeticConfig fields"),
        ({"group_size": 3}, r"group_size must be a positive divisor of num_envs=4"),
    ],
)
def test_bad_vector_reset_options_are_named(tokenizer, options, message):
    with pytest.raises(ValueError, match=message):
        vector_env(tokenizer).reset(seed=0, options=options)


def test_numpy_integers_are_accepted_as_group_size_and_indices(tokenizer):
    _, info = vector_env(tokenizer).reset(seed=0, options={"group_size": np.int64(2), "problem_indices": np.array([7, 9])})
    assert info["group_ids"].tolist() == [0, 0, 1, 1] and info["problem_indices"] == [7, 9]


def test_dataset_problem_index_past_the_end_is_named():
    env = rlvr_env.CompletionEnv(rlvr_env.make_task("GSM8K", data_path=GSM8K_FILE))
    size = env.task.size
    with pytest.raises(ValueError, match=rf"'problem_index': {size} is not a problem index of GSM8KTask \(\[0, {size}\)\)"):
        env.reset(options={"problem_index": size})
    assert env.reset(options={"problem_index": size - 1})[1]["problem_index"] == size - 1


def test_envs_reconfigure_their_own_copy_of_the_task(tokenizer):
    task = rlvr_env.make_task("Arithmetic", digits=1)
    vector = rlvr_env.TokenVectorEnv(task, tokenizer, num_envs=2, max_new_tokens=4, system_prompt="Be terse.")
    vector.reset(seed=0, options={"task": {"digits": 3}})
    completion = rlvr_env.CompletionEnv(task)
    completion.reset(seed=0, options={"task": {"terms": 4}})
    assert (task.config.system_prompt, task.config.digits, task.config.terms) == (None, 1, 2)
    assert (vector.task.config.system_prompt, vector.task.config.digits) == ("Be terse.", 3)


def test_curriculum_records_numpy_and_tensor_outcomes():
    curriculum = Curriculum([{"digits": 1}, {"digits": 2}], threshold=0.5, window=3)
    curriculum.record(np.bool_(True))
    curriculum.record(torch.tensor(True))
    assert curriculum.record(np.array([False])) is True and curriculum.level == 1


def test_curriculum_wrapper_takes_a_none_task_option_as_completion_env_does():
    env = rlvr_env.CurriculumWrapper(gym.make("rlvr/Arithmetic-v0", digits=3))
    _, info = env.reset(seed=0, options={"task": None})
    assert info["curriculum_level"] == 0 and env.unwrapped.task.config.digits == env.curriculum.levels[0]["digits"] == 1
    _, info = env.reset(seed=0, options={"task": {"terms": 3}})
    assert (env.unwrapped.task.config.digits, env.unwrapped.task.config.terms) == (1, 3)
    with pytest.raises(ValueError, match=r"reset option 'task' must be a mapping of ArithmeticConfig fields, got 'digits=2'"):
        env.reset(seed=0, options={"task": "digits=2"})


def test_async_vectorisation_needs_shared_memory_off():
    with pytest.raises(ValueError, match=r"vector_kwargs=\{'shared_memory': False\}"):
        gym.make_vec("rlvr/Arithmetic-v0", num_envs=2, vectorization_mode="async")
    expected, _ = gym.make_vec("rlvr/Arithmetic-v0", num_envs=2, vectorization_mode="sync").reset(seed=0)
    envs = gym.make_vec("rlvr/Arithmetic-v0", num_envs=2, vectorization_mode="async", vector_kwargs={"shared_memory": False})
    try:
        observations, _ = envs.reset(seed=0)
    finally:
        envs.close()
    assert observations == expected and observations[0].startswith("What is")


def test_a_delimiter_no_single_token_holds_is_warned_about(tokenizer):
    with pytest.warns(UserWarning, match=r"no single token of the tokenizer contains the process-step delimiter '\\n\\n'"):
        assert not any(step_end_flags(tokenizer, "\n\n"))


def test_env_ids_match_case_insensitively_and_typos_get_suggestions(monkeypatch):
    """Before: `rlvr/arithmetic-v0` failed, and `rlvr/Arithmetc-v0` listed every id but suggested none."""
    from rlvr_env import registry
    from rlvr_env.registry import resolve_id

    # the tasks this test registers stay out of the other tests' registries
    monkeypatch.setattr(registry, "_TASKS", dict(registry._TASKS))
    monkeypatch.setattr(gym.envs.registration, "registry", dict(gym.envs.registration.registry))

    assert resolve_id("rlvr/arithmetic-v0") == "rlvr/Arithmetic-v0"
    assert resolve_id("gsm8k") == "rlvr/GSM8K-v0"
    assert rlvr_env.make_task("RLVR/countdown-V0").config == rlvr_env.make_task("Countdown").config
    with pytest.raises(ValueError, match=r"'rlvr/Arithmetc-v0'; did you mean rlvr/Arithmetic-v0[ ?]"):
        resolve_id("rlvr/Arithmetc-v0")
    with pytest.raises(ValueError, match=r"'Arithmetic-v7'; did you mean rlvr/Arithmetic-v0[ ?]"):
        resolve_id("Arithmetic-v7")
    with pytest.raises(ValueError, match=r"'Zzzz'; registered: rlvr/Arithmetic-v0"):
        resolve_id("Zzzz")  # nothing close: no suggestion, just the list
    # names that differ only in case stay apart: the case-insensitive match must be unique
    from rlvr_env.tasks.arithmetic import ArithmeticTask

    rlvr_env.register_task("CaseTwin", ArithmeticTask)
    rlvr_env.register_task("casetwin", ArithmeticTask)
    assert resolve_id("casetwin") == "rlvr/casetwin-v0"
    with pytest.raises(ValueError, match="did you mean rlvr/CaseTwin-v0 or rlvr/casetwin-v0"):
        resolve_id("CASETWIN")
