"""CompletionEnv, TokenEnv, registry, curriculum: Gymnasium's API exactly."""

import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rlvr_env
from rlvr_env.testing import build_char_tokenizer

DATA = Path(__file__).parent / "data"
RG_SAMPLE = ["rlvr/rg.leg_counting-v0", "rlvr/rg.circuit_logic-v0", "rlvr/rg.emoji_mystery-v0"]


@pytest.fixture(autouse=True)
def data_files(monkeypatch):
    monkeypatch.setenv("RLVR_GSM8K_PATH", str(DATA / "gsm8k_tiny.jsonl"))
    monkeypatch.setenv("RLVR_MATH_PATH", str(DATA / "math_tiny.jsonl"))
    monkeypatch.setenv("RLVR_DATASET_PATH", str(DATA / "dataset_tiny.jsonl"))


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def checked(env):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a checker warning is a failure
        check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.parametrize("env_id", sorted(rlvr_env.registered_tasks()))
def test_check_env_passes_for_every_registered_id(env_id, tokenizer):
    assert ":" not in env_id and env_id.startswith("rlvr/")
    checked(gym.make(env_id))
    checked(gym.make(env_id, tokenizer=tokenizer))
    checked(rlvr_env.TokenEnv(rlvr_env.make_task(env_id), tokenizer, max_new_tokens=4))


@pytest.mark.parametrize("env_id", RG_SAMPLE)
def test_check_env_passes_for_reasoning_gym_ids(env_id):
    pytest.importorskip("reasoning_gym")
    rlvr_env.register_reasoning_gym()
    checked(gym.make(env_id))


def test_completion_env_scores_one_step(tokenizer):
    env = gym.make("rlvr/Arithmetic-v0", digits=1, tokenizer=tokenizer, max_completion_chars=40)
    prompt, info = env.reset(seed=4)
    assert prompt.startswith("U:What is") and prompt.endswith("A:")  # through the chat template
    answer = env.unwrapped.problem.answer
    obs, reward, terminated, truncated, info = env.step(f"\\boxed{{{answer}}}")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["answer"] == answer and info["verifier_status"] == "ok" and info["success"]
    assert info["reward_components"] == {"correct": 1.0, "format": 1.0}
    env.reset(seed=4)
    # over-long: scored on the first max_completion_chars characters, truncated=True
    with pytest.warns(UserWarning, match="scored on its first max_completion_chars = 40"):
        obs, reward, terminated, truncated, info = env.step(f"\\boxed{{{answer}}}" + " padding" * 10)
    assert (reward, terminated, truncated) == (1.0, True, True)
    assert (info["verifier_status"], info["prefix_status"]) == ("truncated", "ok")
    with pytest.raises(RuntimeError, match="reset"):
        env.unwrapped.step("again")


def test_a_long_reasoning_trace_is_scored_whole_by_default():
    """An 18k-character trace ending in the right answer: R1-style traces run to tens of thousands of tokens."""
    env = gym.make("rlvr/Arithmetic-v0", digits=1)
    env.reset(seed=0)
    answer = env.unwrapped.problem.answer
    trace = "Let me think step by step. " * 700 + f"So the answer is \\boxed{{{answer}}}."
    assert len(trace) > 18_000
    _, reward, _, truncated, info = env.step(trace)
    assert (reward, truncated, info["verifier_status"]) == (1.0, False, "ok")


def test_completion_env_plain_text_without_template():
    env = gym.make("rlvr/Arithmetic-v0", system_prompt="Be brief.", few_shot=[["What is 1 + 1?", "\\boxed{2}"]])
    prompt, info = env.reset(seed=0, options={"problem_index": 3})
    assert prompt.startswith("Be brief.\n\nWhat is 1 + 1?\n\n\\boxed{2}\n\nWhat is")
    assert info["problem_index"] == 3 and [m["role"] for m in info["messages"]] == ["system", "user", "assistant", "user"]


def test_seeding_gives_same_observations_and_infos():
    def episode(seed):
        env = gym.make("rlvr/Countdown-v0")
        prompt, _ = env.reset(seed=seed)
        return prompt, env.step("\\boxed{1 + 2}")[1:]

    assert episode(11) == episode(11)
    assert episode(11)[0] != episode(12)[0]


