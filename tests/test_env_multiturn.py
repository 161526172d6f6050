"""MultiTurnEnv, tools and the multi-turn tasks: Gymnasium's API, tool calls, replies, budgets."""


import gymnasium as gym
import pytest

import rlvr_env
from rlvr_env import MultiTurnEnv, MultiTurnTask, Problem, Toolbox
from rlvr_env.multiturn_env import MultiTurnConfig
from rlvr_env.testing import build_char_tokenizer
from rlvr_env.tools import ToolCall, calculator, format_tool_call, parse_tool_calls


def tool_call(name, **arguments):
    return format_tool_call(name, arguments)


def test_calculator_episode_tool_call_then_final_answer():
    env = gym.make("rlvr/CalculatorArithmetic-v0")
    obs, info = env.reset(seed=0)
    assert [m["role"] for m in obs] == ["system", "user"] and "<tool_call>" in obs[0]["content"]  # plain-text fallback
    assert info["tools"][0]["function"]["name"] == "calculator" and info["prompt"].endswith("assistant: ")
    problem = env.unwrapped.problem
    expression = problem.metadata["expression"]
    obs, reward, terminated, truncated, info = env.step("Let me compute. " + tool_call("calculator", expression=expression))
    assert obs[-1] == {"role": "tool", "content": problem.answer} and (reward, terminated, truncated) == (0.0, False, False)
    assert info["tool_calls"] == [{"turn": 1, "name": "calculator", "arguments": {"expression": expression}, "status": "ok"}]
    obs, reward, terminated, truncated, info = env.step(f"So it is \\boxed{{{problem.answer}}}.")
    assert (reward, terminated, truncated, info["success"], info["turn"]) == (1.0, True, False, True, 2)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("again")


def test_bad_tool_calls_become_error_observations_and_are_counted():
    env = gym.make("rlvr/CalculatorArithmetic-v0", max_turns=3)
    env.reset(seed=1)
    bad = "<tool_call>{not json</tool_call>" + tool_call("nope") + tool_call("calculator", expression="__import__('os')")
    obs, reward, terminated, truncated, info = env.step(bad)
    assert [m["role"] for m in obs[-3:]] == ["tool"] * 3 and all(m["content"].startswith("error:") for m in obs[-3:])
    assert info["tool_errors"] == 3 and not (terminated or truncated)
    env.step(tool_call("calculator", expression="9 ** 9 ** 9 ** 9"))  # refused by size, not computed
    obs, reward, terminated, truncated, info = env.step(tool_call("calculator", expression="1 + 1"))
    assert (reward, terminated, truncated) == (0.0, False, True)  # the turn budget: no final answer
    assert info["verifier_status"] == "no_answer" and info["tool_errors"] == 4 and info["turn"] == 3


def test_guess_number_answers_higher_or_lower_with_per_turn_rewards():
    env = gym.make("rlvr/GuessNumber-v0", low=1, high=100, wrong_guess_reward=-0.1)
    env.reset(seed=3)
    secret = int(env.unwrapped.problem.answer)
    low, high, total, turns = 1, 100, 0.0, 0
    while True:
        guess = (low + high) // 2
        obs, reward, terminated, truncated, info = env.step(f"\\boxed{{{guess}}}")
        total, turns = total + reward, turns + 1
        if terminated or truncated:
            break
        assert obs[-1]["content"] == ("Higher." if guess < secret else "Lower.")
        low, high = (guess + 1, high) if guess < secret else (low, guess - 1)
    assert terminated and info["success"] and turns <= 7
    assert total == pytest.approx(1.0 - 0.1 * (turns - 1))
    env.reset(seed=3)
    assert env.step("no guess")[0][-1]["content"] == "Write your guess as \\boxed{n}."


def test_code_episode_runs_the_python_tool_in_the_sandbox():
    env = gym.make("rlvr/Code-v0")
    env.reset(options={"problem_index": 0})
    obs, *_ = env.step(tool_call("python", code="print(sum(int(d) for d in str(1234)))"))
    assert obs[-1]["content"] == "10\n"
    obs, *_ = env.step(tool_call("python", code="import os\nos.kill(os.getppid(), 9)"))
    assert "[error: refused: os.kill]" in obs[-1]["content"]
    _, reward, terminated, _, info = env.step("```python\ndef digit_sum(n):\n    return sum(map(int, str(n)))\n```")
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    env.reset(options={"problem_index": 0})
    _, reward, _, _, info = env.step("```python\ndef digit_sum(n):\n    return 10\n```")
    assert (reward, info["verifier_status"], info["success"]) == (0.0, "ok", False)  # 1 of 3 tests: all or nothing


