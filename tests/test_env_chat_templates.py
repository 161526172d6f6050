"""The chat templates of the families users bring: a template's own variables (Qwen3's enable_thinking) reach every
rendering through chat_template_kwargs (the envs' argument, the trainers' env.chat_template_kwargs), and a template
that refuses a system turn (Gemma 2's) gets the system prompt folded into the first user turn, as Gemma 3's own
template does. The templates below follow the shape of those families' templates on the character tokenizer."""

from __future__ import annotations

from pathlib import Path

import gymnasium
import pytest
import torch

import rlvr_env
from algos.algorithms.grpo import GRPOConfig
from algos.config import load_config
from algos.rollout.environment import make_env
from algos.run.warm_start import IGNORE_INDEX, demonstration_row
from rlvr_env import TokenEnv, TokenVectorEnv, make_task
from rlvr_env.prompting import chat_text
from rlvr_env.testing import build_char_tokenizer

# Qwen3's shape: ChatML turns; enable_thinking false closes an empty think block after the generation prompt.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
DATA = Path(__file__).parent / "data"
NO_THINKING = "<|im_start|>assistant\n<think>\n\n</think>\n\n"

# Gemma 2's shape: no system role, user and model turns alternating.
NO_SYSTEM_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def tokenizer_with(template: str):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


def as_read(tokenizer, text: str) -> str:
    """``text`` after encoding and decoding: the character tokenizer reads a blank line as one unknown token."""
    return tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_chat_template_kwargs_reach_the_template_of_every_env():
    tokenizer = tokenizer_with(THINKING_TEMPLATE)
    off = {"enable_thinking": False}
    prompt, _ = gymnasium.make("rlvr/Arithmetic-v0", tokenizer=tokenizer, chat_template_kwargs=off).reset(seed=0)
    assert prompt.endswith(NO_THINKING)
    thinking, _ = gymnasium.make("rlvr/Arithmetic-v0", tokenizer=tokenizer).reset(seed=0)
    assert thinking.endswith("<|im_start|>assistant\n") and thinking + "<think>\n\n</think>\n\n" == prompt

    ids, _ = TokenEnv(make_task("Arithmetic"), tokenizer, max_new_tokens=4, chat_template_kwargs=off).reset(seed=0)
    assert tokenizer.decode(ids).endswith(as_read(tokenizer, NO_THINKING))

    vector_env = TokenVectorEnv(make_task("Arithmetic"), tokenizer, num_envs=2, max_new_tokens=4, chat_template_kwargs=off)
    vector_env.reset(seed=0)
    mask = vector_env.attention_mask[:, : vector_env.prompt_width].bool()
    for row in range(2):
        prompt_ids = vector_env.input_ids[row, : vector_env.prompt_width][mask[row]]
        assert tokenizer.decode(prompt_ids).endswith(as_read(tokenizer, NO_THINKING))

    multiturn = gymnasium.make("rlvr/GuessNumber-v0", tokenizer=tokenizer, chat_template_kwargs=off)
    _, info = multiturn.reset(seed=0)
    assert info["prompt"].endswith(NO_THINKING)


def test_the_trainers_render_with_env_chat_template_kwargs():
    tokenizer = tokenizer_with(THINKING_TEMPLATE)
    config = load_config(GRPOConfig, overrides=["--env.chat_template_kwargs.enable_thinking", "false"])
    assert config.env.chat_template_kwargs == {"enable_thinking": False}
    env = make_env(config, tokenizer, num_envs=1, device=torch.device("cpu"))
    env.reset(seed=0)
    assert tokenizer.decode(env.input_ids[0, : env.prompt_width]).endswith(as_read(tokenizer, NO_THINKING))

    # the warm start's demonstrations are laid out after the same prompt the rollouts read
    task = make_task("Arithmetic")
    problem = task.problem(0, 0)
    ids, labels = demonstration_row(task, problem, tokenizer, True, config.env.chat_template_kwargs)
    prompt = tokenizer.decode(ids[: next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)])
    assert prompt.endswith(as_read(tokenizer, NO_THINKING))


def test_a_template_without_a_system_role_reads_the_system_prompt_in_the_first_user_turn():
    tokenizer = tokenizer_with(NO_SYSTEM_TEMPLATE)
    env = TokenVectorEnv(make_task("Arithmetic"), tokenizer, num_envs=1, max_new_tokens=4, system_prompt="Be brief.")
    with pytest.warns(UserWarning, match="refuses a system turn.*System role not supported"):
        env.reset(seed=0)
    prompt = tokenizer.decode(env.input_ids[0, : env.prompt_width])
    question = env.task.messages(env.problems[0])[-1]["content"]
    expected = f"<start_of_turn>user\nBe brief.\n\n{question.strip()}<end_of_turn>\n<start_of_turn>model\n"
    assert prompt == as_read(tokenizer, expected)


def test_a_template_that_refuses_the_conversation_says_which_roles_and_why():
    tokenizer = tokenizer_with(NO_SYSTEM_TEMPLATE)
    turns = [{"role": "assistant", "content": "4"}, {"role": "user", "content": "2+2?"}]
    with pytest.raises(ValueError, match=r"refuses a conversation of roles \['assistant', 'user'\]: "
                                         r"Conversation roles must alternate"):
        chat_text(tokenizer, turns)
    # a system turn with no user turn after it cannot be folded: the template's own refusal is quoted
    with pytest.raises(ValueError, match=r"roles \['system', 'assistant'\]: System role not supported"):
        chat_text(tokenizer, [{"role": "system", "content": "x"}, {"role": "assistant", "content": "4"}])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tokenize": True}, "'tokenize' is apply_chat_template's own argument"),
    ({"tools": []}, "'tools' is apply_chat_template's own argument"),
    ({"enable thinking": False}, "'enable thinking' is not a template variable name"),
    ([("enable_thinking", False)], "must be a mapping of template variables"),
])
def test_bad_chat_template_kwargs_are_named(kwargs, message):
    tokenizer = tokenizer_with(THINKING_TEMPLATE)
    with pytest.raises(ValueError, match=f"chat_template_kwargs.*{message}"):
        TokenVectorEnv(make_task("Arithmetic"), tokenizer, num_envs=1, max_new_tokens=4, chat_template_kwargs=kwargs)
    if isinstance(kwargs, dict):
        with pytest.raises(ValueError, match=f"config env.chat_template_kwargs.*{message}"):
            load_config(GRPOConfig, overrides={"env.chat_template_kwargs": str(kwargs)})


@pytest.mark.parametrize("env_id", sorted(rlvr_env.registered_tasks()))
def test_every_registered_env_takes_chat_template_kwargs_through_gymnasium_make(env_id, monkeypatch):
    monkeypatch.setenv("RLVR_GSM8K_PATH", str(DATA / "gsm8k_tiny.jsonl"))
    monkeypatch.setenv("RLVR_MATH_PATH", str(DATA / "math_tiny.jsonl"))
    monkeypatch.setenv("RLVR_DATASET_PATH", str(DATA / "dataset_tiny.jsonl"))
    tokenizer = tokenizer_with(THINKING_TEMPLATE)
    env = gymnasium.make(env_id, tokenizer=tokenizer, chat_template_kwargs={"enable_thinking": False})
    observation, info = env.reset(seed=1)
    assert info.get("prompt", observation).endswith(NO_THINKING)