def test_reset_options_set_difficulty_and_reject_unknown_keys():
    env = gym.make("rlvr/Arithmetic-v0")
    env.reset(seed=0, options={"task": {"digits": 4, "terms": 3}})
    assert len(env.unwrapped.problem.metadata["expression"].split(" + ")[0]) == 4
    with pytest.raises(ValueError, match="unknown reset option 'level'"):
        env.reset(options={"level": 2})
    with pytest.raises(ValueError, match="digits"):
        env.reset(options={"task": {"digits": 0}})


def test_make_vec_steps_completion_envs():
    envs = gym.make_vec("rlvr/Arithmetic-v0", num_envs=3, digits=1)
    prompts, _ = envs.reset(seed=1)
    assert len(prompts) == 3 and len(set(prompts)) > 1
    _, rewards, terminated, truncated, infos = envs.step(("\\boxed{1}",) * 3)
    assert terminated.all() and not truncated.any() and rewards.shape == (3,)
    envs.close()


def test_registry_errors_and_custom_task():
    from rlvr_env.tasks.arithmetic import ArithmeticTask

    with pytest.raises(ValueError, match="task name"):
        rlvr_env.register_task("my:task", ArithmeticTask)
    with pytest.raises(ValueError, match="no field 'digitz'"):
        rlvr_env.register_task("Typo", ArithmeticTask, digitz=3)
    with pytest.raises(ValueError, match="no task registered as 'Nope'"):
        rlvr_env.make_task("Nope")
    env_id = rlvr_env.register_task("ThreeDigitSums", ArithmeticTask, version=2, digits=3)
    assert env_id == "rlvr/ThreeDigitSums-v2"
    assert rlvr_env.make_task("ThreeDigitSums").config.digits == 3
    env = gym.make(env_id, terms=3)
    env.reset(seed=0)
    assert len(env.unwrapped.problem.metadata["expression"].split(" + ")) == 3


def test_token_env_eos_and_truncation(tokenizer):
    task = rlvr_env.make_task("Arithmetic", digits=1)
    env = rlvr_env.TokenEnv(task, tokenizer, max_new_tokens=5)
    obs, _ = env.reset(seed=2)
    prompt_len = len(obs)
    answer = task.problem(env.reset(seed=2)[1]["problem_index"], 0).answer
    for char in f"{answer}":
        obs, reward, terminated, truncated, info = env.step(tokenizer.convert_tokens_to_ids(char))
        assert (reward, terminated, truncated) == (0.0, False, False)
    obs, reward, terminated, truncated, info = env.step(tokenizer.eos_token_id)
    assert terminated and not truncated and reward == pytest.approx(0.9)  # right, without \boxed
    assert info["completion"] == answer and len(obs) == prompt_len + len(answer) + 1
    env.reset(seed=2)
    a = tokenizer.convert_tokens_to_ids("a")
    results = [env.step(a) for _ in range(5)]
    assert [r[3] for r in results] == [False] * 4 + [True] and not results[-1][2]
    assert results[-1][4]["completion"] == "aaaaa" and results[-1][1] == 0.0
    # EOS on the very last allowed token is terminated, not truncated
    env.reset(seed=2)
    for _ in range(4):
        env.step(a)
    assert env.step(tokenizer.eos_token_id)[2:4] == (True, False)
    with pytest.raises(ValueError, match="not a token id"):
        env.reset(seed=2) and env.step(10_000)


def test_curriculum_wrapper_raises_difficulty():
    env = rlvr_env.CurriculumWrapper(gym.make("rlvr/Arithmetic-v0"), threshold=0.75, window=4)
    levels = env.curriculum.levels
    for _ in range(4):
        env.reset(seed=0)
        assert env.unwrapped.task.config.digits == levels[0]["digits"]
        _, _, _, _, info = env.step(f"\\boxed{{{env.unwrapped.problem.answer}}}")
        assert info["curriculum_level"] == 0
    _, info = env.reset()
    assert info["curriculum_level"] == 1 and env.unwrapped.task.config.digits == levels[1]["digits"]
    env.step("wrong")
    assert env.curriculum.success_rate == 0.0
    with pytest.raises(ValueError, match="no curriculum levels"):
        rlvr_env.CurriculumWrapper(gym.make("rlvr/GSM8K-v0"))


def test_rlvr_envs_lists_ids_with_kwargs():
    proc = subprocess.run([sys.executable, "-m", "rlvr_cli", "envs", "--kwargs"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "rlvr/Arithmetic-v0" in proc.stdout and "    digits = 2" in proc.stdout and "rlvr/MATH-v0" in proc.stdout
