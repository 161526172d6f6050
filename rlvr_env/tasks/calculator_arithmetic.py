"""rlvr/CalculatorArithmetic-v0: products too large to do in one's head, with a calculator tool."""

from __future__ import annotations

from dataclasses import dataclass

from rlvr_env.multiturn_env import MultiTurnConfig, MultiTurnTask
from rlvr_env.task import Problem
from rlvr_env.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from rlvr_env.tools import Toolbox, ToolCall, calculator, format_tool_call


@dataclass
class CalculatorArithmeticConfig(ArithmeticConfig, MultiTurnConfig):
    """Arithmetic's knobs and reward, with a default no one does in their head (the product of two 6-digit
    numbers) and a turn budget: the calculator is the way to the exact value."""

    digits: int = 6
    operators: str = "*"
    prompt_template: str = (
        "What is {expression}? Use the calculator tool for exact arithmetic, then put your final answer within \\boxed{{}}."
    )


class CalculatorArithmeticTask(MultiTurnTask, ArithmeticTask):
    config_cls = CalculatorArithmeticConfig

    @property
    def tools(self) -> Toolbox:
        return Toolbox.of(calculator)

    def gold_messages(self, problem: Problem) -> list[dict[str, str]]:
        """The episode the task teaches: the calculator called on the expression, its output, the gold answer."""
        arguments = {"expression": problem.metadata["expression"]}
        output = self.tools.call(ToolCall("calculator", arguments)).content
        return [{"role": "assistant", "content": format_tool_call("calculator", arguments)},
                {"role": "tool", "content": output},
                {"role": "assistant", "content": self.gold_completion(problem)}]