TOOL_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_a_chat_template_with_tools_renders_them_itself():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TOOL_TEMPLATE
    env = gym.make("rlvr/CalculatorArithmetic-v0", tokenizer=tokenizer, max_context_tokens=2000)
    obs, info = env.reset(seed=0)
    assert [m["role"] for m in obs] == ["user"]  # no fallback instructions: the template shows the tools
    assert info["prompt"].startswith('<tools>{"type": "function", "function": {"name": "calculator"')
    obs, _, _, truncated, info = env.step(tool_call("calculator", expression="2 * 3"))
    assert "<tool>6\n<assistant>" in info["prompt"] and not truncated
    # a template without tools: plain-text instructions, tool outputs as <tool_response> user turns
    plain = gym.make("rlvr/CalculatorArithmetic-v0", tokenizer=build_char_tokenizer())
    obs, _ = plain.reset(seed=0)
    _, _, _, _, info = plain.step(tool_call("calculator", expression="2 * 3"))
    assert obs[0]["role"] == "system" and "U:<tool_response>\n6\n</tool_response>" in info["prompt"]


def test_context_budget_truncates():
    env = gym.make("rlvr/GuessNumber-v0", tokenizer=build_char_tokenizer(), max_context_tokens=300)
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step("\\boxed{0} " + "x" * 300)
    assert (terminated, truncated, info["verifier_status"]) == (False, True, "no_answer")


def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: The text to count.
    """
    return len(text.split())


class WordsTask(MultiTurnTask):
    config_cls = MultiTurnConfig

    def problem(self, index, seed):
        return Problem("How many words are in 'a b c'? Use word_count.", "3")

    @property
    def verifier(self):
        return rlvr_env.make_task("Arithmetic").verifier

    @property
    def tools(self):
        return Toolbox.of(word_count, calculator)

    def gold_completion(self, problem):
        return "\\boxed{3}"


def test_a_user_tool_from_a_typed_function():
    env = MultiTurnEnv(WordsTask(max_turns=2))
    _, info = env.reset(seed=0)
    schema = info["tools"][0]["function"]["parameters"]["properties"]["text"]
    assert schema == {"type": "string", "description": "The text to count."}
    obs, *_ = env.step(tool_call("word_count", text="a b c"))
    assert obs[-1]["content"] == "3"
    obs, _, _, _, info = env.step(tool_call("word_count", text=["not", "a", "string"]) + tool_call("word_count"))
    assert obs[-2]["content"].startswith("error: AttributeError") and "missing arguments ['text']" in obs[-1]["content"]
    assert info["tool_errors"] == 2 and info["turn"] == 2


def test_tool_call_parsing():
    assert parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>') == [ToolCall("f", {"x": 1})]
    assert parse_tool_calls("no call") == []
    assert parse_tool_calls('<tool_call>["f"]</tool_call>')[0].error
    assert len(parse_tool_calls(tool_call("f") * 9)) == 5  # 4 calls, then one error for the rest


def test_config_and_env_arguments_are_validated():
    with pytest.raises(ValueError, match="max_turns"):
        gym.make("rlvr/GuessNumber-v0", max_turns=0)
    with pytest.raises(ValueError, match="low must be < high"):
        gym.make("rlvr/GuessNumber-v0", low=5, high=5)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        gym.make("rlvr/GuessNumber-v0", max_context_tokens=10)
    with pytest.raises(ValueError, match="MultiTurnTask"):
        MultiTurnEnv(rlvr_env.make_task("Arithmetic"))
    with pytest.raises(ValueError, match="timeout_s"):
        gym.make("rlvr/Code-v0", limits={"timeout_s": 0})


def test_calculator_is_exact_and_bounded():
    assert calculator("123456789 * 987654321") == "121932631112635269"
    assert calculator("(3 + 4) ** 2 / 7") == "7" and calculator("7 / 3") == "2.33333333333333"
    assert calculator("-2 ** 3 + 17 // 5 % 2") == "-7" and calculator("0.1 + 0.2") == "0.3"
    for bad in ("2 ** 100000", "10 ** 2000 * 10 ** 2000", "abs(-1)", "x", "1 / 0", "2 ** 0.5", "(" * 300):
        with pytest.raises((ValueError, ZeroDivisionError)):
            calculator(bad)
